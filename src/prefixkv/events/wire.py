"""vLLM's KV-event wire format: an ``EventBatch`` of tagged events, msgpack via msgspec.

The structs follow ``vllm/distributed/kv_events.py`` field by field, so a vLLM subscriber
(or Dynamo's ZMQ relay, which decodes the same bytes) reads prefixkv's stream unchanged:
array-like structs, a ``tag`` naming the event class, ``omit_defaults``.

prefixkv's identity rides on vLLM's own fields:

* ``lora_name`` is the adapter (``lora_id``, vLLM's deprecated integer id, is ``None``);
* ``extra_keys[i]`` is block ``i``'s entry ``[model, salt, [[offset, content], ...]]``: the
  namespace parts that vLLM folds into ``extra_keys`` as its cache salt, and the multimodal
  content hashes with their offsets;
* ``medium`` is ``"GPU"``.

A hybrid cache's checkpoint events have no vLLM counterpart. They travel as two more tagged
structs of the same shape as ``BlockRemoved``, ``CheckpointStored`` and
``CheckpointRemoved`` (``[tag, block_hashes, medium]``), and only when the encoder is asked
for them (``encode_batch(..., checkpoints=True)``): vLLM's decoder, and Dynamo's ZMQ relay,
reject a batch with a tag they do not know, so by default a stream stays vLLM's exactly.

:func:`decode_batch` is strict: a truncated payload, an unknown tag, a wrong type or an
``extra_keys`` entry of another shape is a :class:`WireError`, never a partial batch.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from prefixkv.spec import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CheckpointRemoved,
    CheckpointStored,
    KVEvent,
    PrefixCacheError,
)

__all__ = [
    "WireAllBlocksCleared",
    "WireBlockRemoved",
    "WireBlockStored",
    "WireCheckpointRemoved",
    "WireCheckpointStored",
    "WireError",
    "WireEventBatch",
    "decode_batch",
    "encode_batch",
    "from_wire",
    "is_checkpoint_event",
    "to_wire",
]

MEDIUM = "GPU"


class WireError(PrefixCacheError, ValueError):
    """Bytes that are not a well-formed event batch (nothing is applied from them)."""


class _EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base of the tagged events; the tag is the class name."""


class WireBlockStored(_KVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None


class WireBlockRemoved(_KVCacheEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None


class WireAllBlocksCleared(_KVCacheEvent, tag="AllBlocksCleared"):
    pass


class WireCheckpointStored(_KVCacheEvent, tag="CheckpointStored"):
    """prefixkv's own: these blocks now carry a restorable recurrent-state checkpoint."""

    block_hashes: list[int]
    medium: str | None


class WireCheckpointRemoved(_KVCacheEvent, tag="CheckpointRemoved"):
    """prefixkv's own: these blocks' checkpoints were released."""

    block_hashes: list[int]
    medium: str | None


WireEvent = (
    WireBlockStored
    | WireBlockRemoved
    | WireAllBlocksCleared
    | WireCheckpointStored
    | WireCheckpointRemoved
)


class WireEventBatch(_EventBatch):
    events: list[WireEvent]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(type=WireEventBatch)


def to_wire(event: KVEvent) -> WireEvent:
    if isinstance(event, BlockStored):
        return WireBlockStored(
            block_hashes=list(event.block_hashes),
            parent_block_hash=event.parent_block_hash,
            token_ids=list(event.token_ids),
            block_size=event.block_size,
            lora_id=None,
            medium=MEDIUM,
            lora_name=event.adapter,
            extra_keys=[
                (event.model, event.salt, [[off, content] for off, content in keys])
                for keys in event.extra_keys
            ],
        )
    if isinstance(event, BlockRemoved):
        return WireBlockRemoved(block_hashes=list(event.block_hashes), medium=MEDIUM)
    if isinstance(event, AllBlocksCleared):
        return WireAllBlocksCleared()
    if isinstance(event, CheckpointStored):
        return WireCheckpointStored(block_hashes=list(event.block_hashes), medium=MEDIUM)
    if isinstance(event, CheckpointRemoved):
        return WireCheckpointRemoved(block_hashes=list(event.block_hashes), medium=MEDIUM)
    raise TypeError(f"not a KV event: {event!r}")


def _extra(entry: Any) -> tuple[str, bytes | None, tuple[tuple[int, bytes], ...]]:
    if not isinstance(entry, (list, tuple)) or len(entry) != 3:
        raise WireError(f"extra_keys entry {entry!r} is not [model, salt, items]")
    model, salt, items = entry
    if not isinstance(model, str) or not (salt is None or isinstance(salt, bytes)):
        raise WireError(f"extra_keys entry {entry!r} has a bad model or salt")
    if not isinstance(items, (list, tuple)):
        raise WireError(f"extra_keys entry {entry!r} has no item list")
    out = []
    for item in items:
        if (
            not isinstance(item, (list, tuple))
            or len(item) != 2
            or isinstance(item[0], bool)
            or not isinstance(item[0], int)
            or not isinstance(item[1], bytes)
        ):
            raise WireError(f"extra key {item!r} is not [offset, content]")
        out.append((item[0], item[1]))
    return model, salt, tuple(out)


def from_wire(event: WireEvent) -> KVEvent:
    if isinstance(event, WireBlockStored):
        n = len(event.block_hashes)
        entries = event.extra_keys
        if entries is None or len(entries) != n:
            raise WireError(f"BlockStored of {n} blocks needs {n} extra_keys entries")
        parts = [_extra(e) for e in entries]
        models = {(m, s) for m, s, _ in parts}
        if len(models) != 1:
            raise WireError(f"one BlockStored spans several namespaces: {sorted(models)!r}")
        ((model, salt),) = models
        return BlockStored(
            tuple(event.block_hashes),
            event.parent_block_hash,
            tuple(event.token_ids),
            event.block_size,
            model,
            event.lora_name,
            salt,
            tuple(keys for _, _, keys in parts),
        )
    if isinstance(event, WireBlockRemoved):
        return BlockRemoved(tuple(event.block_hashes))
    if isinstance(event, WireCheckpointStored):
        return CheckpointStored(tuple(event.block_hashes))
    if isinstance(event, WireCheckpointRemoved):
        return CheckpointRemoved(tuple(event.block_hashes))
    return AllBlocksCleared()


def is_checkpoint_event(event: KVEvent) -> bool:
    return isinstance(event, (CheckpointStored, CheckpointRemoved))


def encode_batch(
    events: list[KVEvent], *, ts: float | None = None, checkpoints: bool = False
) -> bytes:
    """One ``EventBatch`` payload; checkpoint events are left out unless ``checkpoints``."""
    batch = WireEventBatch(
        ts=time.time() if ts is None else ts,
        events=[to_wire(e) for e in events if checkpoints or not is_checkpoint_event(e)],
    )
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> list[KVEvent]:
    """The events of one payload, or :class:`WireError`."""
    try:
        batch = _DECODER.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise WireError(f"bad event batch: {exc}") from None
    try:
        return [from_wire(e) for e in batch.events]
    except PrefixCacheError as exc:  # e.g. an empty model name: not a namespace
        if isinstance(exc, WireError):
            raise
        raise WireError(f"bad event batch: {exc}") from None
