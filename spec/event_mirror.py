"""The consumer side of the KV event stream: a mirror that applies events in order.

A KV-aware router never sees a cache, only its events. :class:`EventMirror` is the model of
such a consumer: it applies ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` in order
and holds, for every hash it was told about, the identity of the block stored under it
(namespace, parent hash, tokens, extra keys). INV-EVENTS says that after every operation the
mirror of the drained events, with the pending ones applied, holds exactly the published
blocks: :func:`prefixkv.spec.invariants.check_events` compares the two.

The mirror is strict: a store whose parent it never saw, a removal of a hash it does not
hold, or an event it does not know is an :class:`EventStreamError`, and the mirror is left as
it was. A router that applied such a stream leniently (ignore the unknown removal) would only
hide the bug that produced it. A second store of a block the mirror already holds is applied
(the mirror counts it) and INV-EVENTS reports it: under a colliding hash, two published
blocks with different parent identities can look alike to a consumer, so a repeat is a bug
only when it outnumbers the published blocks.

A hybrid cache's checkpoint events (``CheckpointStored`` / ``CheckpointRemoved``) keep, per
hash, the number of published blocks under it that carry a restorable checkpoint
(:attr:`EventMirror.checkpoints`). A store of a checkpoint on a hash the mirror does not
hold, or on more blocks than it holds under the hash, and a removal of a checkpoint it does
not hold, are :class:`EventStreamError`. A checkpoint's removal may follow its block's
(a stale checkpoint goes with its evicted block), so it is counted apart from the blocks.

NOTE: hashes name blocks; they are not identities. prefixkv's own caches put the event hash
on their events (:func:`~prefixkv.spec.identity.event_hash`, a 64-bit BLAKE2b of the
identity chain), whatever hash indexes them: two identities share one only by a BLAKE2b
collision (a birthday search of about 2^32 digests for one pair). Crafted collisions of
the index hash (``fast_hash`` can be inverted) do not reach the events. Another engine's
stream may still put two live blocks under one hash. A ``BlockRemoved`` of such a hash
cannot say which one left, so the mirror does not guess: it keeps every identity stored
under the hash and counts the removal as *unresolved* (:attr:`EventMirror.unresolved`).
What it knows stays exact: the blocks held under the hash are all but that many of those
identities. INV-EVENTS checks exactly that (the published identities are among them, and
as many as that), and compares identities, not counts, on every other hash; a removal that
leaves one identity under a hash, or identities that are all equal, is resolved at once.
:meth:`EventMirror.overlap` counts a block under such a hash only when it is held whichever
identities left. See docs/events.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from functools import partial

import attrs

from .errors import PrefixCacheError
from .events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CheckpointRemoved,
    CheckpointStored,
    KVEvent,
)
from .identity import BlockHasher, ExtraKey
from .multimodal import MultimodalSpan, block_extra_keys
from .namespace import Namespace
from .state import CacheState

__all__ = [
    "EventMirror",
    "EventStreamError",
    "MirroredBlock",
    "published_blocks",
    "published_checkpoints",
    "served_prefix_blocks",
]


_Undo = Callable[[], None]
"""One step of :meth:`EventMirror.apply_all`'s undo log."""


class EventStreamError(PrefixCacheError, ValueError):
    """An event the mirror cannot apply: the stream does not describe any cache."""


@attrs.frozen
class MirroredBlock:
    """What a consumer knows of one published block: its hash and its whole identity."""

    block_hash: int
    parent_hash: int | None
    namespace: bytes
    """:meth:`Namespace.key` of the block's namespace."""
    token_ids: tuple[int, ...]
    extra_keys: tuple[ExtraKey, ...] = ()


class EventMirror:
    """Applies KV events in order; ``blocks`` maps each hash to the blocks stored under it."""

    def __init__(self) -> None:
        self.blocks: dict[int, list[MirroredBlock]] = {}
        """Hash -> the identities stored under it and not known to have left."""
        self.unresolved: dict[int, int] = {}
        """Hash -> removals under it whose identity the mirror cannot tell (several
        different identities were stored under the hash): the mirror holds all but this
        many of ``blocks[h]``."""
        self.checkpoints: dict[int, int] = {}
        """Hash -> how many blocks under it carry a Ready (or pinned) checkpoint."""
        self.block_size: int | None = None
        self.num_events = 0
        self._undo: list[_Undo] | None = None

    @property
    def ambiguous(self) -> set[int]:
        """The hashes with an unresolved removal (see :attr:`unresolved`)."""
        return set(self.unresolved)

    def copy(self) -> EventMirror:
        out = EventMirror()
        out.blocks = {h: list(entries) for h, entries in self.blocks.items()}
        out.unresolved = dict(self.unresolved)
        out.checkpoints = dict(self.checkpoints)
        out.block_size = self.block_size
        out.num_events = self.num_events
        return out

    def __len__(self) -> int:
        return sum(len(entries) for entries in self.blocks.values()) - sum(self.unresolved.values())

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self.blocks

    def held(self, block_hash: int) -> int:
        """How many blocks the mirror holds under ``block_hash``.

        Args:
            block_hash: a hash the events carry.

        Returns:
            The identities stored under it less its unresolved removals.
        """
        return len(self.blocks.get(block_hash, ())) - self.unresolved.get(block_hash, 0)

    def apply_all(self, events: Iterable[KVEvent]) -> None:
        """Apply ``events`` in order; all or nothing.

        Args:
            events: one batch.

        Raises:
            EventStreamError: an event does not apply; the mirror is as it was before the
                batch.
        """
        # NOTE: all-or-nothing through an undo log, not a copy of the mirror: a batch
        # costs O(its events) whatever the mirror holds (a copy cost 110 ms a batch at
        # 100k blocks, and a router fell behind its replica).
        undo: list[_Undo] = []
        self._undo = undo
        try:
            for event in events:
                self.apply(event)
        except BaseException:
            for step in reversed(undo):
                step()
            raise
        finally:
            self._undo = None

    def apply(self, event: KVEvent) -> None:
        """Apply one event, or raise :class:`EventStreamError` and change nothing.

        Args:
            event: the next event of the stream.
        """
        if isinstance(event, BlockStored):
            self._store(event)
        elif isinstance(event, BlockRemoved):
            self._remove(event)
        elif isinstance(event, AllBlocksCleared):
            old = (self.blocks, self.checkpoints, self.unresolved)
            self.blocks, self.checkpoints, self.unresolved = {}, {}, {}
            self._log(partial(self._restore, *old))
        elif isinstance(event, CheckpointStored):
            self._store_checkpoints(event.block_hashes)
        elif isinstance(event, CheckpointRemoved):
            self._remove_checkpoints(event.block_hashes)
        else:
            raise EventStreamError(f"unknown KV event {event!r}")
        self.num_events += 1
        self._log(self._uncount)

    def _log(self, step: _Undo) -> None:
        """Record how to undo a change, inside :meth:`apply_all`."""
        if self._undo is not None:
            self._undo.append(step)

    def _uncount(self) -> None:
        self.num_events -= 1

    def _restore(
        self,
        blocks: dict[int, list[MirroredBlock]],
        checkpoints: dict[int, int],
        unresolved: dict[int, int],
    ) -> None:
        self.blocks, self.checkpoints, self.unresolved = blocks, checkpoints, unresolved

    def _store(self, ev: BlockStored) -> None:
        n = len(ev.block_hashes)
        bs = ev.block_size
        if isinstance(bs, bool) or not isinstance(bs, int) or bs < 1:
            raise EventStreamError(f"BlockStored with block size {bs!r}")
        if self.block_size is not None and bs != self.block_size:
            raise EventStreamError(
                f"BlockStored with block size {bs}, the stream uses {self.block_size}"
            )
        if n == 0 or len(ev.token_ids) != n * bs or len(ev.extra_keys) != n:
            raise EventStreamError(
                f"BlockStored of {n} blocks carries {len(ev.token_ids)} tokens and "
                f"{len(ev.extra_keys)} extra-key entries (block size {bs})"
            )
        try:
            ns = Namespace(ev.model, ev.adapter, ev.salt).key()
        except PrefixCacheError as exc:
            raise EventStreamError(f"BlockStored with a bad namespace: {exc}") from None
        parent = ev.parent_block_hash
        if parent is not None and self.held(parent) < 1:
            raise EventStreamError(f"BlockStored under parent hash {parent}, never stored")
        new: list[MirroredBlock] = []
        for i, h in enumerate(ev.block_hashes):
            block = MirroredBlock(
                h, parent, ns, tuple(ev.token_ids[i * bs : (i + 1) * bs]), tuple(ev.extra_keys[i])
            )
            new.append(block)
            parent = h
        old_size = self.block_size
        self.block_size = bs
        for block in new:
            self.blocks.setdefault(block.block_hash, []).append(block)
        if self._undo is not None:
            self._undo.append(partial(self._unstore, new, old_size))

    def _unstore(self, new: list[MirroredBlock], block_size: int | None) -> None:
        for block in reversed(new):
            entries = self.blocks[block.block_hash]
            entries.pop()
            if not entries:
                del self.blocks[block.block_hash]
        self.block_size = block_size

    def _remove(self, ev: BlockRemoved) -> None:
        counts: dict[int, int] = {}
        for h in ev.block_hashes:
            counts[h] = counts.get(h, 0) + 1
            if counts[h] > self.held(h):
                raise EventStreamError(f"BlockRemoved of hash {h}, which the mirror does not hold")
        for h in ev.block_hashes:
            entries = self.blocks[h]
            k = self.unresolved.get(h, 0)
            if self._undo is not None:
                self._undo.append(partial(self._unremove, h, list(entries), k))
            if len(entries) - k == 1:
                # The last block under the hash left: whichever it was, none is held.
                del self.blocks[h]
                self.unresolved.pop(h, None)
            elif entries.count(entries[-1]) == len(entries):
                entries.pop()  # all one identity: the one that left is known
            else:
                # NOTE: not guessed. Popping the identity stored last mispredicted a
                # router on crafted collisions, and hid a wrong removal from INV-EVENTS.
                self.unresolved[h] = k + 1

    def _unremove(self, h: int, entries: list[MirroredBlock], k: int) -> None:
        self.blocks[h] = entries
        if k:
            self.unresolved[h] = k
        else:
            self.unresolved.pop(h, None)

    def has_checkpoint(self, block_hash: int) -> bool:
        """Whether a block under ``block_hash`` carries a restorable checkpoint."""
        return self.checkpoints.get(block_hash, 0) > 0

    def _store_checkpoints(self, hashes: Sequence[int]) -> None:
        counts: dict[int, int] = {}
        for h in hashes:
            counts[h] = counts.get(h, 0) + 1
            # Each published block carries at most one checkpoint (INV-CKPT).
            if self.checkpoints.get(h, 0) + counts[h] > self.held(h):
                raise EventStreamError(
                    f"CheckpointStored on hash {h}: more checkpoints than blocks the mirror holds"
                )
        self._log_checkpoints(counts)
        for h, n in counts.items():
            self.checkpoints[h] = self.checkpoints.get(h, 0) + n

    def _log_checkpoints(self, counts: dict[int, int]) -> None:
        if self._undo is not None:
            old = {h: self.checkpoints.get(h, 0) for h in counts}
            self._undo.append(partial(self._uncheckpoint, old))

    def _uncheckpoint(self, old: dict[int, int]) -> None:
        for h, n in old.items():
            if n:
                self.checkpoints[h] = n
            else:
                self.checkpoints.pop(h, None)

    def _remove_checkpoints(self, hashes: Sequence[int]) -> None:
        counts: dict[int, int] = {}
        for h in hashes:
            counts[h] = counts.get(h, 0) + 1
            if counts[h] > self.checkpoints.get(h, 0):
                raise EventStreamError(
                    f"CheckpointRemoved of hash {h}, which carries no checkpoint in the mirror"
                )
        self._log_checkpoints(counts)
        for h, n in counts.items():
            left = self.checkpoints[h] - n
            if left:
                self.checkpoints[h] = left
            else:
                del self.checkpoints[h]

    def overlap(
        self,
        hasher: BlockHasher,
        namespace: Namespace,
        token_ids: Sequence[int],
        spans: Sequence[MultimodalSpan] = (),
    ) -> int:
        """How many leading full blocks of a request the mirror holds, identity verified.

        This is what a router that speaks prefixkv's own events predicts for a replica.

        Args:
            hasher: the hash the events carry (``event_hash`` for prefixkv's caches).
            namespace: the request's namespace.
            token_ids: its tokens.
            spans: its multimodal spans.

        Returns:
            The leading blocks held for sure: a block under a hash with unresolved
            removals counts only if it is held whichever identities left.
        """
        bs = self.block_size
        if bs is None:
            return 0
        ns = namespace.key()
        parent: int | None = None
        for j in range(len(token_ids) // bs):
            tokens = tuple(token_ids[j * bs : (j + 1) * bs])
            extras = block_extra_keys(spans, j * bs, bs)
            h = hasher(parent, ns, tokens, extras)
            entries = self.blocks.get(h, ())
            block = MirroredBlock(h, parent, ns, tokens, extras)
            if block not in entries:
                return j
            k = self.unresolved.get(h, 0)
            if k and entries.count(block) <= k:
                return j  # held unless the unresolved removals took it: not counted
            parent = h
        return len(token_ids) // bs


def published_blocks(state: CacheState) -> list[tuple[int, MirroredBlock]]:
    """``(block id, what a faithful mirror holds for it)`` for every published block."""
    out = []
    for view in state.blocks:
        if not view.published or view.block_hash is None or view.token_ids is None:
            continue
        parent = None if view.parent is None else state.blocks[view.parent].wire_hash
        ns = view.namespace if view.namespace is not None else b""
        h = view.wire_hash
        assert h is not None
        out.append((view.block_id, MirroredBlock(h, parent, ns, view.token_ids, view.extra_keys)))
    return out


def published_checkpoints(state: CacheState) -> dict[int, int]:
    """Hash -> how many published blocks under it carry a Ready or pinned checkpoint: what
    a faithful mirror's :attr:`EventMirror.checkpoints` holds."""
    out: dict[int, int] = {}
    slots = state.state_slots
    if slots is None:
        return out
    for ck in slots.checkpoints:
        if ck.status == "reserved" or ck.node is None:
            continue
        h = state.blocks[ck.node].wire_hash
        if h is not None:
            out[h] = out.get(h, 0) + 1
    return out


def served_prefix_blocks(
    state: CacheState,
    namespace: Namespace,
    token_ids: Sequence[int],
    spans: Sequence[MultimodalSpan] = (),
) -> int:
    """How many leading full blocks of a request are published in ``state``.

    The ground truth a router's overlap must equal: block ``j`` counts when a published
    block carries exactly the request's ``j``-th identity (namespace, parent, tokens, extra
    keys), before the match policy's caps (choices 4-6), which a router does not model.
    """
    bs = state.block_size
    ns = namespace.key()
    by_identity = {
        (v.namespace, v.parent, v.token_ids, v.extra_keys): v.block_id
        for v in state.blocks
        if v.published
    }
    parent: int | None = None
    for j in range(len(token_ids) // bs):
        key = (
            ns,
            parent,
            tuple(token_ids[j * bs : (j + 1) * bs]),
            block_extra_keys(spans, j * bs, bs),
        )
        found = by_identity.get(key)
        if found is None:
            return j
        parent = found
    return len(token_ids) // bs
