"""The executable specification of the prefix cache.

Plain data and obvious code; O(num_blocks) per operation is fine here. The optimized
:mod:`prefixkv.impl` must agree with this class step by step, and the Z3 encoding in
:mod:`prefixkv.proofs` is cross-checked against it.

What a call may ask for, and how much an allowed call reserves, is not written here: the
spec and the managers share those rules (:mod:`prefixkv.spec.contract`). This module is the
model: the pool, the index, the walk, eviction and publication.

How the spec keeps its promises, in one place each:

* INV-TXN: every public operation runs inside :meth:`SpecCache._transaction`, which restores
  a copy of the whole state when a :class:`PrefixCacheError` escapes.
* ``can_admit`` / ``can_append`` are exact by construction: they run the real operation on a
  copy and report whether it succeeded.
* Eviction removes only leaves (published, refcount 0, no published child), in the order of
  :meth:`SpecCache._eviction_key`.

NOTE: "obvious" is not "quadratic". The spec runs in lockstep with engines on pools of
realistic size, so each operation is at most linear in the pool, with small constants:

* a block is a frozen record, so copying the state for a transaction copies lists and
  dicts, never the blocks themselves;
* each block counts its published children, so a leaf test is O(1) (it used to compare
  every block's parent chain against every other block's);
* a request's identity chain is built on top of the published identity objects
  (:meth:`SpecCache._chain`), so an index lookup compares one level, not the whole prefix.
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from . import contract
from .errors import DuplicateSequence, InvalidRequest, OutOfBlocks, PrefixCacheError
from .events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from .identity import BlockHasher, BlockIdentity, event_hash, fast_hash
from .multimodal import MultimodalSpan, block_extra_keys, clamp_out_of_spans
from .namespace import Namespace
from .protocol import PrefixCache
from .request import Request, SeqId
from .results import Admission, CacheStats, Match
from .state import BlockView, CacheState, seq_view
from .steps import StepCalls

if TYPE_CHECKING:
    from .checkpoint_store import CheckpointStore

__all__ = ["SpecCache", "chain_hashes", "identity_chain"]

_T = TypeVar("_T")


def identity_chain(
    namespace: bytes,
    token_ids: Sequence[int],
    block_size: int,
    num_blocks: int,
    spans: Sequence[MultimodalSpan] = (),
) -> list[BlockIdentity]:
    """Identities of the first ``num_blocks`` full blocks of a token sequence."""
    chain: list[BlockIdentity] = []
    parent: BlockIdentity | None = None
    for j in range(num_blocks):
        start = j * block_size
        ident = BlockIdentity(
            namespace,
            parent,
            tuple(token_ids[start : start + block_size]),
            block_extra_keys(spans, start, block_size),
        )
        chain.append(ident)
        parent = ident
    return chain


def chain_hashes(hasher: BlockHasher, chain: Sequence[BlockIdentity]) -> list[int]:
    hashes: list[int] = []
    for ident in chain:
        hashes.append(
            hasher(
                hashes[-1] if hashes else None, ident.namespace, ident.token_ids, ident.extra_keys
            )
        )
    return hashes


@attrs.frozen
class _Block:
    """One block of the pool. Frozen: a change replaces the record (:meth:`SpecCache._set`)."""

    refcount: int = 0
    identity: BlockIdentity | None = None  # set iff published
    block_hash: int | None = None
    event_hash: int | None = None  # set iff published while events are recorded
    depth: int = 0
    last_use: int = 0


@attrs.define
class _Seq:
    seq_id: SeqId
    namespace: Namespace
    tokens: tuple[int, ...]  # immutable: a transaction's copy shares it (commit replaces it)
    blocks: list[int]
    num_computed: int
    num_reserved: int
    prompt_len: int
    num_cached: int
    window_blocks: int
    kv_token_limit: int | None
    spans: tuple[MultimodalSpan, ...]

    def copy(self) -> _Seq:
        # The block list is the only mutable part; the rest is immutable.
        return _Seq(
            self.seq_id,
            self.namespace,
            self.tokens,
            list(self.blocks),
            self.num_computed,
            self.num_reserved,
            self.prompt_len,
            self.num_cached,
            self.window_blocks,
            self.kv_token_limit,
            self.spans,
        )


@attrs.define
class _Counters:
    queries: int = 0
    hits: int = 0
    prefill_tokens: int = 0
    prefill_tokens_computed: int = 0
    prefill_tokens_skipped: int = 0
    admissions: int = 0
    evictions: int = 0
    blocks_published: int = 0
    lost_window: int = 0
    lost_span: int = 0
    lost_cap: int = 0
    lost_evicted: int = 0
    lost_never_cached: int = 0
    lost_checkpoint: int = 0


@attrs.define
class _State:
    blocks: list[_Block]
    free: list[int]  # FIFO: allocate from the front, release to the back
    index: dict[BlockIdentity, int]
    seqs: dict[SeqId, _Seq]
    counters: _Counters
    events: list[KVEvent]
    # Evicted identities, oldest first, at most num_blocks of them: only to tell "evicted"
    # from "never cached" in LostReuse. Keyed by identity, not hash: a result never
    # depends on the hasher.
    evicted: dict[BlockIdentity, None]
    clock: int = 0
    # children[b]: how many published blocks have b as their parent. Derived from blocks and
    # index when not given (a state built by hand), then kept up to date by publish and evict.
    children: list[int] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        if len(self.children) != len(self.blocks):
            self.children = [0] * len(self.blocks)
            for blk in self.blocks:
                if blk.identity is not None and blk.identity.parent is not None:
                    self.children[self.index[blk.identity.parent]] += 1

    def __deepcopy__(self, memo: dict[int, object]) -> _State:
        """A copy that shares nothing mutable: O(pool), but list and dict copies only."""
        return _State(
            blocks=list(self.blocks),
            free=list(self.free),
            index=dict(self.index),
            seqs={seq_id: seq.copy() for seq_id, seq in self.seqs.items()},
            counters=attrs.evolve(self.counters),
            events=list(self.events),
            evicted=dict(self.evicted),
            clock=self.clock,
            children=list(self.children),
        )


def _fresh_state(num_blocks: int) -> _State:
    return _State(
        blocks=[_Block() for _ in range(num_blocks)],
        free=list(range(num_blocks)),
        index={},
        seqs={},
        counters=_Counters(),
        events=[],
        evicted={},
    )


class SpecCache(StepCalls, PrefixCache):
    """The reference model of a paged KV prefix cache (see DESIGN choices 1-4, 9, 10, 12).

    ``checkpoints``: a :class:`~prefixkv.spec.checkpoint_store.CheckpointStore` makes this
    the hybrid spec (state slots, checkpoints, routed experts): every operation then calls
    the store's hook for it, inside its transaction (see that module for the hooks).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        hasher: BlockHasher = fast_hash,
        record_events: bool = False,
        checkpoints: CheckpointStore | None = None,
    ) -> None:
        self._num_blocks, self._block_size = contract.check_pool_shape(num_blocks, block_size)
        # Off by default: a queue that nobody drains would grow without bound.
        self._hasher, self._record_events = contract.check_cache_options(hasher, record_events)
        self._s = _fresh_state(self._num_blocks)
        if checkpoints is not None:
            checkpoints.attach(self._block_size)
        self._checkpoints = checkpoints

    # -- shape -----------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    # -- transactions ----------------------------------------------------------------------

    #: True on the throw-away copy that ``can_admit`` and its kind run an operation on.
    _trial = False

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        if self._trial:
            # The trial copy is dropped whatever happens, and no operation it runs catches
            # an error and goes on, so there is nothing to restore: skip the O(pool) copy.
            yield
            return
        # The checkpoint store holds no reference to the cache: it is copied beside it.
        saved = copy.deepcopy((self._s, self._checkpoints))
        try:
            yield
        except PrefixCacheError:
            self._s, self._checkpoints = saved
            raise

    def _would_succeed(self, op: Callable[[SpecCache], object]) -> bool:
        trial = copy.copy(self)
        trial._s, trial._checkpoints = copy.deepcopy((self._s, self._checkpoints))
        trial._trial = True
        try:
            op(trial)
        except OutOfBlocks:
            return False
        return True

    # -- queries ---------------------------------------------------------------------------

    def _seq(self, seq_id: object) -> _Seq:
        return contract.live_seq(self._s.seqs, seq_id)

    def _parent_block(self, b: int) -> int | None:
        ident = self._s.blocks[b].identity
        assert ident is not None
        return None if ident.parent is None else self._s.index[ident.parent]

    def _is_leaf(self, b: int) -> bool:
        """Published, held by no sequence, and the parent of no published block."""
        blk = self._s.blocks[b]
        return blk.identity is not None and blk.refcount == 0 and self._s.children[b] == 0

    def _set(self, b: int, **changes: Any) -> None:
        """Replace block ``b``'s record with one that has ``changes``."""
        old = self._s.blocks[b]
        fields: dict[str, Any] = {
            "refcount": old.refcount,
            "identity": old.identity,
            "block_hash": old.block_hash,
            "event_hash": old.event_hash,
            "depth": old.depth,
            "last_use": old.last_use,
        }
        fields.update(changes)
        self._s.blocks[b] = _Block(**fields)

    def _chain(
        self, namespace: bytes, tokens: Sequence[int], count: int, spans: Sequence[MultimodalSpan]
    ) -> list[BlockIdentity]:
        """:func:`identity_chain`, where each identity that is published is the published
        object itself, so that the next one's parent is too.

        Equal identities compare their parent chains; once both sides hold the same parent
        object the comparison stops there. Without the sharing, each lookup of a fresh chain
        would walk it to the root: quadratic in the prompt's length.
        """
        chain: list[BlockIdentity] = []
        parent: BlockIdentity | None = None
        for j in range(count):
            start = j * self._block_size
            ident = BlockIdentity(
                namespace,
                parent,
                tuple(tokens[start : start + self._block_size]),
                block_extra_keys(spans, start, self._block_size),
            )
            b = self._s.index.get(ident)
            if b is not None:
                published = self._s.blocks[b].identity
                assert published is not None
                ident = published
            chain.append(ident)
            parent = ident
        return chain

    def match(self, req: Request) -> Match:
        """Walk the index, then apply the cap, the span clamp and the recompute window.

        ::

            matched chain  [ b0 ][ b1 ][ b2 ][ b3 ][ b4 ]      (b5 would be the capped one)
            span clamp     [ b0 ][ b1 ][ b2 ][ b3 ]            a span covers b3/b4's cut
            window (k=2)   [ b0 ][ b1 ]{ b2 }{ b3 }            recomputed privately
            attached       [ b0 ][ b1 ]                        -> num_cached_tokens = 2 * bs
        """
        if not isinstance(req, Request):
            raise InvalidRequest(f"expected a Request, got {type(req).__name__}")
        bs, tokens, n = self._block_size, req.token_ids, req.num_tokens
        cap = contract.full_prompt_cap(n, bs)  # choice 4: at least one prompt token is computed
        full = n // bs
        chain = self._chain(req.namespace.key(), tokens, full, req.spans)
        matched: list[int] = []
        capped = False
        for j, ident in enumerate(chain):
            b = self._s.index.get(ident)
            if b is None:
                break
            if j >= cap:
                capped = True
                break
            matched.append(b)
        m = len(matched)
        k1 = clamp_out_of_spans(m, req.spans, bs)  # choice 5
        window = min(req.recompute_blocks, k1)  # choice 6
        attached = clamp_out_of_spans(k1 - window, req.spans, bs)
        evicted = 0
        if not capped and self._s.evicted:
            for ident in chain[m:cap]:
                if ident not in self._s.evicted:
                    break
                evicted += 1
        lost = contract.lost_reuse(n, bs, m, window, attached, capped, evicted)
        found = Match(n, attached * bs, tuple(matched[:attached]), lost, window)
        if self._checkpoints is not None:
            return self._checkpoints.on_match(req, found)
        return found

    def _published_nodes(self, seq: _Seq, stop: int) -> list[int | None]:
        """The published block with the identity of each of ``seq``'s first ``stop``
        blocks (its own, or the twin published first), or None where there is none."""
        chain = self._chain(seq.namespace.key(), seq.tokens, stop, seq.spans)
        return [self._s.index.get(ident) for ident in chain]

    def _event_hash(self, b: int) -> int | None:
        """The event hash of the published block ``b`` (None unless events are recorded)."""
        return self._s.blocks[b].event_hash

    def block_table(self, seq_id: SeqId) -> tuple[int, ...]:
        return tuple(self._seq(seq_id).blocks)

    def num_computed_tokens(self, seq_id: SeqId) -> int:
        return self._seq(seq_id).num_computed

    def seq_ids(self) -> tuple[SeqId, ...]:
        return tuple(self._s.seqs)

    def stats(self) -> CacheStats:
        blocks = self._s.blocks
        c = self._s.counters
        stats = CacheStats(
            num_blocks=self._num_blocks,
            block_size=self._block_size,
            num_free_blocks=len(self._s.free),
            num_cached_blocks=sum(b.identity is not None and b.refcount == 0 for b in blocks),
            num_used_blocks=sum(b.refcount > 0 for b in blocks),
            num_published_blocks=sum(b.identity is not None for b in blocks),
            num_sequences=len(self._s.seqs),
            **attrs.asdict(c),
        )
        return stats if self._checkpoints is None else self._checkpoints.with_stats(stats)

    @property
    def record_events(self) -> bool:
        return self._record_events

    def _emit(self, event: KVEvent) -> None:
        if self._record_events:
            self._s.events.append(event)

    def take_events(self) -> list[KVEvent]:
        """Drain queued KV events; always empty unless built with ``record_events=True``."""
        events, self._s.events = self._s.events, []
        return events

    # -- eviction and allocation -----------------------------------------------------------

    def _eviction_key(self, b: int) -> tuple[int, int, int]:
        """Choice 3's order: least recently used first, then deeper first, then lower id."""
        blk = self._s.blocks[b]
        return (blk.last_use, -blk.depth, b)

    def _evict(self, count: int) -> int:
        """Evict up to ``count`` leaves, one at a time, each the first leaf in eviction order
        at the time. Returns how many were evicted.

        The leaves are gathered once and kept in a heap: evicting a leaf changes no other
        block's age, and can turn only its own parent into a leaf.
        """
        heap = [self._eviction_key(b) for b in range(self._num_blocks) if self._is_leaf(b)]
        heapq.heapify(heap)
        evicted = 0
        while evicted < count and heap:
            victim = heapq.heappop(heap)[-1]
            parent = self._parent_block(victim)
            self._remove(victim)
            evicted += 1
            if parent is not None and self._is_leaf(parent):
                heapq.heappush(heap, self._eviction_key(parent))
        return evicted

    def _remove(self, victim: int) -> None:
        """Unpublish the leaf ``victim`` and return it to the free queue."""
        blk = self._s.blocks[victim]
        assert blk.identity is not None and blk.block_hash is not None
        parent = self._parent_block(victim)
        if parent is not None:
            self._s.children[parent] -= 1
        del self._s.index[blk.identity]
        self._s.evicted.pop(blk.identity, None)
        self._s.evicted[blk.identity] = None
        if len(self._s.evicted) > self._num_blocks:
            del self._s.evicted[next(iter(self._s.evicted))]
        if self._record_events:
            assert blk.event_hash is not None
            self._s.events.append(BlockRemoved((blk.event_hash,)))
        self._s.blocks[victim] = _Block()
        self._s.free.append(victim)
        self._s.counters.evictions += 1
        if self._checkpoints is not None:
            self._checkpoints.on_evict(victim, self._emit)

    def _allocate(self, count: int) -> tuple[list[int], int]:
        """Take ``count`` free blocks, evicting leaves first if the free queue is short."""
        short = count - len(self._s.free)
        evicted = self._evict(short) if short > 0 else 0
        if len(self._s.free) < count:
            raise contract.out_of_blocks(count, len(self._s.free))
        taken, self._s.free = self._s.free[:count], self._s.free[count:]
        for b in taken:
            self._set(b, refcount=1)
        return taken, evicted

    def _release(self, seq: _Seq, blocks: Sequence[int]) -> None:
        """Drop ``seq``'s hold on ``blocks``, tail first, so deeper blocks age first."""
        for b in reversed(blocks):
            blk = self._s.blocks[b]
            refcount = blk.refcount - 1
            if refcount != 0:
                self._set(b, refcount=refcount)
            elif blk.identity is None:
                self._set(b, refcount=0)
                self._s.free.append(b)
            else:
                self._set(b, refcount=0, last_use=self._s.clock)

    # -- admission -------------------------------------------------------------------------

    def can_admit(self, req: Request, num_new_tokens: int | None = None) -> bool:
        return self._would_succeed(lambda c: c.admit(req, num_new_tokens))

    def admit(self, req: Request, num_new_tokens: int | None = None) -> Admission:
        with self._transaction():
            m = self.match(req)
            if num_new_tokens is not None:
                contract.check_count(num_new_tokens, "num_new_tokens", minimum=1)
            if req.seq_id in self._s.seqs:
                raise DuplicateSequence(f"sequence {req.seq_id!r} is already live")
            cached = m.num_cached_tokens
            end = contract.chunk_end(
                cached, req.num_tokens, num_new_tokens, req.kv_token_limit, req.spans
            )
            seq = _Seq(
                seq_id=req.seq_id,
                namespace=req.namespace,
                tokens=req.token_ids,
                blocks=[],
                num_computed=cached,
                num_reserved=end,
                prompt_len=req.num_tokens,
                num_cached=cached,
                window_blocks=m.num_window_blocks,
                kv_token_limit=req.kv_token_limit,
                spans=req.spans,
            )
            for b in m.block_ids:  # pin the hit before evicting anything
                self._set(b, refcount=self._s.blocks[b].refcount + 1)
                seq.blocks.append(b)
            need = contract.blocks_for(seq.num_reserved, self._block_size) - len(seq.blocks)
            new, evicted = self._allocate(need)
            seq.blocks.extend(new)
            self._s.seqs[req.seq_id] = seq
            contract.count_admission(self._s.counters, req.num_tokens, cached, m.lost)
            adm = Admission(
                seq_id=req.seq_id,
                num_cached_tokens=cached,
                num_scheduled_tokens=end - cached,
                block_ids=tuple(seq.blocks),
                num_new_blocks=len(new),
                num_evicted=evicted,
                lost=m.lost,
                num_window_blocks=m.num_window_blocks,
            )
            if self._checkpoints is not None:
                return self._checkpoints.on_admit(seq, m, adm, self._emit)
            return adm

    def can_continue_prefill(self, seq_id: SeqId, num_new_tokens: int | None = None) -> bool:
        return self._would_succeed(lambda c: c.continue_prefill(seq_id, num_new_tokens))

    def continue_prefill(self, seq_id: SeqId, num_new_tokens: int | None = None) -> int:
        """Reserve the next prefill chunk of a sequence whose last chunk is committed.

        The chunk is sized like the first one (:func:`~.contract.chunk_end`): at most
        ``num_new_tokens`` and ``kv_token_limit`` tokens, never splitting a span. Returns the
        number of tokens scheduled. If the blocks cannot be had, it raises ``OutOfBlocks``
        and the committed prefix stays exactly as it was.
        """
        with self._transaction():
            seq = self._seq(seq_id)
            contract.check_continue(
                seq.seq_id, num_new_tokens, seq.num_computed, seq.num_reserved, seq.prompt_len
            )
            start = seq.num_reserved
            end = contract.chunk_end(
                start, seq.prompt_len, num_new_tokens, seq.kv_token_limit, seq.spans
            )
            need = contract.blocks_for(end, self._block_size) - len(seq.blocks)
            new, _ = self._allocate(need)
            seq.blocks.extend(new)
            seq.num_reserved = end
            if self._checkpoints is not None:
                self._checkpoints.on_reserve(seq, self._emit)
            return end - start

    # -- growth, commit, rollback ----------------------------------------------------------

    def can_append(self, seq_id: SeqId, num_tokens: int) -> bool:
        return self._would_succeed(lambda c: c.append(seq_id, num_tokens))

    def append(self, seq_id: SeqId, num_tokens: int) -> list[int]:
        with self._transaction():
            seq = self._seq(seq_id)
            reserved = contract.check_append(
                seq.seq_id,
                num_tokens,
                seq.num_reserved,
                seq.num_computed,
                seq.prompt_len,
                seq.kv_token_limit,
                seq.spans,
            )
            need = contract.blocks_for(reserved, self._block_size) - len(seq.blocks)
            new, _ = self._allocate(need)
            seq.blocks.extend(new)
            seq.num_reserved = reserved
            if self._checkpoints is not None:
                self._checkpoints.on_reserve(seq, self._emit)
            return new

    def commit(self, seq_id: SeqId, num_computed: int, accepted_tokens: Sequence[int] = ()) -> None:
        with self._transaction():
            seq = self._seq(seq_id)
            accepted, new_computed = contract.check_commit(
                seq.seq_id,
                seq.num_computed,
                seq.num_reserved,
                len(seq.tokens),
                num_computed,
                accepted_tokens,
            )
            first = seq.num_computed // self._block_size
            seq.tokens += tuple(accepted)
            seq.num_computed = new_computed
            stop = new_computed // self._block_size
            self._publish(seq, first, stop)
            if self._checkpoints is not None:
                nodes = self._published_nodes(seq, stop)
                self._checkpoints.on_commit(seq, nodes, self._event_hash, self._emit)

    def _publish(self, seq: _Seq, first: int, stop: int) -> None:
        """Choice 1: publish full, committed blocks ``first..stop-1`` of ``seq``.

        A block whose identity is already published stays private (choice 2: no block is
        swapped under a sequence). So does a block whose parent identity is no longer
        published (possible only after a private duplicate's twin was evicted), since
        publishing it would break INV-ANCESTOR.
        """
        bs = self._block_size
        chain = self._chain(seq.namespace.key(), seq.tokens, stop, seq.spans)
        for j in range(first, stop):
            ident = chain[j]
            if ident in self._s.index:
                continue
            parent_block = None if ident.parent is None else self._s.index.get(ident.parent)
            if ident.parent is not None and parent_block is None:
                continue
            parent = None if parent_block is None else self._s.blocks[parent_block]
            b = seq.blocks[j]
            block_hash = self._hasher(
                None if parent is None else parent.block_hash,
                ident.namespace,
                ident.token_ids,
                ident.extra_keys,
            )
            # The events carry the event hash, whatever the index hash (see .identity);
            # it is computed only while they are recorded.
            parent_event = None if parent is None else parent.event_hash
            h = None
            if self._record_events:
                h = event_hash(parent_event, ident.namespace, ident.token_ids, ident.extra_keys)
            self._set(b, identity=ident, block_hash=block_hash, event_hash=h, depth=j + 1)
            if parent_block is not None:
                self._s.children[parent_block] += 1
            self._s.index[ident] = b
            self._s.counters.blocks_published += 1
            if h is not None:
                self._s.events.append(
                    BlockStored(
                        block_hashes=(h,),
                        parent_block_hash=parent_event,
                        token_ids=ident.token_ids,
                        block_size=bs,
                        model=seq.namespace.model,
                        adapter=seq.namespace.adapter,
                        salt=seq.namespace.salt,
                        extra_keys=(ident.extra_keys,),
                    )
                )

    def rollback(self, seq_id: SeqId, num_tokens: int) -> None:
        with self._transaction():
            seq = self._seq(seq_id)
            seq.num_reserved = contract.check_rollback(
                seq.seq_id, num_tokens, seq.num_reserved, seq.num_computed, seq.spans
            )
            keep = contract.blocks_for(seq.num_reserved, self._block_size)
            dropped, seq.blocks = seq.blocks[keep:], seq.blocks[:keep]
            self._release(seq, dropped)
            if self._checkpoints is not None:
                self._checkpoints.on_reserve(seq, self._emit)

    # -- release ---------------------------------------------------------------------------

    def free(self, seq_ids: Iterable[SeqId]) -> None:
        with self._transaction():
            ids = contract.check_free_list(seq_ids, self._s.seqs)
            self._s.clock += 1
            for seq_id in ids:
                seq = self._s.seqs.pop(seq_id)
                self._release(seq, seq.blocks)
                if self._checkpoints is not None:
                    self._checkpoints.on_free(seq_id)

    def evict(self, num_blocks: int) -> int:
        with self._transaction():
            contract.check_count(num_blocks, "num_blocks", minimum=0)
            return self._evict(num_blocks)

    def reset(self, *, preserve_cache: bool) -> None:
        with self._transaction():
            if contract.check_reset(preserve_cache, len(self._s.seqs)):
                if self._s.seqs:
                    self.free(list(self._s.seqs))
                return
            fresh = _fresh_state(self._num_blocks)
            fresh.counters = self._s.counters
            fresh.events = self._s.events
            fresh.clock = self._s.clock
            self._s = fresh
            self._emit(AllBlocksCleared())
            if self._checkpoints is not None:
                self._checkpoints.on_reset()

    # -- inspection ------------------------------------------------------------------------

    def snapshot(self) -> CacheState:
        views = []
        for b, blk in enumerate(self._s.blocks):
            ident = blk.identity
            if ident is None:
                views.append(BlockView(b, blk.refcount, False))
                continue
            views.append(
                BlockView(
                    block_id=b,
                    refcount=blk.refcount,
                    published=True,
                    namespace=ident.namespace,
                    parent=self._parent_block(b),
                    token_ids=ident.token_ids,
                    extra_keys=ident.extra_keys,
                    block_hash=blk.block_hash,
                    event_hash=blk.event_hash,
                    depth=blk.depth,
                    # Only an evictable block's age is observable (it orders eviction).
                    last_use=blk.last_use if blk.refcount == 0 else 0,
                )
            )
        index = []
        for ident, b in self._s.index.items():
            h = self._s.blocks[b].block_hash
            assert h is not None, f"index entry {ident!r} points at unpublished block {b}"
            index.append((h, b))
        seqs = tuple(seq_view(s, s.namespace.key()) for s in self._s.seqs.values())
        snap = CacheState(
            num_blocks=self._num_blocks,
            block_size=self._block_size,
            blocks=tuple(views),
            free_queue=tuple(self._s.free),
            index=tuple(sorted(index)),
            sequences=seqs,
            stats=self.stats(),
            pending_events=tuple(self._s.events),
        )
        return snap if self._checkpoints is None else self._checkpoints.with_snapshot(snap)
