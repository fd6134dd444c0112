"""prefixkv's KV-event streams, read by decoders built from what vLLM's own code produced.

``tests/events/data/vllm-<version>.json`` is a corpus recorded by
``scripts/vllm_kv_events_corpus.py``: vLLM's own ``ZmqEventPublisher``, event structs and
extra-key code (read out of the ``--no-deps`` wheel) publishing the events vLLM's block pool
builds for the requests prefixkv serves (salt ``None`` and set, an adapter, an image, all
together, a second KV cache group), with the layout of vLLM's structs. From it:

* a decoder is built (``msgspec.defstruct`` with vLLM's field names, order, defaults and
  struct config) and checked to read back every vLLM message byte for byte;
* prefixkv's messages for the same operations must decode to the same vLLM fields, frame by
  frame (PUB and replay, end marker included);
* prefixkv's streams of random workloads (salts, adapters, images, a hybrid model) must
  decode with 0 failures, every field what the event says, every value of a shape vLLM sends.

With ``vllm`` importable (never in CI), or ``PREFIXKV_VLLM_WHEEL`` naming a wheel, the streams
are decoded with vLLM's own ``KVEventBatch`` too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

msgspec = pytest.importorskip("msgspec")
zmq = pytest.importorskip("zmq")

from event_workload import Prompts, event_batches  # noqa: E402
from prefixkv.impl import HybridPrefixCacheManager, PrefixCacheManager  # noqa: E402
from prefixkv.spec import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    HybridSpecCache,
    KVEvent,
    MultimodalSpan,
    Namespace,
    Request,
    SpecCache,
)

from prefixkv.events.transport import EventPublisher  # noqa: E402
from prefixkv.events.wire import (  # noqa: E402
    WireFormat,
    encode_batch,
    is_checkpoint_event,
    vllm_extra_keys,
)

DATA = Path(__file__).parent / "data"
CORPORA = {
    WireFormat.VLLM_0_33: DATA / "vllm-0.33.0.json",
    WireFormat.VLLM_0_20: DATA / "vllm-0.20.0.json",
}
EVENTS = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
# NOTE: lora_id is vLLM's deprecated integer adapter id; prefixkv names adapters only and
# sends None, which vLLM's struct allows. Every other field must be equal.
SKIP_FIELDS = {"lora_id"}


def load(fmt: WireFormat) -> dict[str, Any]:
    corpus: dict[str, Any] = json.loads(CORPORA[fmt].read_text())
    return corpus


class Derived:
    """vLLM's event structs rebuilt from a corpus's recorded layout."""

    def __init__(self, corpus: dict[str, Any]) -> None:
        self.layout = corpus["layout"]
        self.events = [self._struct(name) for name in EVENTS]
        batch = self.layout["EventBatch"]
        fields: list[Any] = []
        for f in batch["fields"]:
            if f["name"] == "events":
                fields.append(("events", list[self.events[0] | self.events[1] | self.events[2]]))  # type: ignore[index, name-defined]
            else:
                fields.append(self._field(f))
        self.batch = msgspec.defstruct("EventBatch", fields, **self._config(batch))
        self.decoder = msgspec.msgpack.Decoder(type=self.batch)

    @staticmethod
    def _field(f: dict[str, Any]) -> Any:
        return (f["name"], Any) if f["required"] else (f["name"], Any, f["default"])

    @staticmethod
    def _config(spec: dict[str, Any]) -> dict[str, Any]:
        cfg = {
            "array_like": spec["array_like"],
            "omit_defaults": spec["omit_defaults"],
            "forbid_unknown_fields": spec["forbid_unknown_fields"],
        }
        if spec["tag"] is not None:
            cfg.update(tag=spec["tag"], tag_field=spec["tag_field"])
        return cfg

    def _struct(self, name: str) -> Any:
        spec = self.layout[name]
        return msgspec.defstruct(
            name, [self._field(f) for f in spec["fields"]], **self._config(spec)
        )

    def decode(self, payload: bytes) -> Any:
        return self.decoder.decode(payload)

    def fields(self, event: Any) -> dict[str, Any]:
        return {f: getattr(event, f) for f in event.__struct_fields__ if f not in SKIP_FIELDS}


def leaves(value: Any, depth: str = "") -> set[str]:
    """The shapes of a value: the msgpack type of each leaf, with its nesting depth."""
    if isinstance(value, (list, tuple)):
        out = {depth + "[]"} if not value else set()
        for v in value:
            out |= leaves(v, depth + "[")
        return out
    kind = {bool: "bool", int: "int", float: "float", str: "str", bytes: "bin"}
    return {depth + ("nil" if value is None else kind[type(value)])}


def corpus_shapes(derived: Derived, corpus: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(event, field) -> every leaf shape vLLM sent in it."""
    shapes: dict[tuple[str, str], set[str]] = {}
    for step in corpus["steps"]:
        batch = derived.decode(bytes.fromhex(step["frames"][2]))
        for e in batch.events:
            for f, v in derived.fields(e).items():
                shapes.setdefault((type(e).__name__, f), set()).update(leaves(v))
    return shapes


def from_json(e: dict[str, Any]) -> KVEvent:
    if e["type"] == "BlockStored":
        return BlockStored(
            tuple(e["block_hashes"]),
            e["parent_block_hash"],
            tuple(e["token_ids"]),
            e["block_size"],
            e["model"],
            e["adapter"],
            None if e["salt"] is None else bytes.fromhex(e["salt"]),
            tuple(tuple((off, bytes.fromhex(c)) for off, c in keys) for keys in e["extra_keys"]),
        )
    if e["type"] == "BlockRemoved":
        return BlockRemoved(tuple(e["block_hashes"]))
    return AllBlocksCleared()


@pytest.mark.parametrize("fmt", list(WireFormat))
def test_the_derived_decoder_reads_vllm_back_byte_for_byte(fmt: WireFormat) -> None:
    corpus = load(fmt)
    derived = Derived(corpus)
    kinds = set()
    for step in corpus["steps"]:
        payload = bytes.fromhex(step["frames"][2])
        batch = derived.decode(payload)
        kinds |= {type(e).__name__ for e in batch.events}
        assert msgspec.msgpack.encode(batch) == payload, step["name"]
    assert kinds == set(EVENTS)
    map_like = fmt is WireFormat.VLLM_0_33
    assert corpus["layout"]["BlockStored"]["array_like"] is not map_like


@pytest.mark.parametrize("fmt", list(WireFormat))
def test_same_operation_same_vllm_fields(fmt: WireFormat) -> None:
    """prefixkv's message for each recorded operation equals vLLM's, field by field."""
    corpus = load(fmt)
    derived = Derived(corpus)
    checked = 0
    for step in corpus["steps"]:
        if step["prefixkv"] is None:
            continue  # vLLM's second KV cache group: prefixkv sends checkpoint events instead
        theirs = derived.decode(bytes.fromhex(step["frames"][2]))
        events = [from_json(e) for e in step["prefixkv"]]
        mine = derived.decode(encode_batch(events, ts=theirs.ts, wire_format=fmt))
        assert (mine.ts, mine.data_parallel_rank) == (theirs.ts, theirs.data_parallel_rank)
        assert len(mine.events) == len(theirs.events), step["name"]
        for a, b in zip(mine.events, theirs.events, strict=True):
            assert type(a).__name__ == type(b).__name__, step["name"]
            assert derived.fields(a) == derived.fields(b), step["name"]
            checked += 1
    assert checked >= 20


@pytest.mark.parametrize("fmt", list(WireFormat))
def test_pub_and_replay_frames_match_vllm(fmt: WireFormat) -> None:
    corpus = load(fmt)
    steps = [s for s in corpus["steps"] if s["prefixkv"] is not None]
    pub = EventPublisher(topic=corpus["topic"].encode(), wire_format=fmt)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(pub.replay_endpoint)
    try:
        time.sleep(0.2)
        for step in steps:
            pub.publish([from_json(e) for e in step["prefixkv"]])
        frames: list[list[bytes]] = []
        while len(frames) < len(steps) and sub.poll(2000):
            frames.append(sub.recv_multipart())
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replay = []
        while dealer.poll(2000):
            replay.append(dealer.recv_multipart())
            if replay[-1][-2] == b"\xff" * 8:
                break
    finally:
        sub.close(0)
        dealer.close(0)
        pub.close()
    theirs = [[bytes.fromhex(f) for f in s["frames"]] for s in corpus["steps"]]
    their_replay = [[bytes.fromhex(f) for f in r] for r in corpus["replay"]]
    assert len(frames) == len(steps)
    for i, mine in enumerate(frames):
        assert len(mine) == len(theirs[i]) == 3
        assert mine[:2] == theirs[i][:2]  # topic, and the same 8-byte sequence number
    # Replay: same frames per batch, the topic where vLLM puts it, the same end marker.
    assert len(replay) == len(steps) + 1
    for mine, ref in zip(replay[:-1], their_replay, strict=False):
        assert len(mine) == len(ref)
        assert mine[:-1] == ref[:-1]
    assert replay[-1] == their_replay[-1]


# --- prefixkv's streams of random workloads --------------------------------------------------

IMAGE = "image"
NAMESPACES = (
    Namespace("m@1"),
    Namespace("m@1", salt=b"tenant-1"),
    Namespace("m@1", salt=b"\xfftenant-2"),
    Namespace("m@1", adapter="lora-a"),
    Namespace("m@1", adapter="lora-b", salt=b"tenant-1"),
)


def _image(rng: random.Random, tokens: list[int]) -> tuple[MultimodalSpan, ...]:
    if rng.random() < 0.4 and len(tokens) >= 8:
        start = rng.randrange(0, 3)
        return (MultimodalSpan(start, start + 5, IMAGE, bytes([rng.randrange(3)]) * 8),)
    return ()


def workload(cache: Any, rng: random.Random, steps: int) -> list[list[KVEvent]]:
    return event_batches(cache, rng, steps, Prompts(NAMESPACES, (1, 2, 3), (4, 14), _image))


def _caches() -> list[Any]:
    return [
        SpecCache(24, 2, record_events=True),
        PrefixCacheManager(24, 2, record_events=True),
        HybridSpecCache(24, 2, max_num_seqs=4, state_budget=2, record_events=True),
        HybridPrefixCacheManager(24, 2, max_num_seqs=4, state_budget=2, record_events=True),
    ]


def expected_fields(e: KVEvent) -> dict[str, Any]:
    if isinstance(e, BlockStored):
        return {
            "block_hashes": list(e.block_hashes),
            "parent_block_hash": e.parent_block_hash,
            "token_ids": list(e.token_ids),
            "block_size": e.block_size,
            "medium": "GPU",
            "lora_name": e.adapter,
            "extra_keys": _plain(vllm_extra_keys(e)),
            "group_idx": 0,
        }
    if isinstance(e, BlockRemoved):
        return {"block_hashes": list(e.block_hashes), "medium": "GPU", "group_idx": 0}
    return {}


def _plain(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


@pytest.mark.parametrize("fmt", list(WireFormat))
def test_prefixkv_streams_decode_with_zero_failures(fmt: WireFormat) -> None:
    corpus = load(fmt)
    derived = Derived(corpus)
    shapes = corpus_shapes(derived, corpus)
    failures, events_seen, kinds = 0, 0, set()
    for i, cache in enumerate(_caches()):
        for batch in workload(cache, random.Random(10 + i), 120):
            sent = [e for e in batch if not is_checkpoint_event(e)]
            if not sent:
                continue
            try:
                decoded = derived.decode(encode_batch(batch, wire_format=fmt))
            except msgspec.ValidationError:
                failures += 1
                continue
            assert len(decoded.events) == len(sent)
            for got, e in zip(decoded.events, sent, strict=True):
                name = type(e).__name__
                assert type(got).__name__ == name
                fields = derived.fields(got)
                for f, v in expected_fields(e).items():
                    assert _plain(fields[f]) == v, (name, f)
                for f, v in fields.items():
                    assert leaves(v) <= shapes[(name, f)], (name, f, v)  # a shape vLLM sends
                events_seen += 1
                kinds.add(name)
                if isinstance(e, BlockStored):
                    kinds |= {"salt" for _ in [0] if e.salt} | {"adapter" for _ in [0] if e.adapter}
                    kinds |= {"image" for k in e.extra_keys if k}
    assert failures == 0
    assert kinds >= {*EVENTS, "salt", "adapter", "image"}
    assert events_seen > 500


def test_checkpoint_events_are_refused_by_vllm_shapes() -> None:
    """Sent on request only: a vLLM decoder refuses the whole batch (so they are opt-in)."""
    derived = Derived(load(WireFormat.VLLM_0_33))
    cache = HybridSpecCache(16, 4, max_num_seqs=2, state_budget=2, record_events=True)
    adm = cache.admit(Request("a", list(range(9)), Namespace("h@1")))
    cache.commit("a", adm.num_scheduled_tokens, [1])
    events = cache.take_events()
    assert any(is_checkpoint_event(e) for e in events)
    derived.decode(encode_batch(events))
    with pytest.raises(msgspec.ValidationError):
        derived.decode(encode_batch(events, checkpoints=True))


# --- vLLM's own structs, where they can be loaded ----------------------------------------------


def _vllm_kv_events(fmt: WireFormat) -> Any:
    wheel = os.environ.get("PREFIXKV_VLLM_WHEEL_" + fmt.name[5:].replace("_", ""))
    if wheel:
        script = Path(__file__).parents[2] / "scripts" / "vllm_kv_events_corpus.py"
        spec = importlib.util.spec_from_file_location("vllm_kv_events_corpus", script)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        version, kv_events, _ = mod.load_vllm(Path(wheel))
        return version, kv_events
    kv_events = pytest.importorskip("vllm.distributed.kv_events")
    import vllm

    expected = "0.33" if fmt is WireFormat.VLLM_0_33 else "0.20"
    if not vllm.__version__.startswith(expected):
        pytest.skip(f"vllm {vllm.__version__} installed, this format is vLLM {expected}")
    return vllm.__version__, kv_events


@pytest.mark.parametrize("fmt", list(WireFormat))
def test_vllm_own_structs_decode_prefixkv_streams(fmt: WireFormat) -> None:
    version, kv_events = _vllm_kv_events(fmt)
    decoder = msgspec.msgpack.Decoder(type=kv_events.KVEventBatch)
    total = failures = 0
    for i, cache in enumerate(_caches()):
        for batch in workload(cache, random.Random(10 + i), 120):
            if not [e for e in batch if not is_checkpoint_event(e)]:
                continue
            total += 1
            try:
                got = decoder.decode(encode_batch(batch, wire_format=fmt))
            except msgspec.ValidationError:
                failures += 1
                continue
            sent = [e for e in batch if not is_checkpoint_event(e)]
            for g, e in zip(got.events, sent, strict=True):
                for f, v in expected_fields(e).items():
                    assert _plain(getattr(g, f)) == v, (version, f)
    print(f"vLLM {version}: {failures} of {total} prefixkv batches failed to decode")
    assert failures == 0 and total > 200
