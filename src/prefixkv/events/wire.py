"""vLLM's KV-event wire format, in the two shapes vLLM has sent: msgpack via msgspec.

An ``EventBatch`` is ``[ts, events, data_parallel_rank]`` (an array) in every vLLM release.
The events inside changed shape:

* :attr:`WireFormat.VLLM_0_33` (the default): each event is a **tagged map**,
  ``{"type": "BlockStored", "block_hashes": [...], ...}``, as vLLM 0.33.0 sends it
  (``KVCacheEvent`` is ``tag=True`` without ``array_like``);
* :attr:`WireFormat.VLLM_0_20`: each event is a **tagged array**,
  ``["BlockStored", block_hashes, parent_block_hash, ...]``, as vLLM 0.20.0 sends it, for
  consumers written against the older structs.

Both carry the same fields; a field left at its default is omitted (``omit_defaults``: from a
map, or from the end of an array). ``data_parallel_rank`` is always sent (``0``), as vLLM's
publisher fills it in, because Dynamo's decoder expects the batch's third element.

prefixkv's identity rides on vLLM's own fields where vLLM has one:

* ``lora_name`` is the adapter (``lora_id``, vLLM's deprecated integer id, is ``None``);
* ``extra_keys[i]`` is block ``i``'s entry in the layout vLLM's ``BlockPool`` publishes
  (``kv_cache_utils.generate_block_hash_extra_keys``, untagged): the adapter name if there is
  one, then one ``[mm_identifier, offset]`` pair per multimodal item overlapping the block,
  then the cache salt, in the first block of a sequence only (``parent_block_hash`` is
  ``None``); an entry with no keys is ``None``. See :func:`vllm_extra_keys`.
* ``mm_identifier`` is :func:`mm_identifier`: the SHA-256 of the extra key's content bytes
  (prefixkv's ``MultimodalSpan.key()``: modality, length and content hash, each framed), as
  64 lower-case hex digits, the shape of vLLM's own multimodal hashes. Dynamo reads an
  identifier of that shape as a multimodal object (its first 16 hex digits as ``mm_hash``)
  and ignores any other string;
* the cache salt in ``extra_keys`` is text, as vLLM's: the salt's UTF-8 text, or ``"hex:"``
  and its hex digits (see :func:`salt_key`);
* ``medium`` is ``"GPU"`` and ``group_idx`` is ``0``, as vLLM's block pool sends them for a
  model with one KV cache group.

What vLLM's structs cannot say travels in fields that vLLM's decoders (msgspec structs,
which skip unknown map keys and unknown trailing array elements) and Dynamo's skip:

* ``prefixkv``: ``[model, salt, [[[offset, content], ...] per block]]``, the model, the exact
  salt bytes and the exact extra-key contents (the identifiers above are one-way digests);
  a map key in the 0.33 format, the element after ``group_idx`` in the 0.20 format;
* ``cache_salt`` (0.33 format only): the hex of :meth:`Namespace.key` (model, adapter and
  salt). It is the top-level field that Dynamo's ZMQ consumer (``ai-dynamo-runtime`` 1.6.1)
  reads as a block's cache namespace, so its index keeps tenants apart; a Dynamo query for a
  namespace passes the same string;
* ``block_mm_infos`` (0.33 format only, ``None`` for a text-only event): per block, Dynamo's
  own ``{"mm_objects": [{"mm_hash": ..., "offsets": []}]}`` (:func:`block_mm_infos`), the only
  multimodal information its ZMQ consumer hashes. Dynamo reads neither field from the 0.20
  array.

A hybrid cache's checkpoint events have no vLLM counterpart. They travel as two more tagged
events of the shape of ``BlockRemoved``, ``CheckpointStored`` and ``CheckpointRemoved``
(``block_hashes``, ``medium``), only when the encoder is asked for them
(``encode_batch(..., checkpoints=True)``): vLLM's decoder and Dynamo's consumer reject a
batch with a tag they do not know, so by default a stream stays vLLM's exactly.

:func:`decode_batch` is strict: a truncated payload, an unknown tag, a wrong type, an
``extra_keys`` entry, ``cache_salt`` or ``block_mm_infos`` that disagrees with the
``prefixkv`` field, or a ``BlockStored`` without that field is a :class:`WireError`, never a
partial batch.
"""

from __future__ import annotations

import enum
import hashlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from prefixkv.spec import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CheckpointRemoved,
    CheckpointStored,
    KVEvent,
    Namespace,
    PrefixCacheError,
)
from prefixkv.spec.identity import ExtraKey

__all__ = [
    "DEFAULT_FORMAT",
    "GROUP",
    "MEDIUM",
    "WireError",
    "WireFormat",
    "as_format",
    "block_mm_infos",
    "decode_batch",
    "encode_batch",
    "is_checkpoint_event",
    "mm_hash",
    "mm_identifier",
    "mm_identifiers",
    "namespace_tag",
    "salt_key",
    "vllm_extra_keys",
]

MEDIUM = "GPU"
#: The KV cache group of every block: vLLM numbers its groups and always sends the number;
#: prefixkv's blocks form one group (a hybrid cache's checkpoints have events of their own).
GROUP = 0


class WireFormat(enum.Enum):
    """The vLLM release whose event shape a stream follows."""

    VLLM_0_33 = "vllm-0.33"
    """Tagged maps (vLLM 0.33.0, the newest release checked)."""
    VLLM_0_20 = "vllm-0.20"
    """Tagged arrays (vLLM 0.20.0), for consumers written against the older structs."""


DEFAULT_FORMAT = WireFormat.VLLM_0_33


class WireError(PrefixCacheError, ValueError):
    """Bytes that are not a well-formed event batch (nothing is applied from them)."""


# --- the vLLM-facing renderings --------------------------------------------------------------


def mm_identifier(content: bytes) -> str:
    """The ``mm_identifier`` an extra key's content is published under (64 hex digits).

    Args:
        content: the extra key's content bytes (``MultimodalSpan.key()``).

    Returns:
        The lower-case hex SHA-256 of ``content``.
    """
    return hashlib.sha256(content).hexdigest()


def salt_key(salt: bytes) -> str:
    """The cache salt as it sits in ``extra_keys`` (vLLM's salts are text).

    Args:
        salt: the namespace's salt.

    Returns:
        The salt's UTF-8 text; ``"hex:"`` and its hex digits for a salt that is not UTF-8,
        is empty (vLLM treats an empty salt as none), or whose text starts with ``"hex:"``
        (so that the rendering stays injective).
    """
    # NOTE: text, never msgpack bin: Dynamo's ExtraKeyItem (ai-dynamo-runtime 1.6.1) fails
    # the whole batch on a bin item.
    try:
        text = salt.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if not text or text.startswith(_HEX):
        return _HEX + salt.hex()
    return text


_HEX = "hex:"


def namespace_tag(namespace: Namespace) -> str:
    """The top-level ``cache_salt`` of a 0.33-format ``BlockStored`` (Dynamo's namespace).

    Args:
        namespace: the blocks' namespace.

    Returns:
        The hex of :meth:`Namespace.key`, injective over model, adapter and salt.
    """
    return namespace.key().hex()


def mm_identifiers(event: BlockStored) -> dict[bytes, str]:
    """The :func:`mm_identifier` of every distinct extra-key content of ``event``.

    Args:
        event: a prefixkv ``BlockStored``.

    Returns:
        content -> identifier, each content hashed once (an image that spans several
        blocks is one content).
    """
    out: dict[bytes, str] = {}
    for keys in event.extra_keys:
        for _, content in keys:
            if content not in out:
                out[content] = mm_identifier(content)
    return out


def vllm_extra_keys(
    event: BlockStored, identifiers: Mapping[bytes, str] | None = None
) -> list[tuple[Any, ...] | None]:
    """``BlockStored.extra_keys`` in the layout vLLM's block pool publishes.

    Args:
        event: a prefixkv ``BlockStored``.
        identifiers: :func:`mm_identifiers` of ``event``, when the caller has them.

    Returns:
        One entry per block: adapter name, ``(mm_identifier, offset)`` pairs, then the cache
        salt in a sequence's first block; ``None`` for a block with none of them.
    """
    ids = mm_identifiers(event) if identifiers is None else identifiers
    out: list[tuple[Any, ...] | None] = []
    for i, keys in enumerate(event.extra_keys):
        entry: list[Any] = []
        if event.adapter is not None:
            entry.append(event.adapter)
        entry.extend((ids[content], offset) for offset, content in keys)
        # NOTE: vLLM adds the salt only where start_token_idx == 0: its block hash chains
        # through the parent, so the first block carries it for the whole sequence.
        if event.salt is not None and i == 0 and event.parent_block_hash is None:
            entry.append(salt_key(event.salt))
        out.append(tuple(entry) if entry else None)
    return out


def mm_hash(content: bytes) -> int:
    """Dynamo's ``mm_hash`` of an extra key: the first 16 hex digits of its identifier.

    Args:
        content: the extra key's content bytes.

    Returns:
        An unsigned 64-bit int, as Dynamo derives it from a vLLM ``mm_identifier``.
    """
    return int(mm_identifier(content)[:16], 16)


def block_mm_infos(
    event: BlockStored, identifiers: Mapping[bytes, str] | None = None
) -> list[MmInfo | None] | None:
    """The top-level ``block_mm_infos`` of a 0.33-format ``BlockStored`` (Dynamo's field).

    Args:
        event: a prefixkv ``BlockStored``.
        identifiers: :func:`mm_identifiers` of ``event``, when the caller has them.

    Returns:
        Per block, ``{"mm_objects": [{"mm_hash": ..., "offsets": []}, ...]}`` or ``None``;
        ``None`` for an event without extra keys.
    """
    # NOTE: Dynamo 1.6.1's ZMQ consumer hashes a block's multimodal objects only from this
    # field (its own); it reads no identifier out of vLLM's extra_keys.
    if not any(event.extra_keys):
        return None
    ids = mm_identifiers(event) if identifiers is None else identifiers
    return [
        {"mm_objects": [{"mm_hash": int(ids[c][:16], 16), "offsets": []} for _, c in keys]}
        if keys
        else None
        for keys in event.extra_keys
    ]


# --- the structs, one family per format ------------------------------------------------------


class _Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


Identity = tuple[str, bytes | None, list[list[tuple[int, bytes]]]]
MmInfo = dict[str, list[dict[str, Any]]]


class _MapEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    pass


class _MapBlockStored(_MapEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    cache_salt: str | None = None
    block_mm_infos: list[MmInfo | None] | None = None
    prefixkv: Identity | None = None


class _MapBlockRemoved(_MapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class _MapAllBlocksCleared(_MapEvent, tag="AllBlocksCleared"):
    pass


class _MapCheckpointStored(_MapEvent, tag="CheckpointStored"):
    block_hashes: list[int]
    medium: str | None


class _MapCheckpointRemoved(_MapEvent, tag="CheckpointRemoved"):
    block_hashes: list[int]
    medium: str | None


class _MapBatch(_Batch):
    events: list[
        _MapBlockStored
        | _MapBlockRemoved
        | _MapAllBlocksCleared
        | _MapCheckpointStored
        | _MapCheckpointRemoved
    ]


class _ArrayEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class _ArrayBlockStored(_ArrayEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    prefixkv: Identity | None = None


class _ArrayBlockRemoved(_ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class _ArrayAllBlocksCleared(_ArrayEvent, tag="AllBlocksCleared"):
    pass


class _ArrayCheckpointStored(_ArrayEvent, tag="CheckpointStored"):
    block_hashes: list[int]
    medium: str | None


class _ArrayCheckpointRemoved(_ArrayEvent, tag="CheckpointRemoved"):
    block_hashes: list[int]
    medium: str | None


class _ArrayBatch(_Batch):
    events: list[
        _ArrayBlockStored
        | _ArrayBlockRemoved
        | _ArrayAllBlocksCleared
        | _ArrayCheckpointStored
        | _ArrayCheckpointRemoved
    ]


_STRUCTS: dict[WireFormat, dict[str, Any]] = {
    WireFormat.VLLM_0_33: {
        "BlockStored": _MapBlockStored,
        "BlockRemoved": _MapBlockRemoved,
        "AllBlocksCleared": _MapAllBlocksCleared,
        "CheckpointStored": _MapCheckpointStored,
        "CheckpointRemoved": _MapCheckpointRemoved,
        "batch": _MapBatch,
    },
    WireFormat.VLLM_0_20: {
        "BlockStored": _ArrayBlockStored,
        "BlockRemoved": _ArrayBlockRemoved,
        "AllBlocksCleared": _ArrayAllBlocksCleared,
        "CheckpointStored": _ArrayCheckpointStored,
        "CheckpointRemoved": _ArrayCheckpointRemoved,
        "batch": _ArrayBatch,
    },
}
_ENCODER = msgspec.msgpack.Encoder()
_DECODERS = {f: msgspec.msgpack.Decoder(type=s["batch"]) for f, s in _STRUCTS.items()}


def as_format(wire_format: WireFormat | str) -> WireFormat:
    """A :class:`WireFormat` from itself or its name (``"vllm-0.33"``, ``"vllm-0.20"``).

    Args:
        wire_format: a format or its value.

    Returns:
        The format; :class:`WireError` for a name that is none.
    """
    try:
        return WireFormat(wire_format)
    except ValueError:
        names = ", ".join(f.value for f in WireFormat)
        raise WireError(f"unknown wire format {wire_format!r}; use one of {names}") from None


def _to_wire(event: KVEvent, fmt: WireFormat) -> Any:
    structs = _STRUCTS[fmt]
    if isinstance(event, BlockStored):
        # NOTE: each image's identifier (a SHA-256) is computed once per event, for
        # extra_keys and block_mm_infos both.
        ids = mm_identifiers(event)
        fields: dict[str, Any] = {
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": None,
            "medium": MEDIUM,
            "lora_name": event.adapter,
            "extra_keys": vllm_extra_keys(event, ids),
            "group_idx": GROUP,
            "prefixkv": (
                event.model,
                event.salt,
                [[(off, content) for off, content in keys] for keys in event.extra_keys],
            ),
        }
        if fmt is WireFormat.VLLM_0_33:
            ns = Namespace(event.model, event.adapter, event.salt)
            fields["cache_salt"] = namespace_tag(ns)
            fields["block_mm_infos"] = block_mm_infos(event, ids)
        return structs["BlockStored"](**fields)
    if isinstance(event, BlockRemoved):
        return structs["BlockRemoved"](
            block_hashes=list(event.block_hashes), medium=MEDIUM, group_idx=GROUP
        )
    if isinstance(event, (CheckpointStored, CheckpointRemoved)):
        tag = type(event).__name__
        return structs[tag](block_hashes=list(event.block_hashes), medium=MEDIUM)
    if isinstance(event, AllBlocksCleared):
        return structs["AllBlocksCleared"]()
    raise TypeError(f"not a KV event: {event!r}")


def _keys(items: Any, where: str) -> tuple[ExtraKey, ...]:
    if not isinstance(items, (list, tuple)):
        raise WireError(f"{where}: extra keys {items!r} are not a list")
    out = []
    for item in items:
        if (
            not isinstance(item, (list, tuple))
            or len(item) != 2
            or isinstance(item[0], bool)
            or not isinstance(item[0], int)
            or not isinstance(item[1], bytes)
        ):
            raise WireError(f"{where}: extra key {item!r} is not [offset, content]")
        out.append((item[0], item[1]))
    return tuple(out)


def _group(event: Any) -> None:
    if event.group_idx not in (None, GROUP):
        raise WireError(
            f"{event.__struct_config__.tag} of KV cache group {event.group_idx}: prefixkv "
            f"publishes one group ({GROUP})"
        )


def _from_stored(event: Any) -> BlockStored:
    _group(event)
    n = len(event.block_hashes)
    if event.prefixkv is None:
        raise WireError(
            "a BlockStored without the prefixkv field: not a prefixkv stream "
            "(decode vLLM's own streams with vLLM's structs)"
        )
    model, salt, per_block = event.prefixkv
    if len(per_block) != n:
        raise WireError(f"BlockStored of {n} blocks has {len(per_block)} prefixkv entries")
    if len(event.token_ids) != n * event.block_size:
        raise WireError(
            f"BlockStored of {n} blocks of {event.block_size} has {len(event.token_ids)} tokens"
        )
    stored = BlockStored(
        tuple(event.block_hashes),
        event.parent_block_hash,
        tuple(event.token_ids),
        event.block_size,
        model,
        event.lora_name,
        salt,
        tuple(_keys(items, f"block {i}") for i, items in enumerate(per_block)),
    )
    ns = Namespace(model, event.lora_name, salt)  # InvalidRequest on an empty model
    # The vLLM-facing fields must say what the prefixkv field says: a consumer reading only
    # them must never see another block than prefixkv's decoder does.
    # Compared as msgpack, where a tuple and a list are one array and str and bytes differ.
    ids = mm_identifiers(stored)
    if _ENCODER.encode(event.extra_keys) != _ENCODER.encode(vllm_extra_keys(stored, ids)):
        raise WireError(f"extra_keys {event.extra_keys!r} disagree with the block identity")
    if isinstance(event, _MapBlockStored):
        if event.cache_salt != namespace_tag(ns):
            raise WireError(f"cache_salt {event.cache_salt!r} is not the namespace {ns!r}")
        if _ENCODER.encode(event.block_mm_infos) != _ENCODER.encode(block_mm_infos(stored, ids)):
            raise WireError(f"block_mm_infos {event.block_mm_infos!r} disagree with extra keys")
    return stored


def _from_wire(event: Any) -> KVEvent:
    name = type(event).__name__
    if name.endswith("BlockStored"):
        return _from_stored(event)
    if name.endswith("BlockRemoved"):
        _group(event)
        return BlockRemoved(tuple(event.block_hashes))
    if name.endswith("CheckpointStored"):
        return CheckpointStored(tuple(event.block_hashes))
    if name.endswith("CheckpointRemoved"):
        return CheckpointRemoved(tuple(event.block_hashes))
    return AllBlocksCleared()


def is_checkpoint_event(event: KVEvent) -> bool:
    """Whether ``event`` is a hybrid cache's checkpoint event (no vLLM counterpart).

    Args:
        event: any KV event.

    Returns:
        True for ``CheckpointStored`` and ``CheckpointRemoved``.
    """
    return isinstance(event, (CheckpointStored, CheckpointRemoved))


def encode_batch(
    events: Sequence[KVEvent],
    *,
    ts: float | None = None,
    checkpoints: bool = False,
    wire_format: WireFormat | str = DEFAULT_FORMAT,
) -> bytes:
    """One ``EventBatch`` payload; checkpoint events are left out unless ``checkpoints``.

    Args:
        events: the events, in order.
        ts: the batch's timestamp (now if ``None``).
        checkpoints: send a hybrid cache's checkpoint events too (prefixkv's own tags).
        wire_format: the vLLM release whose shape to send (:class:`WireFormat`).

    Returns:
        The msgpack bytes of ``[ts, events, 0]``.
    """
    fmt = as_format(wire_format)
    batch = _STRUCTS[fmt]["batch"](
        ts=time.time() if ts is None else ts,
        events=[_to_wire(e, fmt) for e in events if checkpoints or not is_checkpoint_event(e)],
        data_parallel_rank=0,
    )
    return _ENCODER.encode(batch)


def decode_batch(
    payload: bytes, *, wire_format: WireFormat | str = DEFAULT_FORMAT
) -> list[KVEvent]:
    """The events of one payload, or :class:`WireError` (strict: see the module doc).

    Args:
        payload: one ``EventBatch`` as :func:`encode_batch` writes it.
        wire_format: the shape the payload was sent in.

    Returns:
        The events, in order.
    """
    fmt = as_format(wire_format)
    try:
        batch = _DECODERS[fmt].decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise WireError(f"bad {fmt.value} event batch: {exc}") from None
    try:
        return [_from_wire(e) for e in batch.events]
    except PrefixCacheError as exc:  # e.g. an empty model name: not a namespace
        if isinstance(exc, WireError):
            raise
        raise WireError(f"bad {fmt.value} event batch: {exc}") from None
