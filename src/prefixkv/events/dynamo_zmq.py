"""Dynamo's own consumer of vLLM's ZMQ KV events: its standalone indexer, as a subprocess.

``python -m dynamo.indexer`` (``ai-dynamo-runtime``, the ``prefixkv[router]`` extra) subscribes
to each registered worker's PUB endpoint, replays gaps through its replay endpoint, keeps one
radix tree per model, and answers over HTTP how many tokens of a request each worker holds.
Unlike :class:`~prefixkv.events.dynamo.DynamoIndex`, nothing of prefixkv sits between the
stream and Dynamo's tree: the indexer decodes prefixkv's bytes itself.

What it reads of a vLLM 0.33-format ``BlockStored`` (see :mod:`prefixkv.events.wire`): the
tokens, ``lora_name``, the top-level ``cache_salt`` (prefixkv's namespace tag) and
``block_mm_infos``. A query therefore names the namespace by the same tag, and a request with
images is asked by its tokens hashes (``/query_by_hash``), which Dynamo's own
``compute_block_hash_for_seq`` gives from the same multimodal hashes: ``/query`` takes no
multimodal information.

The indexer applies events asynchronously: an answer reflects the events it has applied so
far, never a promise that it has seen the latest batch.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from prefixkv.spec import Namespace, PrefixCacheError
from prefixkv.spec.identity import ExtraKey
from prefixkv.spec.multimodal import MultimodalSpan, block_extra_keys

from .dynamo import tokens_hashes
from .wire import DEFAULT_FORMAT, WireFormat, as_format, mm_hash, namespace_tag

__all__ = ["DynamoIndexer", "DynamoIndexerError"]


def _wire_mm_hash(key: ExtraKey) -> int:
    """The ``mm_hash`` the wire sends for an extra key (:func:`~.wire.mm_hash`)."""
    return mm_hash(key[1])


class DynamoIndexerError(PrefixCacheError, RuntimeError):
    """Dynamo's indexer did not start, or refused or failed a request."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class DynamoIndexer:
    """One ``python -m dynamo.indexer`` process for one model, and its HTTP API.

    Args:
        model: the model name workers are registered under (one radix tree per model).
        block_size: tokens per block, as the workers publish them.
        log_path: where the indexer's log goes (a temporary file if ``None``).
        start_timeout: seconds to wait for its HTTP server.
        wire_format: the format the workers publish. Dynamo reads the namespace tag and the
            multimodal hashes only from the 0.33 format; with 0.20, queries name the tokens
            and the adapter alone, as that is all the indexer keeps.
    """

    def __init__(
        self,
        *,
        model: str,
        block_size: int,
        log_path: Path | None = None,
        start_timeout: float = 20.0,
        wire_format: WireFormat | str = DEFAULT_FORMAT,
    ) -> None:
        self.model = model
        self.wire_format = as_format(wire_format)
        self.block_size = block_size
        self.port = _free_port()
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if log_path is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="dynamo-indexer-")
            log_path = Path(self._tmp.name) / "indexer.log"
        self.log_path = log_path
        self._log: BinaryIO = log_path.open("wb")
        args = ["--port", str(self.port), "--threads", "1"]
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "dynamo.indexer", *args],
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
        except OSError as exc:
            self._log.close()
            if self._tmp is not None:
                self._tmp.cleanup()
            raise DynamoIndexerError(f"cannot start dynamo.indexer: {exc}") from None
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                self._call("GET", "/workers")
                return
            except DynamoIndexerError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    tail = self.log_text()[-2000:]
                    self.close()
                    raise DynamoIndexerError(
                        "dynamo.indexer did not start (is ai-dynamo-runtime installed? "
                        f"pip install prefixkv[router]); its log ends: {tail}"
                    ) from None
                time.sleep(0.1)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            url, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as reply:
                return json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")
            raise DynamoIndexerError(f"{method} {path}: HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
            raise DynamoIndexerError(f"{method} {path}: {exc}") from None

    def register(self, worker: int, endpoint: str, replay_endpoint: str | None = None) -> None:
        """Subscribe the indexer to one worker's stream.

        Args:
            worker: the worker's id (Dynamo's ``instance_id``).
            endpoint: the worker's PUB endpoint.
            replay_endpoint: its replay endpoint, for gaps (none: gaps stay gaps).
        """
        body: dict[str, Any] = {
            "instance_id": worker,
            "endpoint": endpoint,
            "model_name": self.model,
            "block_size": self.block_size,
        }
        if replay_endpoint is not None:
            body["replay_endpoint"] = replay_endpoint
        reply = self._call("POST", "/register", body)
        if reply != {"status": "ok"}:
            raise DynamoIndexerError(f"register {worker}: {reply!r}")

    def unregister(self, worker: int) -> None:
        """Drop a worker: its listener stops and its blocks leave the tree.

        Args:
            worker: the worker's id.
        """
        self._call("POST", "/unregister", {"instance_id": worker, "model_name": self.model})

    def tokens_hashes(
        self, namespace: Namespace, token_ids: Sequence[int], spans: Sequence[MultimodalSpan]
    ) -> list[int]:
        """The tokens hashes Dynamo keys a request's full blocks by (unsigned 64-bit).

        Args:
            namespace: the request's namespace.
            token_ids: its tokens.
            spans: its multimodal spans.

        Returns:
            One hash per full block, from Dynamo's own ``compute_block_hash_for_seq``.
        """
        bs = self.block_size
        keys = [block_extra_keys(spans, j * bs, bs) for j in range(len(token_ids) // bs)]
        # NOTE: the router's own function, with the mm_hash this consumer reads off the wire
        # (block_mm_infos: the content's, without its offset).
        return tokens_hashes(namespace, token_ids, bs, keys, mm_hash=_wire_mm_hash)

    def overlaps(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        spans: Sequence[MultimodalSpan] = (),
    ) -> dict[int, int]:
        """worker -> the number of leading full blocks the indexer believes it holds.

        Args:
            namespace: the request's namespace.
            token_ids: its tokens.
            spans: its multimodal spans.

        Returns:
            The workers with at least one block; the others are left out.
        """
        tagged = self.wire_format is WireFormat.VLLM_0_33
        if spans and tagged:
            # Dynamo's API takes i64 hashes; its tree keys them as u64.
            signed = [
                h - (1 << 64) if h >= 1 << 63 else h
                for h in self.tokens_hashes(namespace, token_ids, spans)
            ]
            reply = self._call(
                "POST", "/query_by_hash", {"block_hashes": signed, "model_name": self.model}
            )
        else:
            body: dict[str, Any] = {"token_ids": list(token_ids), "model_name": self.model}
            if tagged:
                body["cache_salt"] = namespace_tag(namespace)
            if namespace.adapter is not None:
                body["lora_name"] = namespace.adapter
            reply = self._call("POST", "/query", body)
        scores = reply.get("scores", {}) if isinstance(reply, dict) else {}
        return {
            int(worker): max(per_rank.values()) // self.block_size
            for worker, per_rank in scores.items()
            if per_rank
        }

    def held_blocks(self, worker: int) -> set[int]:
        """The block hashes the indexer's tree holds for one worker (its ``/dump``).

        Args:
            worker: the worker's id.

        Returns:
            The workers' own block hashes, unsigned 64-bit, as the tree keys them.
        """
        dump = self._call("GET", "/dump")
        held: set[int] = set()
        for tree in (dump or {}).values():
            for entry in tree.get("events", ()):
                if entry.get("worker_id") != worker:
                    continue
                stored = entry["event"]["data"].get("stored") or {}
                held.update(int(b["block_hash"]) for b in stored.get("blocks", ()))
        return held

    def log_text(self) -> str:
        """The indexer's log so far.

        Returns:
            The log, decoded as UTF-8 (undecodable bytes replaced).
        """
        return self.log_path.read_bytes().decode("utf-8", "replace")

    def decode_failures(self) -> int:
        """Batches the indexer could not decode (live or replayed), from its log.

        Returns:
            The number of decode-failure lines.
        """
        log = self.log_text()
        return log.count("Failed to decode")

    def replays(self) -> int:
        """Replays the indexer completed after a sequence gap, from its log.

        Returns:
            The number of completed replays.
        """
        return self.log_text().count("Replay complete")

    def close(self) -> None:
        """Stop the indexer (terminate, then kill after 10 s)."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> DynamoIndexer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
