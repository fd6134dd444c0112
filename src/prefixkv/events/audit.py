"""The checks of ``prefixkv audit-events``: any engine's KV-event stream, judged batch by batch.

Pure (no sockets): :class:`StreamAudit` is fed the messages a subscriber receives, PUB
``[topic, seq, payload]`` and replayed batches, and keeps the index a router would build
from them. It reads the stream the way a consumer written against vLLM's structs does, so
it audits vLLM's and prefixkv's publishers alike: :func:`decode_engine_batch` accepts both
event shapes (vLLM 0.33's tagged maps, vLLM 0.20's tagged arrays, the shape SGLang's
publisher also sends, unchecked against SGLang's own code), skips the fields it does not
need, and never requires prefixkv's own field.

A block is identified by ``(medium, group_idx, hash)``: vLLM publishes a second KV cache
group's blocks, and offloaded copies (``medium`` ``"CPU"``), under hashes that can equal a
GPU block's. The checks, each named in a :class:`Violation`:

* ``decodes``: every batch decodes (message frames, msgpack, event shapes);
* ``no-gap``: the sequence numbers have no hole that replay did not fill;
* ``parent-before-child``: a ``BlockStored`` names a parent that is live in the index (or
  one stored earlier in the same event);
* ``known-removal``: a ``BlockRemoved`` removes only live blocks;
* ``single-store``: a live block is not stored again before its ``BlockRemoved`` (unless a
  refcount model is declared: then each store takes one reference and each removal drops
  one). Its ``cause`` says which: ``"repeated"`` when the same event was already sent in
  the same batch with nothing in between (a store sent twice), ``"stale"`` when the block
  has been live since an earlier batch (its ``BlockRemoved``, or an ``AllBlocksCleared``,
  was never sent);
* ``clear-empties``: after an ``AllBlocksCleared`` the index is empty, so a block it
  dropped is never removed or named as a parent again (the engine kept blocks it said
  were cleared);
* ``capacity`` (when the engine's pool size is declared): the index never holds more blocks
  of one medium and group than the engine has, which only lost removals can cause.

After a gap that replay cannot fill, what the lost batches did is unknown: the index is
marked unverified, its block checks are suspended (counted, never reported as violations)
until the next ``AllBlocksCleared`` makes it exact again, and the gap itself is the
violation.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import msgspec

from prefixkv.spec import PrefixCacheError

__all__ = [
    "CHECKS",
    "AuditError",
    "Check",
    "EngineEvent",
    "StreamAudit",
    "Violation",
    "audit_batches",
    "decode_engine_batch",
]


class AuditError(PrefixCacheError, ValueError):
    """An auditor set up wrong (a bad pool size, a bad frame layout name)."""


class Check(enum.Enum):
    """The invariants the auditor checks (see the module doc)."""

    DECODES = "decodes"
    NO_GAP = "no-gap"
    PARENT_BEFORE_CHILD = "parent-before-child"
    KNOWN_REMOVAL = "known-removal"
    SINGLE_STORE = "single-store"
    CLEAR_EMPTIES = "clear-empties"
    CAPACITY = "capacity"


CHECKS = tuple(c.value for c in Check)

Hash = int | bytes
Key = tuple[str | None, int, Hash]


class _DecodeFailure(Exception):
    pass


@attrs.frozen
class EngineEvent:
    """One event as any engine sends it, reduced to what the index needs.

    ``kind`` is the event's tag (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``,
    or prefixkv's ``CheckpointStored`` / ``CheckpointRemoved``).
    """

    kind: str
    block_hashes: tuple[Hash, ...] = ()
    parent_block_hash: Hash | None = None
    medium: str | None = None
    group_idx: int = 0


@attrs.frozen
class Violation:
    """One broken invariant: the check, the batch, and what happened."""

    check: str
    seq: int
    message: str
    cause: str | None = None

    def as_json(self) -> dict[str, Any]:
        """Returns: the violation as a JSON object (``cause`` only when there is one)."""
        out: dict[str, Any] = {"check": self.check, "seq": self.seq, "message": self.message}
        if self.cause is not None:
            out["cause"] = self.cause
        return out


# --- decoding any engine's batch --------------------------------------------------------------

# Positional fields of the array-like events (vLLM 0.20, SGLang): index after the tag.
_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys", "group_idx"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
    "CheckpointStored": ("block_hashes", "medium"),
    "CheckpointRemoved": ("block_hashes", "medium"),
}  # fmt: skip
_DECODER = msgspec.msgpack.Decoder()


def _is_hash(value: Any) -> bool:
    return isinstance(value, bytes) or (isinstance(value, int) and not isinstance(value, bool))


def _event(raw: Any, i: int) -> EngineEvent:
    if isinstance(raw, dict):
        kind = raw.get("type")
        fields = raw
    elif isinstance(raw, (list, tuple)) and raw:
        kind = raw[0]
        names = _ARRAY_FIELDS.get(kind, ()) if isinstance(kind, str) else ()
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise _DecodeFailure(f"event {i} is {raw!r}: neither a tagged map nor a tagged array")
    if not isinstance(kind, str) or kind not in _ARRAY_FIELDS:
        raise _DecodeFailure(f"event {i} has an unknown tag {kind!r}")
    if kind == "AllBlocksCleared":
        return EngineEvent(kind)
    hashes = fields.get("block_hashes")
    if not isinstance(hashes, list) or not all(_is_hash(h) for h in hashes):
        raise _DecodeFailure(f"event {i} ({kind}): block_hashes {hashes!r} is not a hash list")
    medium = fields.get("medium")
    if medium is not None and not isinstance(medium, str):
        raise _DecodeFailure(f"event {i} ({kind}): medium {medium!r} is not text")
    group = fields.get("group_idx")
    if group is None:
        group = 0
    if isinstance(group, bool) or not isinstance(group, int):
        raise _DecodeFailure(f"event {i} ({kind}): group_idx {group!r} is not an int")
    parent = fields.get("parent_block_hash")
    if parent is not None and not _is_hash(parent):
        raise _DecodeFailure(f"event {i} ({kind}): parent_block_hash {parent!r} is not a hash")
    if kind == "BlockStored":
        if not isinstance(fields.get("token_ids"), list):
            raise _DecodeFailure(f"event {i} (BlockStored) has no token_ids list")
        if not hashes:
            raise _DecodeFailure(f"event {i} (BlockStored) stores no block")
    return EngineEvent(kind, tuple(hashes), parent, medium, group)


def decode_engine_batch(payload: bytes) -> list[EngineEvent]:
    """The events of one ``EventBatch`` from any engine, in either event shape.

    Args:
        payload: the batch's msgpack bytes (``[ts, events, data_parallel_rank?]``).

    Returns:
        The events, in order; :class:`ValueError` (with what is wrong) for bytes that are
        not such a batch.
    """
    try:
        batch = _DECODER.decode(payload)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not msgpack: {exc}") from None
    if not isinstance(batch, list) or len(batch) not in (2, 3):
        raise ValueError(f"an EventBatch is [ts, events, rank?], got {type(batch).__name__}")
    ts, events = batch[0], batch[1]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not isinstance(events, list):
        raise ValueError("an EventBatch is [ts, events, rank?]: bad ts or events")
    try:
        return [_event(raw, i) for i, raw in enumerate(events)]
    except _DecodeFailure as exc:
        raise ValueError(str(exc)) from None


# --- the audit ---------------------------------------------------------------------------------


@attrs.define
class _Block:
    stored_in: int  # the batch that stored it (for "stale" vs "repeated")
    refs: int = 1
    last_event: int = -1  # the index, in the whole stream, of the last event touching it


def _seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise ValueError(f"sequence frame of {len(frame)} bytes, expected 8")
    return int.from_bytes(frame, "big", signed=True)


class StreamAudit:
    """The index a consumer builds from one publisher's stream, and every broken invariant.

    Feed it :meth:`on_pub` for each PUB message; when it returns a sequence number, ask the
    replay endpoint for the batches from there and pass them to :meth:`on_replayed`, then
    call :meth:`finish_replay` with the message that revealed the gap.

    Args:
        topic: the publisher's topic (``None``: any).
        num_blocks: the engine's pool size per medium and group (the ``capacity`` check).
        refcount: the engine declares a refcount model: a store of a live block takes one
            more reference instead of breaking ``single-store``.
        max_violations: how many violations to keep in full (all are counted).
    """

    def __init__(
        self,
        *,
        topic: bytes | None = None,
        num_blocks: int | None = None,
        refcount: bool = False,
        max_violations: int = 1000,
    ) -> None:
        if num_blocks is not None and (isinstance(num_blocks, bool) or num_blocks < 1):
            raise AuditError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.topic = topic
        self.num_blocks = num_blocks
        self.refcount = refcount
        self.max_violations = max_violations
        self.last_seq = -1
        self.batches = 0
        self.events: dict[str, int] = {}
        self.violations: list[Violation] = []
        self.counts: dict[str, int] = dict.fromkeys(CHECKS, 0)
        self.replays = 0
        self.replayed = 0
        self.duplicates = 0
        self.unverified_since: int | None = None
        self.suspended = 0
        self.peak_live = 0
        self.joined_at: int | None = None
        self._per_pool: dict[tuple[str | None, int], int] = {}
        self._over: set[tuple[str | None, int]] = set()
        self._live: dict[Key, _Block] = {}
        self._cleared: dict[Key, int] = {}  # dropped by the last AllBlocksCleared -> its seq
        # NOTE: a count per block, kept apart from the blocks: a hybrid cache removes a
        # stale checkpoint after its evicted block (as prefixkv's EventMirror allows).
        self._checkpoints: dict[Key, int] = {}
        self._clock = 0

    # -- results --

    @property
    def live(self) -> int:
        """The blocks the index holds now."""
        return len(self._live)

    @property
    def ok(self) -> bool:
        """Whether no invariant was broken."""
        return not any(self.counts.values())

    def report(self) -> dict[str, Any]:
        """Returns: the audit as a JSON object (``ok``, counts per check, violations)."""
        return {
            "ok": self.ok,
            "batches": self.batches,
            "last_seq": self.last_seq,
            "events": dict(sorted(self.events.items())),
            "live_blocks": self.live,
            "peak_live_blocks": self.peak_live,
            "replays": self.replays,
            "replayed_batches": self.replayed,
            "duplicate_batches": self.duplicates,
            "joined_at": self.joined_at,
            "unverified_since": self.unverified_since,
            "suspended_checks": self.suspended,
            "refcount": self.refcount,
            "num_blocks": self.num_blocks,
            "violations_by_check": dict(self.counts),
            "violations": [v.as_json() for v in self.violations],
        }

    # -- the stream --

    def on_pub(self, frames: Sequence[bytes]) -> int | None:
        """One PUB message ``[topic, seq, payload]``.

        Args:
            frames: the message's frames.

        Returns:
            The first missing sequence number when the message reveals a gap (replay from
            there), else ``None``.
        """
        if len(frames) != 3:
            msg = f"a message of {len(frames)} frames, expected [topic, seq, payload]"
            self._violate(Check.DECODES, self.last_seq + 1, msg)
            return None
        if self.topic is not None and frames[0] != self.topic:
            return None  # another topic on the same socket: not this stream
        try:
            seq = _seq(frames[1])
        except ValueError as exc:
            self._violate(Check.DECODES, self.last_seq + 1, str(exc))
            return None
        if seq <= self.last_seq:
            self.duplicates += 1
            return None
        if seq > self.last_seq + 1:
            return self.last_seq + 1
        self._batch(seq, frames[2])
        return None

    def on_replayed(self, frames: Sequence[bytes]) -> bool:
        """One replay reply (the leading empty frame stripped or not).

        Accepts vLLM 0.33's ``[topic, seq, payload]`` and vLLM 0.20's (and SGLang's)
        ``[seq, payload]``.

        Args:
            frames: the reply's frames.

        Returns:
            False on the end marker (sequence -1), True otherwise.
        """
        body = list(frames[1:]) if frames and frames[0] == b"" and len(frames) > 2 else list(frames)
        if len(body) not in (2, 3):
            msg = f"a replay reply of {len(frames)} frames"
            self._violate(Check.DECODES, self.last_seq + 1, msg)
            return True
        try:
            seq = _seq(body[-2])
        except ValueError as exc:
            self._violate(Check.DECODES, self.last_seq + 1, f"replay: {exc}")
            return True
        if seq == -1:
            return False
        if seq <= self.last_seq:
            return True
        if seq > self.last_seq + 1:
            # The replay buffer no longer holds what was lost.
            self._gap(self.last_seq + 1, seq, "the replay endpoint no longer holds them")
        self.replayed += 1
        self._batch(seq, body[-1])
        return True

    def begin_replay(self) -> None:
        """Count one replay request."""
        self.replays += 1

    def finish_replay(self, frames: Sequence[bytes], reason: str | None = None) -> None:
        """The replay asked for by :meth:`on_pub` is over; then the message that asked.

        Args:
            frames: the PUB message whose sequence number revealed the gap.
            reason: why the replay endpoint could not serve it (``None``: it answered).
        """
        seq = _seq(frames[1])
        if seq <= self.last_seq:
            return  # the replay brought it
        why = reason or "the replay endpoint did not return them"
        if seq > self.last_seq + 1:
            self._gap(self.last_seq + 1, seq, why)
        self._batch(seq, frames[2])

    def feed(self, seq: int, payload: bytes) -> None:
        """One batch known to be next in sequence (a corpus, a file): no gap handling.

        Args:
            seq: its sequence number.
            payload: its ``EventBatch`` bytes.
        """
        if seq > self.last_seq + 1:
            self._gap(self.last_seq + 1, seq, "not in the stream")
        self._batch(seq, payload)

    # -- internals --

    def _gap(self, start: int, end: int, why: str) -> None:
        if start == 0 and self.batches == 0:
            # NOTE: joining a running stream is no fault of the engine's: the batches before
            # the first one seen are simply unknown, as after a gap, but not a violation.
            self.joined_at = end
            self.unverified_since = end
            return
        self._violate(Check.NO_GAP, end, f"batches {start}..{end - 1} lost: {why}")
        if self.unverified_since is None:
            self.unverified_since = end

    def _violate(self, check: Check, seq: int, message: str, cause: str | None = None) -> None:
        self.counts[check.value] += 1
        if len(self.violations) < self.max_violations:
            self.violations.append(Violation(check.value, seq, message, cause))

    def _block_check(self, check: Check, seq: int, message: str, cause: str | None = None) -> None:
        if self.unverified_since is not None:
            self.suspended += 1  # the lost batches may explain it
            return
        self._violate(check, seq, message, cause)

    def _batch(self, seq: int, payload: bytes) -> None:
        self.last_seq = seq
        self.batches += 1
        try:
            events = decode_engine_batch(payload)
        except ValueError as exc:
            self._violate(Check.DECODES, seq, f"batch {seq}: {exc}")
            return
        for event in events:
            self.events[event.kind] = self.events.get(event.kind, 0) + 1
            self._apply(seq, event)
        self.peak_live = max(self.peak_live, len(self._live))
        if self.num_blocks is not None and self.unverified_since is None:
            self._capacity(seq)

    def _apply(self, seq: int, event: EngineEvent) -> None:
        self._clock += 1
        if event.kind == "AllBlocksCleared":
            # NOTE: an index after AllBlocksCleared is empty: the blocks it dropped are
            # remembered only to name the engine that still uses one (clear-empties).
            self._cleared = dict.fromkeys(self._live, seq)
            self._live.clear()
            self._per_pool.clear()
            self._over.clear()
            self._checkpoints.clear()
            self.unverified_since = None  # the index is exact again
            return
        keys = [(event.medium, event.group_idx, h) for h in event.block_hashes]
        if event.kind == "BlockStored":
            self._store(seq, event, keys)
        elif event.kind == "BlockRemoved":
            for key in keys:
                self._remove(seq, key)
        elif event.kind == "CheckpointStored":
            for key in keys:
                if key not in self._live:
                    msg = f"a checkpoint of {_name(key)}, which is not stored"
                    self._block_check(Check.PARENT_BEFORE_CHILD, seq, msg)
                self._checkpoints[key] = self._checkpoints.get(key, 0) + 1
        elif event.kind == "CheckpointRemoved":
            for key in keys:
                left = self._checkpoints.pop(key, 0) - 1
                if left < 0:
                    msg = f"CheckpointRemoved of {_name(key)}, which carries no checkpoint"
                    self._block_check(Check.KNOWN_REMOVAL, seq, msg)
                elif left:
                    self._checkpoints[key] = left

    def _store(self, seq: int, event: EngineEvent, keys: list[Key]) -> None:
        parent = event.parent_block_hash
        if parent is not None:
            pkey: Key = (event.medium, event.group_idx, parent)
            if pkey not in self._live:
                if pkey in self._cleared:
                    self._block_check(
                        Check.CLEAR_EMPTIES,
                        seq,
                        f"BlockStored under parent {_name(pkey)}, which the AllBlocksCleared "
                        f"of batch {self._cleared[pkey]} dropped",
                    )
                else:
                    self._block_check(
                        Check.PARENT_BEFORE_CHILD,
                        seq,
                        f"BlockStored of {_name(keys[0])} under parent {_name(pkey)}, "
                        "which is not stored",
                    )
        for key in keys:
            block = self._live.get(key)
            if block is None:
                self._live[key] = _Block(seq, last_event=self._clock)
                self._per_pool[key[:2]] = self._per_pool.get(key[:2], 0) + 1
                self._cleared.pop(key, None)
                continue
            if self.refcount:
                block.refs += 1
            else:
                repeated = block.stored_in == seq and block.last_event == self._clock - 1
                self._block_check(
                    Check.SINGLE_STORE,
                    seq,
                    f"BlockStored of {_name(key)}, live since batch {block.stored_in} with no "
                    "BlockRemoved",
                    "repeated" if repeated else "stale",
                )
            block.last_event = self._clock

    def _remove(self, seq: int, key: Key) -> None:
        block = self._live.get(key)
        if block is None:
            if key in self._cleared:
                self._block_check(
                    Check.CLEAR_EMPTIES,
                    seq,
                    f"BlockRemoved of {_name(key)}, which the AllBlocksCleared of batch "
                    f"{self._cleared.pop(key)} dropped",
                )
            else:
                self._block_check(
                    Check.KNOWN_REMOVAL, seq, f"BlockRemoved of {_name(key)}, which is not stored"
                )
            return
        block.refs -= 1
        block.last_event = self._clock
        if block.refs == 0:
            del self._live[key]
            self._per_pool[key[:2]] -= 1

    def _capacity(self, seq: int) -> None:
        assert self.num_blocks is not None
        for pool, n in sorted(self._per_pool.items(), key=str):
            if n <= self.num_blocks:
                self._over.discard(pool)
            elif pool not in self._over:  # once per overrun, not once per batch
                self._over.add(pool)
                self._violate(
                    Check.CAPACITY,
                    seq,
                    f"{n} blocks live on {pool[0]} group {pool[1]}, in a pool of "
                    f"{self.num_blocks}: BlockRemoved events were lost",
                )


def _name(key: Key) -> str:
    medium, group, h = key
    shown = h.hex() if isinstance(h, bytes) else str(h)
    where = "" if (medium in (None, "GPU") and group == 0) else f" ({medium}, group {group})"
    return f"block {shown}{where}"


def audit_batches(batches: Iterable[tuple[int, bytes]], **options: Any) -> StreamAudit:
    """Audit a recorded stream of ``(seq, payload)`` batches (no transport).

    Args:
        batches: the batches, in the order they were sent.
        options: :class:`StreamAudit`'s keyword arguments.

    Returns:
        The audit, every batch fed.
    """
    audit = StreamAudit(**options)
    for seq, payload in batches:
        audit.feed(seq, payload)
    return audit
