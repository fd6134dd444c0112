"""Every INV-* of the design, evaluated on an implementation-neutral :class:`CacheState`.

``check(cache_or_state)`` raises :class:`InvariantViolation` naming the first invariant that
fails; ``violations(...)`` lists them all. INV-TXN compares two states, so it lives with the
state machines (:func:`check_unchanged` is its helper). INV-MATCH is about a match result, so
it has its own entry point, :func:`check_match`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Iterator

import attrs

from prefixkv.errors import InvalidConfig, PrefixKVError

from .contract import save_point
from .event_mirror import (
    EventMirror,
    EventStreamError,
    MirroredBlock,
    published_blocks,
    published_checkpoints,
)
from .invariant_ids import InvariantId
from .multimodal import block_extra_keys, span_containing
from .protocol import Inspectable
from .request import Request, SeqId
from .results import Match
from .state import CacheState, CheckpointView, SeqView, StateSlotsView

__all__ = [
    "HYBRID_INVARIANTS",
    "INVARIANTS",
    "STREAM_INVARIANTS",
    "TRANSITION_INVARIANTS",
    "InvariantViolation",
    "Violation",
    "check",
    "check_events",
    "check_match",
    "check_unchanged",
    "checkpoint_violations",
    "event_violations",
    "identity_classes",
    "publish_violations",
    "violations",
    "wrong_parent",
]

#: Invariants of one snapshot, in the order :func:`check` evaluates them. The ids themselves
#: are listed once, in :mod:`.invariant_ids`; these tuples say which of them each entry
#: point checks (``tests/spec/test_invariant_ids.py`` asserts that together they cover it).
INVARIANTS = (
    InvariantId.REF,
    InvariantId.PARTITION,
    InvariantId.INDEX,
    InvariantId.ANCESTOR,
    InvariantId.WRITE,
    InvariantId.PUBLISH,
    InvariantId.WINDOW,
    InvariantId.LIMIT,
    InvariantId.MATCH,
    InvariantId.STATS,
)

#: Invariants of the optional hybrid-model capability (choice 7): ``check`` evaluates them
#: on every snapshot that carries ``state_slots`` (a hybrid cache's) and skips them otherwise.
HYBRID_INVARIANTS = (InvariantId.CKPT,)

#: Invariants of a transition: they compare the state before a refused call with the state
#: after it, so no snapshot alone can show them (:func:`check_unchanged`).
TRANSITION_INVARIANTS = (InvariantId.TXN,)

#: Invariants of the event stream. A snapshot holds only the pending events, not those
#: already drained, so these take the consumer's mirror of the drained events as well:
#: :func:`check_events` (the runtime checker and the state machines keep the mirror).
STREAM_INVARIANTS = (InvariantId.EVENTS,)


def _registered(value: object) -> InvariantId:
    """``value`` as a registry member; an id outside the registry is refused where it is
    written, not later where a report or a coverage check would miss it."""
    if isinstance(value, str) and value in _BY_VALUE:
        return _BY_VALUE[value]
    known = ", ".join(InvariantId)
    raise InvalidConfig(f"{value!r} is not an invariant id (known: {known})")


_BY_VALUE: dict[str, InvariantId] = {member.value: member for member in InvariantId}


@attrs.frozen
class Violation:
    invariant: InvariantId = attrs.field(converter=_registered)
    message: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.message}"


class InvariantViolation(PrefixKVError, AssertionError):
    """An invariant does not hold. ``.invariant`` is its id, e.g. ``"INV-REF"``."""

    def __init__(self, violation: Violation, *more: Violation) -> None:
        self.invariant = violation.invariant
        self.violations = (violation, *more)
        super().__init__("; ".join(str(v) for v in self.violations))


def _state(obj: CacheState | Inspectable) -> CacheState:
    return obj if isinstance(obj, CacheState) else obj.snapshot()


def violations(obj: CacheState | Inspectable, *, skip: Container[str] = ()) -> list[Violation]:
    """Every violation of the state invariants, but those named in ``skip`` (each check
    yields violations of its own invariant only, so this is ``violations(obj)`` less the
    ones named in ``skip``)."""
    s = _state(obj)
    found: list[Violation] = []
    for name, gen in _STATE_CHECKS.items():
        if name not in skip:
            found.extend(Violation(name, msg) for msg in gen(s))
    return found


def check(obj: CacheState | Inspectable) -> None:
    """Raise :class:`InvariantViolation` unless every invariant holds."""
    found = violations(obj)
    if found:
        raise InvariantViolation(*found)


def check_unchanged(before: CacheState, after: CacheState, what: str) -> None:
    """INV-TXN: a failed or rejected operation changed nothing, statistics included."""
    if before != after:
        diffs = [
            f.name
            for f in attrs.fields(CacheState)
            if getattr(before, f.name) != getattr(after, f.name)
        ]
        raise InvariantViolation(
            Violation(InvariantId.TXN, f"{what} failed but changed: {', '.join(diffs)}")
        )


def checkpoint_violations(
    obj: CacheState | Inspectable, *, at_save_point: bool = True
) -> list[Violation]:
    """INV-CKPT alone. ``at_save_point=False`` keeps only its safety part for reservations:
    a Reserved checkpoint may sit at any block boundary among its owner's unwritten reserved
    tokens, not only at prefixkv's save point (the conformance kit's safety mode)."""
    return [
        Violation(InvariantId.CKPT, m) for m in _inv_ckpt(_state(obj), at_save_point=at_save_point)
    ]


def event_violations(drained: EventMirror, obj: CacheState | Inspectable) -> list[Violation]:
    """INV-EVENTS: ``drained`` (the mirror of the events drained so far) with the snapshot's
    pending events applied holds exactly the published blocks: identity, hash and parent.
    ``drained`` is not changed."""
    return [Violation(InvariantId.EVENTS, msg) for msg in _inv_events(drained, _state(obj))]


def check_events(drained: EventMirror, obj: CacheState | Inspectable) -> None:
    """Raise :class:`InvariantViolation` unless INV-EVENTS holds (see :func:`event_violations`)."""
    found = event_violations(drained, obj)
    if found:
        raise InvariantViolation(*found)


def check_match(
    obj: CacheState | Inspectable, req: Request, match: Match, *, parents_by_identity: bool = False
) -> None:
    """INV-MATCH for one match result against the state it was computed on.

    ``parents_by_identity``: a matched block's parent may be any published block with the
    same full identity as the block matched before it, not only that block (a cache that
    publishes duplicates, see :func:`identity_classes`).
    """
    s = _state(obj)
    classes = identity_classes(s) if parents_by_identity else None
    bs = s.block_size
    problems: list[str] = []
    if match.num_cached_tokens != len(match.block_ids) * bs:
        problems.append(f"{match.num_cached_tokens} cached tokens is not block-aligned")
    if match.num_cached_tokens > req.num_tokens - 1:
        problems.append(f"{match.num_cached_tokens} cached of {req.num_tokens} leaves none")
    cut = span_containing(req.spans, match.num_cached_tokens)
    if cut is not None:
        problems.append(f"the match ends at {match.num_cached_tokens}, inside {cut!r}")
    ns = req.namespace.key()
    parent = None
    for j, b in enumerate(match.block_ids):
        if not 0 <= b < s.num_blocks:
            problems.append(f"block {b} is outside the pool")
            break
        view = s.blocks[b]
        expect = req.token_ids[j * bs : (j + 1) * bs]
        extras = block_extra_keys(req.spans, j * bs, bs)
        if not view.published:
            problems.append(f"matched block {b} (#{j}) is not published")
        elif (view.namespace, view.token_ids, view.extra_keys) != (ns, expect, extras) or not (
            _same_parent(classes, view.parent, parent)
        ):
            problems.append(f"matched block {b} (#{j}) has another identity than the request")
        parent = b
    if problems:
        raise InvariantViolation(*(Violation(InvariantId.MATCH, p) for p in problems))


# -- the invariants -------------------------------------------------------------------------


def _inv_ref(s: CacheState) -> Iterator[str]:
    holders: Counter[int] = Counter()
    for seq in s.sequences:
        dup = [b for b, n in Counter(seq.block_ids).items() if n > 1]
        if dup:
            yield f"sequence {seq.seq_id!r} holds blocks {dup} more than once"
        for b in seq.block_ids:
            if not 0 <= b < s.num_blocks:
                yield f"sequence {seq.seq_id!r} holds block {b}, outside the pool"
        holders.update(seq.block_ids)
    for view in s.blocks:
        if view.refcount != holders[view.block_id]:
            yield (
                f"block {view.block_id} has refcount {view.refcount} but "
                f"{holders[view.block_id]} block tables hold it"
            )


def _inv_partition(s: CacheState) -> Iterator[str]:
    free = Counter(s.free_queue)
    for b, n in free.items():
        if n > 1:
            yield f"block {b} is in the free queue {n} times"
    for view in s.blocks:
        in_free = view.block_id in free
        evictable = view.published and view.refcount == 0
        used = view.refcount > 0
        if in_free + evictable + used != 1:
            yield (
                f"block {view.block_id} is in {in_free + evictable + used} of "
                f"free/evictable/in-use (refcount={view.refcount}, published={view.published})"
            )
        if view.refcount < 0:
            yield f"block {view.block_id} has negative refcount {view.refcount}"
    st = s.stats
    total = st.num_free_blocks + st.num_cached_blocks + st.num_used_blocks
    if total != s.num_blocks:
        yield (
            f"free {st.num_free_blocks} + cached {st.num_cached_blocks} + used "
            f"{st.num_used_blocks} = {total} != {s.num_blocks} blocks"
        )
    if st.num_free_blocks != len(s.free_queue):
        yield f"stats say {st.num_free_blocks} free, the queue holds {len(s.free_queue)}"


def _local_identity(s: CacheState, b: int) -> tuple[object, ...]:
    v = s.blocks[b]
    return (v.namespace, v.parent, v.token_ids, v.extra_keys)


def _inv_index(s: CacheState) -> Iterator[str]:
    indexed = Counter(b for _, b in s.index)
    for key, b in s.index:
        if not 0 <= b < s.num_blocks:
            yield f"index entry {key} points outside the pool at {b}"
            continue
        view = s.blocks[b]
        if not view.published:
            yield f"index entry {key} points at block {b}, which is not published (stale)"
        elif view.block_hash != key:
            yield f"index entry {key} points at block {b}, whose hash is {view.block_hash}"
    for b, n in indexed.items():
        if n > 1:
            yield f"block {b} is indexed {n} times"
    seen: dict[tuple[object, ...], int] = {}
    for view in s.blocks:
        if not view.published:
            continue
        if view.block_id not in indexed:
            yield f"published block {view.block_id} is missing from the index"
        if view.token_ids is None or len(view.token_ids) != s.block_size:
            yield f"published block {view.block_id} is not a full block"
        ident = _local_identity(s, view.block_id)
        if ident in seen:
            yield f"blocks {seen[ident]} and {view.block_id} are published with one identity"
        seen[ident] = view.block_id


def _inv_ancestor(s: CacheState) -> Iterator[str]:
    for view in s.blocks:
        if not view.published:
            continue
        if view.parent is None:
            if view.depth != 1:
                yield f"root block {view.block_id} has depth {view.depth}"
            continue
        if not 0 <= view.parent < s.num_blocks:
            yield f"block {view.block_id} has parent {view.parent} outside the pool"
            continue
        parent = s.blocks[view.parent]
        if not parent.published:
            yield f"published block {view.block_id} has unpublished parent {view.parent}"
        elif parent.depth + 1 != view.depth or parent.namespace != view.namespace:
            yield f"block {view.block_id} does not extend its parent {view.parent}"


def _inv_write(s: CacheState) -> Iterator[str]:
    bs = s.block_size
    for seq in s.sequences:
        for j in range(seq.num_computed // bs, len(seq.block_ids)):
            view = s.blocks[seq.block_ids[j]]
            if view.published or view.refcount != 1:
                yield (
                    f"sequence {seq.seq_id!r} will write block {view.block_id} (#{j}), which "
                    f"is not private (published={view.published}, refcount={view.refcount})"
                )
        for b in seq.block_ids:
            view = s.blocks[b]
            if not view.published and view.refcount != 1:
                yield f"private block {b} is shared (refcount {view.refcount})"


def identity_classes(s: CacheState) -> dict[int, int]:
    """Published block -> a number that exactly the published blocks with the same full
    identity share: namespace, tokens and extra keys, and a parent of the same full
    identity, up to the first block.

    A cache that publishes duplicates (``shared``, ``last-wins``) holds several blocks per
    identity, and a block's parent may be any of its parent's copies: which one is a
    rendering choice (the copy a lookup returns, the writer's own), not a safety property.
    A parent outside the pool, unpublished or on a cycle makes its child's identity unique:
    nothing can be the same as a chain that cannot be followed.
    """
    last = _LAST_CLASSES.get("state")
    if last is not None and last[0] is s:  # one snapshot is checked by several invariants
        return last[1]
    classes: dict[int, int] = {}
    interned: dict[tuple[object, ...], int] = {}
    for start in s.blocks:
        chain: list[int] = []
        on_chain: set[int] = set()
        b: int | None = start.block_id
        base: int | None = None  # the class of the block above the chain (None: a root)
        while b is not None and b not in classes:
            if not 0 <= b < s.num_blocks or not s.blocks[b].published or b in on_chain:
                base = -1  # a chain that cannot be followed: its blocks are unique below
                break
            chain.append(b)
            on_chain.add(b)
            b = s.blocks[b].parent
        else:
            base = classes[b] if b is not None else None
        for c in reversed(chain):
            v = s.blocks[c]
            key: tuple[object, ...] = (v.namespace, v.token_ids, v.extra_keys, base)
            if base is not None and base < 0:
                key = ("unique", c)
            base = classes[c] = interned.setdefault(key, len(interned))
    _LAST_CLASSES["state"] = (s, classes)
    return classes


#: The last snapshot :func:`identity_classes` ran on, and its answer (held, so that the
#: snapshot's id is not reused while it is cached).
_LAST_CLASSES: dict[str, tuple[CacheState, dict[int, int]]] = {}


def _same_parent(classes: dict[int, int] | None, parent: int | None, expected: int | None) -> bool:
    """``parent`` is ``expected``, or (``classes`` given) a published block of the same full
    identity."""
    if parent == expected:
        return True
    if classes is None or parent is None or expected is None:
        return False
    have, want = classes.get(parent), classes.get(expected)
    return have is not None and have == want


def wrong_parent(s: CacheState, seq: SeqView, j: int, classes: dict[int, int] | None) -> str | None:
    """INV-PUBLISH's parent part for the published block ``#j`` of ``seq``: a first block has
    no parent, and any other whose predecessor is published has it as its parent (or, with
    ``classes``, a published block of the same full identity). ``None`` when it holds."""
    b = seq.block_ids[j]
    parent = s.blocks[b].parent
    if j == 0:
        return (
            None if parent is None else f"block {b} is the first of {seq.seq_id!r} but has a parent"
        )
    before = seq.block_ids[j - 1]
    if not s.blocks[before].published or _same_parent(classes, parent, before):
        return None
    why = "" if classes is None else f", not a copy of block {before}"
    return f"block {b} (#{j} of {seq.seq_id!r}) has the wrong parent {parent}{why}"


def publish_violations(s: CacheState, *, parents_by_identity: bool = False) -> Iterator[str]:
    """INV-PUBLISH: a published block in a block table holds the sequence's computed tokens,
    in its namespace, under the right parent (``parents_by_identity``: as
    :func:`wrong_parent` says)."""
    bs = s.block_size
    classes = identity_classes(s) if parents_by_identity else None
    for seq in s.sequences:
        for j, b in enumerate(seq.block_ids):
            view = s.blocks[b]
            if not view.published:
                continue
            if (j + 1) * bs > seq.num_computed:
                yield (
                    f"block {b} (#{j} of {seq.seq_id!r}) is published but only "
                    f"{seq.num_computed} tokens are computed"
                )
            if view.token_ids != seq.token_ids[j * bs : (j + 1) * bs]:
                yield f"block {b} (#{j} of {seq.seq_id!r}) is published with other tokens"
            if view.namespace != seq.namespace:
                yield f"block {b} (#{j} of {seq.seq_id!r}) is published in another namespace"
            problem = wrong_parent(s, seq, j, classes)
            if problem is not None:
                yield problem


def _inv_publish(s: CacheState) -> Iterator[str]:
    return publish_violations(s)


def _inv_window(s: CacheState) -> Iterator[str]:
    bs = s.block_size
    for seq in s.sequences:
        if seq.num_cached_tokens % bs or seq.num_computed < seq.num_cached_tokens:
            yield f"sequence {seq.seq_id!r} has a cached prefix of {seq.num_cached_tokens} tokens"
            continue
        first = seq.num_cached_tokens // bs
        for j in range(first, min(first + seq.num_window_blocks, len(seq.block_ids))):
            if j * bs + bs <= seq.num_computed:
                continue  # recomputed and committed: the window did its job for this block
            view = s.blocks[seq.block_ids[j]]
            if view.published or view.refcount != 1:
                yield (
                    f"window block {view.block_id} (#{j} of {seq.seq_id!r}) is not a fresh "
                    f"private block (published={view.published}, refcount={view.refcount})"
                )


def _inv_limit(s: CacheState) -> Iterator[str]:
    bs = s.block_size
    for seq in s.sequences:
        want = -(-seq.num_reserved // bs)
        if len(seq.block_ids) != want:
            yield (
                f"sequence {seq.seq_id!r} reserves {seq.num_reserved} slots in "
                f"{len(seq.block_ids)} blocks, expected {want}"
            )
        if not 0 <= seq.num_computed <= seq.num_reserved:
            yield f"sequence {seq.seq_id!r} computed {seq.num_computed} > {seq.num_reserved}"
        if seq.num_computed > len(seq.token_ids):
            yield f"sequence {seq.seq_id!r} computed KV for unknown tokens"
        prefilling = seq.num_reserved <= seq.num_prompt_tokens
        if prefilling and seq.num_computed < seq.num_prompt_tokens:
            limit = seq.kv_token_limit
            if limit is not None and seq.num_reserved - seq.num_computed > limit:
                yield (
                    f"sequence {seq.seq_id!r} holds {seq.num_reserved - seq.num_computed} "
                    f"uncommitted prompt tokens, over its kv_token_limit of {limit}"
                )
            for start, end in seq.spans:
                if start < seq.num_reserved < end:
                    yield f"sequence {seq.seq_id!r} reserved up to the middle of span {start, end}"


def _inv_match_state(s: CacheState) -> Iterator[str]:
    for seq in s.sequences:
        for start, end in seq.spans:
            if start < seq.num_cached_tokens < end:
                yield (f"sequence {seq.seq_id!r} attached a prefix ending inside span {start, end}")


def _inv_stats(s: CacheState) -> Iterator[str]:
    st = s.stats
    if not 0 <= st.hits <= st.queries:
        yield f"hits {st.hits} outside [0, queries={st.queries}]"
    if st.prefill_tokens_computed + st.prefill_tokens_skipped != st.prefill_tokens:
        yield (
            f"computed {st.prefill_tokens_computed} + skipped {st.prefill_tokens_skipped} "
            f"!= scheduled {st.prefill_tokens}"
        )
    used = sum(v.refcount > 0 for v in s.blocks)
    cached = sum(v.published and v.refcount == 0 for v in s.blocks)
    published = sum(v.published for v in s.blocks)
    if (st.num_used_blocks, st.num_cached_blocks, st.num_published_blocks) != (
        used,
        cached,
        published,
    ):
        yield (
            f"stats count used/cached/published {st.num_used_blocks}/{st.num_cached_blocks}/"
            f"{st.num_published_blocks}, the pool has {used}/{cached}/{published}"
        )
    if st.num_sequences != len(s.sequences):
        yield f"stats count {st.num_sequences} sequences, {len(s.sequences)} are live"
    if st.hits > st.prefill_tokens_skipped or st.evictions < 0:
        yield "hit and skip counters disagree"
    lost = (
        st.lost_window
        + st.lost_span
        + st.lost_cap
        + st.lost_evicted
        + st.lost_never_cached
        + st.lost_checkpoint
    )
    if lost != st.prefill_tokens_computed:
        yield f"the lost-reuse split adds up to {lost}, not {st.prefill_tokens_computed}"


def _inv_ckpt(s: CacheState, *, at_save_point: bool = True) -> Iterator[str]:
    """Checkpoints follow the lifecycle; slots, nodes and owners are one to one.

    * the free slots, the runtime slots and the checkpoint slots partition the pool, and
      each live sequence holds exactly one runtime slot (at most ``num_runtime_slots``);
    * a Reserved checkpoint belongs to one live sequence, at most one per sequence, and
      sits at that sequence's save point (never past its reserved tokens); its safety part
      (``at_save_point=False``): at a block boundary among the sequence's unwritten
      reserved tokens, whose state the coming forward computes over a KV prefix the
      sequence holds;
    * a Ready or Pinned checkpoint hangs off a published node whose boundary it is at, and
      each node has at most one;
    * a Pinned checkpoint is the restore source of a live sequence: that sequence's hit
      ends exactly at the checkpoint's boundary and its block table holds the node (so the
      node is not a leaf, and the checkpoint cannot become stale while pinned);
    * where the cache tracks it, a runtime slot holds nothing while its restore is pending,
      and otherwise a state at most at the sequence's committed tokens.
    """
    h = s.state_slots
    if h is None:
        return
    bs = s.block_size
    total = h.num_runtime_slots + h.state_budget
    seqs = {v.seq_id: v for v in s.sequences}
    yield from _slot_partition(h, seqs, total)
    nodes: Counter[int] = Counter()
    owned: Counter[tuple[object, str]] = Counter()
    for ck in h.checkpoints:
        if ck.boundary <= 0 or ck.boundary % bs:
            yield f"checkpoint {ck.slot} is at {ck.boundary}, not a block boundary"
        elif ck.status == "reserved":
            yield from _reserved_checkpoint(ck, h, seqs, bs, at_save_point, owned)
        elif ck.status not in ("ready", "pinned"):
            yield f"checkpoint {ck.slot} has unknown status {ck.status!r}"
        else:
            yield from _published_checkpoint(ck, s, seqs, nodes, owned)
    for node, n in nodes.items():
        if n > 1:
            yield f"node {node} has {n} checkpoints"
    yield from _runtime_positions(h.runtime_positions, seqs, owned)
    for (owner, status), n in owned.items():
        if n > 1:
            yield f"sequence {owner!r} owns {n} {status} checkpoints"
    st = s.stats
    if (st.num_state_slots, st.num_state_slots_used) != (total, total - len(h.free_slots)):
        yield (
            f"stats count {st.num_state_slots_used}/{st.num_state_slots} state slots used, "
            f"the pool has {total - len(h.free_slots)}/{total}"
        )


def _slot_partition(h: StateSlotsView, seqs: dict[SeqId, SeqView], total: int) -> Iterator[str]:
    """The free, runtime and checkpoint slots partition the pool; one runtime slot per live
    sequence, at most ``num_runtime_slots``."""
    holders: Counter[int] = Counter(h.free_slots)
    holders.update(slot for _, slot in h.runtime)
    holders.update(ck.slot for ck in h.checkpoints)
    for slot, n in holders.items():
        if not 0 <= slot < total:
            yield f"state slot {slot} is outside the pool of {total}"
        elif n > 1:
            yield f"state slot {slot} is held {n} times (free, runtime or checkpoint)"
    if sum(holders.values()) != total:
        yield f"{sum(holders.values())} state slots are accounted for, the pool has {total}"
    runtime = dict(h.runtime)
    if set(runtime) != set(seqs) or len(h.runtime) != len(runtime):
        yield f"runtime slots are held by {sorted(map(str, runtime))}, live: {len(seqs)}"
    if len(runtime) > h.num_runtime_slots:
        yield f"{len(runtime)} runtime slots in use, max_num_seqs is {h.num_runtime_slots}"


def _reserved_checkpoint(
    ck: CheckpointView,
    h: StateSlotsView,
    seqs: dict[SeqId, SeqView],
    bs: int,
    at_save_point: bool,
    owned: Counter[tuple[object, str]],
) -> Iterator[str]:
    """A Reserved checkpoint: one live owner, no node, at the owner's save point (or, for
    safety only, among its unwritten reserved tokens). Counts it in ``owned``."""
    seq = seqs.get(ck.owner) if ck.owner is not None else None
    if seq is None or ck.node is not None:
        yield f"reserved checkpoint {ck.slot} has owner {ck.owner!r} and node {ck.node}"
        return
    owned[(ck.owner, ck.status)] += 1
    if not at_save_point:
        if not seq.num_computed < ck.boundary <= seq.num_reserved:
            yield (
                f"checkpoint {ck.slot} of {ck.owner!r} is reserved at {ck.boundary}, "
                f"outside its unwritten tokens ({seq.num_computed}, {seq.num_reserved}]"
            )
        return
    want = save_point(
        seq.num_computed,
        seq.num_reserved,
        seq.num_prompt_tokens,
        bs,
        h.decode_state_interval,
    )
    if ck.boundary != want:
        yield (
            f"checkpoint {ck.slot} of {ck.owner!r} is reserved at {ck.boundary}, its "
            f"save point is {want}"
        )


def _published_checkpoint(
    ck: CheckpointView,
    s: CacheState,
    seqs: dict[SeqId, SeqView],
    nodes: Counter[int],
    owned: Counter[tuple[object, str]],
) -> Iterator[str]:
    """A Ready or Pinned checkpoint: on a published node at its boundary; a Pinned one is
    the restore source of a live owner that holds the node and whose hit ends there. Counts
    it in ``nodes`` (and a Pinned one in ``owned``)."""
    bs = s.block_size
    if ck.node is None or not 0 <= ck.node < s.num_blocks:
        yield f"{ck.status} checkpoint {ck.slot} has no node"
        return
    nodes[ck.node] += 1
    view = s.blocks[ck.node]
    if not view.published:
        yield f"{ck.status} checkpoint {ck.slot} hangs off block {ck.node}, not published"
    elif view.depth * bs != ck.boundary:
        yield f"checkpoint {ck.slot} at {ck.boundary} is on node {ck.node} (depth {view.depth})"
    if ck.status == "ready":
        if ck.owner is not None:
            yield f"ready checkpoint {ck.slot} has an owner {ck.owner!r}"
        return
    seq = seqs.get(ck.owner) if ck.owner is not None else None
    if seq is None:
        yield f"pinned checkpoint {ck.slot} has no live restore owner ({ck.owner!r})"
        return
    owned[(ck.owner, ck.status)] += 1
    j = ck.boundary // bs - 1
    if seq.num_cached_tokens != ck.boundary:
        yield (
            f"{ck.owner!r} restores checkpoint {ck.slot} at {ck.boundary}, but its hit "
            f"ends at {seq.num_cached_tokens}"
        )
    elif j >= len(seq.block_ids) or seq.block_ids[j] != ck.node:
        yield f"{ck.owner!r} restores checkpoint {ck.slot} but does not hold node {ck.node}"


def _runtime_positions(
    positions: tuple[tuple[SeqId, int | None], ...] | None,
    seqs: dict[SeqId, SeqView],
    owned: Counter[tuple[object, str]],
) -> Iterator[str]:
    """What each runtime slot holds: nothing while the sequence's restore is pending, else
    a state at most at its committed tokens (a state past them would be a draft's)."""
    if positions is None:
        return
    held = dict(positions)
    if set(held) != set(seqs) or len(held) != len(positions):
        yield f"runtime positions are given for {sorted(map(str, held))}, live: {len(seqs)}"
    for seq_id, pos in held.items():
        seq = seqs.get(seq_id)
        if seq is None:
            continue
        pending = owned[(seq_id, "pinned")] > 0
        if pending != (pos is None):
            yield (
                f"the runtime slot of {seq_id!r} holds the state at {pos}, with a restore "
                f"{'pending' if pending else 'not pending'}"
            )
        elif pos is not None and not 0 <= pos <= seq.num_computed:
            yield (
                f"the runtime slot of {seq_id!r} holds the state after {pos} tokens, past its "
                f"{seq.num_computed} committed tokens: a rolled-back draft's state"
            )


def _inv_events(drained: EventMirror, s: CacheState) -> Iterator[str]:
    """The mirror holds exactly the published blocks, and exactly their checkpoints.

    Per hash, the blocks the mirror holds and the published blocks must be equal as
    multisets of identities. Where a removal under a hash shared by different identities
    left the mirror unable to tell which one went (its unresolved removals, see
    :mod:`prefixkv.spec.event_mirror`), the published identities must be among those the
    mirror keeps under the hash, and as many as it holds: identities are compared there
    too, as far as the stream tells them. Each kind of stream bug shows up as one kind of
    difference:

    * a published block the mirror lacks: a removal sent while a copy is still served, or
      a store never sent;
    * a mirrored block no published block matches: a block that left without a removal, or
      a clear that left entries;
    * a count above the published one: a duplicate store (the strict mirror refuses an
      exact duplicate outright).
    """
    mirror = drained.copy()
    try:
        mirror.apply_all(s.pending_events)
    except EventStreamError as exc:
        yield f"the event stream cannot be applied: {exc}"
        return
    if mirror.block_size is not None and mirror.block_size != s.block_size:
        yield f"events carry block size {mirror.block_size}, the cache has {s.block_size}"
    published: dict[int, Counter[MirroredBlock]] = {}
    where: dict[int, int] = {}
    block_of: dict[MirroredBlock, int] = {}
    for b, block in published_blocks(s):
        published.setdefault(block.block_hash, Counter())[block] += 1
        where[block.block_hash] = block_of[block] = b
    for h in sorted(set(published) | set(mirror.blocks)):
        want = published.get(h, Counter())
        have = Counter(mirror.blocks.get(h, ()))
        unresolved = mirror.unresolved.get(h, 0)
        if unresolved:
            held = have.total() - unresolved
            if not want <= have:
                stray = block_of[next(iter(want - have))]
                yield (
                    f"hash {h}: published block {stray} has an identity the mirror does not "
                    f"hold under it ({unresolved} removal(s) of an unknown identity of "
                    f"{have.total()})"
                )
            elif want.total() != held:
                yield (
                    f"hash {h}: {want.total()} published, the mirror holds {held} "
                    f"({unresolved} removal(s) of an unknown identity of {have.total()})"
                )
            continue
        if want == have:
            continue
        if not have:
            yield (
                f"published block {where[h]} (hash {h}) is missing from the mirror: removed "
                "while still served, or never stored"
            )
        elif not want:
            yield f"the mirror holds hash {h}, which no published block has: it left unannounced"
        elif have.total() > want.total():
            yield f"hash {h} is stored {have.total()} times in the mirror, published {want.total()}"
        else:
            yield f"hash {h}: the mirror holds another identity than the published block {where[h]}"
    # Hybrid caches: the blocks that carry a restorable checkpoint, counted per hash.
    carried = published_checkpoints(s)
    for h in sorted(set(carried) | set(mirror.checkpoints)):
        want_ck, have_ck = carried.get(h, 0), mirror.checkpoints.get(h, 0)
        if want_ck != have_ck:
            yield (
                f"hash {h}: {want_ck} published block(s) carry a checkpoint, the mirror says "
                f"{have_ck} (a checkpoint event missing or repeated)"
            )


#: Every snapshot invariant and the generator of its failures, in the order :func:`check`
#: reports them: :data:`INVARIANTS`, then :data:`HYBRID_INVARIANTS`.
_STATE_CHECKS: dict[InvariantId, Callable[[CacheState], Iterator[str]]] = {
    InvariantId.REF: _inv_ref,
    InvariantId.PARTITION: _inv_partition,
    InvariantId.INDEX: _inv_index,
    InvariantId.ANCESTOR: _inv_ancestor,
    InvariantId.WRITE: _inv_write,
    InvariantId.PUBLISH: _inv_publish,
    InvariantId.WINDOW: _inv_window,
    InvariantId.LIMIT: _inv_limit,
    InvariantId.MATCH: _inv_match_state,
    InvariantId.STATS: _inv_stats,
    InvariantId.CKPT: _inv_ckpt,
}
