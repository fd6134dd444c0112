"""Safety checks under an engine's declared policy: the INV-* that any correct cache keeps.

prefixkv's invariants (:mod:`prefixkv.spec.invariants`) encode its own choices 1 to 3:
publish after compute, leaf-only eviction, private duplicates. Engines that chose otherwise
declare it (:class:`~prefixkv.conformance.Capabilities`), and each declaration swaps one
policy check for the weakest safety property that still catches real bugs:

* ``publish=schedule``: INV-PUBLISH and INV-WRITE allow a published block whose KV is not
  written yet, if it belongs to a live writer that will write it; a hit (or a match) on a
  block whose writer was freed before writing it is INV-PUBLISH. Only the writer writes it,
  readers never do.
* ``eviction=any``: INV-ANCESTOR is dropped. A match through an evicted parent fails
  INV-MATCH (the child no longer extends the matched chain), and ``evict(n)`` must reach
  every refcount-0 published block (EVICT): unreachable blocks are evictable, never leaked.
* ``duplicates=shared``: INV-INDEX allows several published blocks per identity; every one
  is indexed and verified. A block's parent may be any published copy of its writer's
  parent (the same full identity), in INV-PUBLISH at compute and at schedule time and in
  INV-MATCH alike; a parent of another identity is still INV-PUBLISH.
* ``duplicates=last-wins``: as ``shared``, and older copies may leave the index while they
  stay published and read-only.
* ``checkpoints`` in the safety mode: a reservation may sit at any *safe* save point, not
  only at prefixkv's (the last full block of the scheduled prompt, or a multiple of
  ``decode_state_interval``): a block boundary among its owner's unwritten reserved tokens,
  so that the coming forward computes the state there, over a KV prefix the sequence holds.
  A save past the scheduled tokens (a state no forward of this step reaches) or at or
  before the committed ones (a state already gone) is INV-CKPT. The rest of INV-CKPT is
  safety and stays.

What a block's KV holds is not in a :class:`~prefixkv.spec.CacheState`, so
:class:`KVLedger` follows it from consecutive snapshots: a block allocated fresh to a
sequence is *unwritten* until that sequence commits past its end. The ledger needs nothing
from the engine beyond the snapshot.

Steps, for ``publish=schedule``: the machines group operations into steps, one forward pass
each, and close each with :meth:`KVLedger.end_step` (the oracle's ``end_step``, which also
calls the adapter's optional ``end_step()`` hook). The model:

* at the end of a step the forward pass has written every block scheduled in it, so a
  published block that is not computed yet may be hit by a request scheduled in its
  writer's step or a later one, while the writer is live (*pending*);
* a cancel (``free``, a preemption, a ``rollback`` of the tail) takes effect between steps:
  the oracle ends the current step before it, so the readers that hold a block when its
  writer is cancelled were scheduled in steps whose forward passes ran with the writer's,
  and they keep it (unpublished and shared by them: :attr:`KVLedger.readers`);
* the commit is the only report that a block's KV was written, and a cancel before it may
  follow a forward pass whose output was dropped (an aborted or preempted request), so from
  the next step on the block holds nothing: it must be unpublished or never served. A hit
  on it is INV-PUBLISH, and INV-WRITE still holds: nobody writes it, and only the readers of
  the writer's steps may share it.

NOTE: the ledger's hit check applies under every policy in the safety mode: with publish
after compute it can never fire on a correct cache (a block is published only once it is
written), so it costs nothing and catches a schedule-time publisher that was not declared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

import attrs

from prefixkv.spec import CacheState, SeqId
from prefixkv.spec import invariants as inv
from prefixkv.spec.invariant_ids import InvariantId
from prefixkv.spec.invariants import Violation

from .capabilities import Capabilities

__all__ = ["ROOT_CAUSE_ORDER", "KVLedger", "root_cause_first", "safety_violations"]

#: Invariants in the order a report names them: the first that fails is the likeliest root
#: cause of the others (a block published too early makes its writer's table look shared,
#: so INV-PUBLISH comes before INV-WRITE; a block freed while in use looks like a shared
#: private block, so INV-PARTITION comes before INV-WRITE too).
ROOT_CAUSE_ORDER = (
    InvariantId.REF,
    InvariantId.PUBLISH,
    InvariantId.INDEX,
    InvariantId.ANCESTOR,
    InvariantId.MATCH,
    InvariantId.PARTITION,
    InvariantId.WRITE,
    InvariantId.WINDOW,
    InvariantId.LIMIT,
    InvariantId.STATS,
    InvariantId.CKPT,
)


#: Each invariant's place in :data:`ROOT_CAUSE_ORDER`.
_RANK: dict[str, int] = {name: i for i, name in enumerate(ROOT_CAUSE_ORDER)}


def root_cause_first(found: Iterable[Violation]) -> list[Violation]:
    """``found`` sorted by :data:`ROOT_CAUSE_ORDER` (stable within one invariant)."""
    return sorted(found, key=lambda v: _RANK.get(v.invariant, len(_RANK)))


@attrs.define
class KVLedger:
    """Which blocks hold written KV, followed from snapshots, step by step (see the module
    doc)."""

    #: block -> the sequence it was allocated to fresh, while its KV is unwritten.
    writer: dict[int, SeqId] = attrs.field(factory=dict)
    #: Blocks whose KV a writer committed (until they are freed or reallocated).
    written: set[int] = attrs.field(factory=set)
    #: block -> the writer that was cancelled (freed or rolled back) before writing it.
    orphaned: dict[int, SeqId] = attrs.field(factory=dict)
    #: pending block -> the step its writer was scheduled in (allocated it).
    scheduled: dict[int, int] = attrs.field(factory=dict)
    #: orphaned block -> the sequences that held it when its writer was cancelled: they were
    #: scheduled in the writer's steps, so their forward passes read what it wrote.
    readers: dict[int, frozenset[SeqId]] = attrs.field(factory=dict)
    #: orphaned block -> the step before whose start its writer was cancelled.
    cancelled: dict[int, int] = attrs.field(factory=dict)
    #: The current step (0 is the first).
    step: int = 0

    def copy(self) -> KVLedger:
        return KVLedger(
            dict(self.writer),
            set(self.written),
            dict(self.orphaned),
            dict(self.scheduled),
            dict(self.readers),
            dict(self.cancelled),
            self.step,
        )

    def end_step(self) -> None:
        """The step's forward pass ran; operations from now on belong to the next step."""
        self.step += 1

    def _forget(self, b: int) -> None:
        self.writer.pop(b, None)
        self.written.discard(b)
        self.orphaned.pop(b, None)
        self.scheduled.pop(b, None)
        self.readers.pop(b, None)
        self.cancelled.pop(b, None)

    def _fresh(self, b: int, seq_id: SeqId) -> None:
        self._forget(b)
        self.writer[b] = seq_id
        self.scheduled[b] = self.step

    def _cancel(self, b: int, seq_id: SeqId, holders: frozenset[SeqId]) -> None:
        del self.writer[b]
        self.scheduled.pop(b, None)
        self.orphaned[b] = seq_id
        self.readers[b] = holders
        self.cancelled[b] = self.step

    def update(self, before: CacheState, after: CacheState) -> list[str]:
        """Follow one operation; return the hits it made on blocks that hold no KV."""
        bs = after.block_size
        problems: list[str] = []
        old = {v.seq_id: v for v in before.sequences}
        new = {v.seq_id: v for v in after.sequences}
        holders = _holders(after)
        for seq_id, prev in old.items():  # freed, or its tail rolled back
            cur = new.get(seq_id)
            kept = 0
            if cur is not None and prev.block_ids[: len(cur.block_ids)] == cur.block_ids:
                kept = len(cur.block_ids)
            elif cur is not None and cur.block_ids[: len(prev.block_ids)] == prev.block_ids:
                kept = len(prev.block_ids)
            for b in prev.block_ids[kept:]:
                if self.writer.get(b) == seq_id:
                    self._cancel(b, seq_id, holders.get(b, frozenset()))
        for seq_id, seq in new.items():
            was = old.get(seq_id)
            if was is not None:  # the same sequence (no operation frees and re-admits one)
                # it grew (blocks past the common prefix are fresh) or shrank (rollback)
                first = _common_prefix(was.block_ids, seq.block_ids)
            else:  # admitted (or re-admitted under the same id)
                first = seq.num_cached_tokens // bs
                # NOTE: the hits are the SeqView's num_cached_tokens, which the adapter must
                # fill. Guessing them from identities fails: a schedule-time publisher may
                # evict a block and republish the same identity into it (a prompt's only
                # block, which the one-token cap never lets it hit).
                problems += self.unwritten(seq.block_ids[:first], after, f"admission of {seq_id!r}")
            for b in seq.block_ids[first:]:
                self._fresh(b, seq_id)
            for j in range(min(seq.num_computed // bs, len(seq.block_ids))):
                b = seq.block_ids[j]
                if self.writer.get(b) == seq_id:
                    self.written.add(b)
                    del self.writer[b]
                    self.scheduled.pop(b, None)
        for b in after.free_queue:  # free again: whatever it held is gone
            self._forget(b)
        return problems

    def unwritten(self, blocks: Iterable[int], state: CacheState, what: str) -> list[str]:
        """Hits, made now (in the current step), among ``blocks`` that would serve KV nobody
        wrote or will write: a block written and committed, or pending (its writer is live
        and was scheduled in this step or an earlier one), is served; any other is not."""
        holders = {b for seq in state.sequences for b in seq.block_ids}
        problems: list[str] = []
        for j, b in enumerate(blocks):
            if b in self.written:
                continue
            if b in self.orphaned:
                problems.append(
                    f"{what} (step {self.step}) hits block {b} (#{j}), whose KV was never "
                    f"written: its writer {self.orphaned[b]!r} was cancelled before committing "
                    f"it (before step {self.cancelled[b]}), and the block stayed findable "
                    "(unpublish it when its writer goes, or never serve it)"
                )
            elif self.writer.get(b) is None or b not in holders:
                problems.append(f"{what} hits block {b} (#{j}), whose KV was never written")
            elif self.scheduled.get(b, 0) > self.step:  # pragma: no cover - steps only grow
                problems.append(
                    f"{what} (step {self.step}) hits block {b} (#{j}), scheduled to be "
                    f"written in step {self.scheduled[b]}"
                )
        return problems

    def pending(self, b: int) -> bool:
        """Published-but-unwritten block with a live writer (allowed under publish=schedule)."""
        return b in self.writer and b not in self.written


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two block tables."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _holders(state: CacheState) -> dict[int, frozenset[SeqId]]:
    """block -> the live sequences whose tables hold it."""
    found: dict[int, set[SeqId]] = {}
    for seq in state.sequences:
        for b in seq.block_ids:
            found.setdefault(b, set()).add(seq.seq_id)
    return {b: frozenset(ids) for b, ids in found.items()}


def safety_violations(
    state: CacheState, caps: Capabilities, ledger: KVLedger | None = None
) -> list[Violation]:
    """Every invariant of ``state`` under ``caps``'s policy, root cause first."""
    relaxed = set()
    extra: list[Violation] = []
    by_identity = caps.duplicates != "private"
    if caps.publish == "schedule":
        relaxed |= {InvariantId.PUBLISH, InvariantId.WRITE}
        led = ledger if ledger is not None else KVLedger()
        extra += [Violation(InvariantId.PUBLISH, m) for m in _publish(state, led, by_identity)]
        extra += [Violation(InvariantId.WRITE, m) for m in _write(state, led)]
    elif by_identity:
        # NOTE: with several copies per identity, the parent of a block may be any copy of
        # its writer's parent (a lookup returns one, the writer computed another); what
        # keeps a hit safe is that the chain of identities is the writer's, so that is
        # what is checked (docs/conformance.md, "Design differences").
        relaxed.add(InvariantId.PUBLISH)
        extra += [
            Violation(InvariantId.PUBLISH, m)
            for m in inv.publish_violations(state, parents_by_identity=True)
        ]
    if caps.eviction == "any":
        relaxed.add(InvariantId.ANCESTOR)
        extra += [Violation(InvariantId.ANCESTOR, m) for m in _parent_in_pool(state)]
    if caps.duplicates != "private":
        relaxed.add(InvariantId.INDEX)
        extra += [Violation(InvariantId.INDEX, m) for m in _index(state, caps)]
    if caps.checkpoints and not caps.exact:
        # Where a sequence saves its state is the engine's choice (every chunk's last full
        # block, every k blocks, only a block-aligned chunk end...); that it saves a state
        # the coming forward computes, at a block boundary of KV it holds, is not.
        relaxed.add(InvariantId.CKPT)
        extra += inv.checkpoint_violations(state, at_save_point=False)
    # NOTE: a relaxed check is not run at all (its violations would all be dropped here).
    return root_cause_first(inv.violations(state, skip=relaxed) + extra)


def _publish(s: CacheState, ledger: KVLedger, by_identity: bool = False) -> Iterator[str]:
    """INV-PUBLISH without "only when computed": an uncomputed published block must be
    pending (its writer is live and still to write it). Its tokens, namespace and parent
    are its sequence's, as at compute time (``by_identity``: the parent may be any copy of
    the writer's parent, see :func:`~prefixkv.spec.invariants.identity_classes`)."""
    bs = s.block_size
    classes = inv.identity_classes(s) if by_identity else None
    for seq in s.sequences:
        for j, b in enumerate(seq.block_ids):
            view = s.blocks[b]
            if not view.published:
                continue
            if (j + 1) * bs > seq.num_computed and not ledger.pending(b):
                yield (
                    f"block {b} (#{j} of {seq.seq_id!r}) is published, not computed, and no "
                    "live sequence is to write it"
                )
            known = seq.token_ids[j * bs : (j + 1) * bs]
            if len(known) == bs and view.token_ids != known:
                yield f"block {b} (#{j} of {seq.seq_id!r}) is published with other tokens"
            elif len(known) < bs:
                yield f"block {b} (#{j} of {seq.seq_id!r}) is published before its tokens are known"
            if view.namespace != seq.namespace:
                yield f"block {b} (#{j} of {seq.seq_id!r}) is published in another namespace"
            problem = inv.wrong_parent(s, seq, j, classes)
            if problem is not None:
                yield problem


def _write(s: CacheState, ledger: KVLedger) -> Iterator[str]:
    """INV-WRITE for schedule-time publishers: a sequence writes only blocks it allocated
    fresh and has not written yet (others may already read them: hits in its steps), and an
    unpublished block is shared only by the readers of a cancelled writer's steps."""
    bs = s.block_size
    for seq in s.sequences:
        for j in range(seq.num_computed // bs, len(seq.block_ids)):
            b = seq.block_ids[j]
            view = s.blocks[b]
            mine = ledger.writer.get(b) == seq.seq_id
            if not mine and (view.published or view.refcount != 1):
                yield (
                    f"sequence {seq.seq_id!r} will write block {b} (#{j}), which it did not "
                    f"allocate (published={view.published}, refcount={view.refcount})"
                )
    for b, held_by in _holders(s).items():
        view = s.blocks[b]
        if view.published or view.refcount == 1:
            continue
        # NOTE: a writer cancelled before committing leaves its block to the readers
        # scheduled in its steps (the cancel took effect between steps, after their forward
        # passes); nobody writes it again, and no later step may be served it (a hit is
        # INV-PUBLISH), so exactly those readers may share it.
        readers = ledger.readers.get(b)
        if readers is not None and held_by <= readers:
            continue
        yield f"private block {b} is shared (refcount {view.refcount})"


def _parent_in_pool(s: CacheState) -> Iterator[str]:
    for view in s.blocks:
        if view.published and view.parent is not None and view.parent >= s.num_blocks:
            yield f"block {view.block_id} has parent {view.parent} outside the pool"


def _index(s: CacheState, caps: Capabilities) -> Iterator[str]:
    """INV-INDEX with several blocks per identity: every entry is a published block under
    its own hash, no block twice; under ``last-wins`` older copies may be unindexed."""
    indexed = Counter(b for _, b in s.index)
    for key, b in s.index:
        if not 0 <= b < s.num_blocks:
            yield f"index entry {key} points outside the pool at {b}"
        elif not s.blocks[b].published:
            yield f"index entry {key} points at block {b}, which is not published (stale)"
        elif s.blocks[b].block_hash != key:
            yield f"index entry {key} points at block {b}, whose hash is {s.blocks[b].block_hash}"
    for b, n in indexed.items():
        if n > 1:
            yield f"block {b} is indexed {n} times"
    for view in s.blocks:
        if not view.published:
            continue
        if view.block_id not in indexed and caps.duplicates != "last-wins":
            yield f"published block {view.block_id} is missing from the index"
        if view.token_ids is None or len(view.token_ids) != s.block_size:
            yield f"published block {view.block_id} is not a full block"
