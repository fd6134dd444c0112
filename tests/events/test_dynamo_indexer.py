"""Dynamo's own ZMQ consumer reads prefixkv's streams: ``python -m dynamo.indexer``.

The standalone KV indexer of ``ai-dynamo-runtime`` runs as a subprocess. prefixkv workers
(``SpecCache``, ``PrefixCacheManager``, ``HybridSpecCache``) publish their events over
ZeroMQ in vLLM 0.33's format and are registered with their publisher and replay endpoints.
A random workload (salt ``None``, text and binary salts, adapters, images; tenants that share
token prefixes) runs on them. Every few steps, for random probes, the indexer's answer for
each worker must equal the prefix that worker serves (``served_prefix_blocks``), the indexer
must log no decode failure, and a batch lost on the way must come back through replay.

Queries: ``/query`` with the request's tokens, ``lora_name`` and ``cache_salt`` (the
namespace tag prefixkv sends in each ``BlockStored``); a request with images goes through
``/query_by_hash``, with the tokens hashes that Dynamo's own ``compute_block_hash_for_seq``
gives for the same blocks, because ``/query`` takes no multimodal information.
"""

from __future__ import annotations

import importlib.util
import json
import random
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("dynamo.llm") is None:
    pytest.skip("ai-dynamo-runtime is not installed", allow_module_level=True)
pytest.importorskip("zmq")
pytest.importorskip("msgspec")

from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import (
    HybridSpecCache,
    MultimodalSpan,
    Namespace,
    OutOfBlocks,
    Request,
    SpecCache,
)
from prefixkv.spec.event_mirror import served_prefix_blocks
from prefixkv.spec.multimodal import block_extra_keys

from prefixkv.events.transport import EventPublisher
from prefixkv.events.wire import WireFormat, mm_hash, namespace_tag

BS = 4
MODEL = "tiny-llm@1"
NAMESPACES = (
    Namespace(MODEL),
    Namespace(MODEL, salt=b"tenant-1"),
    Namespace(MODEL, salt=b"\xfftenant-2"),
    Namespace(MODEL, adapter="lora-a"),
    Namespace(MODEL, adapter="lora-a", salt=b"tenant-1"),
)
PREFIXES = [tuple(range(100 + 10 * k, 100 + 10 * k + 8)) for k in range(3)]
IMAGE = (7,) * 8  # placeholder tokens, equal for every image


class Indexer:
    """``python -m dynamo.indexer`` on a free port, and its HTTP API."""

    def __init__(self, log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dynamo.indexer", "--port", str(self.port), "--threads", "1"],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                self.get("/workers")
                return
            except (urllib.error.URLError, ConnectionError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    pytest.fail(f"dynamo.indexer did not start: {log.read_text()[-2000:]}")
                time.sleep(0.1)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read() or b"null")

    def overlaps(self, ns: Namespace, tokens: tuple[int, ...], spans: Any) -> dict[int, int]:
        """worker -> leading blocks the indexer believes it holds."""
        if spans:
            from dynamo.llm import compute_block_hash_for_seq

            n = len(tokens) // BS
            mm: list[Any] = []
            for j in range(n):
                keys = block_extra_keys(spans, j * BS, BS)
                objects = [{"mm_hash": mm_hash(c), "offsets": []} for _, c in keys]
                mm.append({"mm_objects": objects} if keys else None)
            hashes = compute_block_hash_for_seq(
                list(tokens[: n * BS]),
                BS,
                block_mm_infos=mm,
                lora_name=ns.adapter,
                cache_namespace=namespace_tag(ns),
            )
            signed = [h - (1 << 64) if h >= 1 << 63 else h for h in hashes]  # it takes i64
            out = self.post("/query_by_hash", {"block_hashes": signed, "model_name": MODEL})
        else:
            body: dict[str, Any] = {
                "token_ids": list(tokens),
                "model_name": MODEL,
                "cache_salt": namespace_tag(ns),
            }
            if ns.adapter is not None:
                body["lora_name"] = ns.adapter
            out = self.post("/query", body)
        return {int(w): max(d.values()) // BS for w, d in out["scores"].items()}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def indexer(tmp_path: Path) -> Iterator[Indexer]:
    idx = Indexer(tmp_path / "indexer.log")
    try:
        yield idx
    finally:
        idx.close()


def _prompt(rng: random.Random) -> tuple[Namespace, tuple[int, ...], tuple[MultimodalSpan, ...]]:
    ns = rng.choice(NAMESPACES)
    tokens = list(rng.choice(PREFIXES))
    spans: list[MultimodalSpan] = []
    if rng.random() < 0.4:
        start = len(tokens) + rng.choice((0, 2))
        tokens += [1] * (start - len(tokens)) + list(IMAGE)
        spans.append(
            MultimodalSpan(start, start + len(IMAGE), "image", bytes([rng.randrange(3)]) * 8)
        )
    tokens += [rng.randrange(50) for _ in range(rng.randrange(1, 10))]
    return ns, tuple(tokens), tuple(spans)


class _Lost:
    """Stands in for a PUB socket for one batch: the batch never reaches the subscriber."""

    def send_multipart(self, frames: list[bytes]) -> None:
        pass


def test_dynamo_indexer_reads_prefixkv_streams(indexer: Indexer) -> None:
    caches: list[Any] = [
        SpecCache(24, BS, record_events=True),
        PrefixCacheManager(24, BS, record_events=True),
        HybridSpecCache(24, BS, max_num_seqs=4, state_budget=2, record_events=True),
    ]
    pubs = [EventPublisher(wire_format=WireFormat.VLLM_0_33) for _ in caches]
    try:
        for w, pub in enumerate(pubs):
            reply = indexer.post(
                "/register",
                {
                    "instance_id": w,
                    "endpoint": pub.endpoint,
                    "replay_endpoint": pub.replay_endpoint,
                    "model_name": MODEL,
                    "block_size": BS,
                },
            )
            assert reply == {"status": "ok"}
        time.sleep(0.5)  # the indexer's SUB sockets join; a lost first batch would be replayed
        rng = random.Random(4)
        live: list[list[str]] = [[] for _ in caches]
        probes = checked = lost = hits = image_hits = 0
        asked: list[Any] = []
        for step in range(1, 121):
            w = rng.randrange(len(caches))
            c = caches[w]
            roll = rng.random()
            if roll < 0.6:
                ns, tokens, spans = _prompt(rng)
                asked.append((ns, tokens, spans))
                try:
                    adm = c.admit(Request(f"s{step}", tokens, ns, spans=spans), len(tokens))
                except OutOfBlocks:
                    pass
                else:
                    c.commit(f"s{step}", adm.num_scheduled_tokens, [1])
                    live[w].append(f"s{step}")
            elif roll < 0.85 and live[w]:
                c.free([live[w].pop(rng.randrange(len(live[w])))])
            elif roll < 0.95:
                c.evict(rng.randrange(1, 6))
            else:
                c.free(live[w])
                live[w] = []
                c.reset(preserve_cache=False)
            events = c.take_events()
            if step >= 30 * (lost + 1) and len(events) >= 2:
                # The first event's batch is lost on the way (the replay buffer keeps it); the
                # rest follows as the next batch, whose sequence number reveals the gap.
                real, pubs[w]._pub = pubs[w]._pub, _Lost()  # type: ignore[assignment]
                pubs[w].publish(events[:1])
                pubs[w]._pub = real
                events = events[1:]
                lost += 1
            pubs[w].publish(events)
            if step % 20 == 0:
                # Half the probes repeat a request already served somewhere: they hit.
                queries = [_prompt(rng) for _ in range(2)] + rng.sample(asked[-6:], 4)
                deadline = time.monotonic() + 10
                while True:
                    wrong = []
                    for ns, tokens, spans in queries:
                        got = indexer.overlaps(ns, tokens, spans)
                        for v, cache in enumerate(caches):
                            served = served_prefix_blocks(cache.snapshot(), ns, tokens, spans)
                            if got.get(v, 0) != served:
                                wrong.append((v, ns, tokens, spans, got.get(v, 0), served))
                    if not wrong or time.monotonic() > deadline:
                        break
                    time.sleep(0.1)  # the indexer applies events asynchronously
                assert not wrong, f"indexer disagrees at step {step}: {wrong[:3]}"
                probes += len(queries) * len(caches)
                for ns, tokens, spans in queries:
                    for cache in caches:
                        served = served_prefix_blocks(cache.snapshot(), ns, tokens, spans)
                        hits += served > 0
                        image_hits += bool(spans) and served * BS > spans[0].start
                checked += 1
        log = indexer.log.read_text()
        assert "Failed to decode" not in log and "Failed to apply" not in log, log[-3000:]
        assert log.count("Replay complete") >= lost >= 2
        assert checked == 6 and probes == 108 and hits >= 20 and image_hits >= 3
    finally:
        for pub in pubs:
            pub.close()
