"""The optimized prefix cache manager.

Same public contract and the same observable behaviour as
:class:`prefixkv.spec.cache.SpecCache`, step for step (the differential state machines hold
it to that), at O(1) or O(blocks touched) per operation, independent of the pool size.

The parts, in the shape of vLLM v1's ``block_pool`` / ``kv_cache_manager`` split, each owning
its own fields (a test checks that no impl module reaches into another's private ones):

* :mod:`._pool` (``BlockPool``): per-block metadata in flat arrays and one token buffer,
  refcounts, the free queue (a lazy range plus a deque: construction and a full reset touch
  no block that was never published), anchoring, pinning, release and the eviction order
  (a heap of leaves with lazy deletion, :mod:`._leaves`).
* :mod:`._index` (``HashIndex``): index key -> block, every candidate verified exactly.
* :mod:`._keys` (``ChainKeys``): how blocks are keyed, a prompt's keys in one pass.
* :mod:`._walk` (``PrefixWalk``): the longest cached prefix of a prompt, each hit verified
  exactly against the pool's stored identities.
* :mod:`._record` (``EvictionRecord``): evicted identities and the serials naming them.
* :mod:`._publication` (``Publisher``): a sequence's full committed blocks become cached
  identities (choice 1), duplicates and orphans staying private.
* this module: the semantic core (requests, admission planning, transactions, events and
  statistics (:mod:`._stats`), every call checked by the contract, then applied);
  :mod:`._sequence` holds a live sequence.
* :mod:`._fused` (``FusedSteps``): ``advance``, ``advance_batch``, ``advance_columns`` and
  the commit fast path, an optimization of :mod:`prefixkv.spec.steps` in front of the core.
* :mod:`prefixkv.spec.contract`: every precondition and sizing rule, shared with the spec
  (so the two can only differ in their transitions, which the machines compare).

How it stays cheap without giving anything up:

* A request carries its prompt once, as native uint32 bytes. The walk computes every full
  block's index key in one pass of C-level iterators (``ChainKeys.prompt_keys``), looks
  them all up, and verifies the candidates exactly with one comparison per run of
  consecutive block ids (``PrefixWalk.verified``): no Python-level step per prompt block.
  The admitted sequence keeps the keys, so publishing its prompt blocks hashes nothing
  again, and a decode block hashes only itself.
* ``can_admit`` is exact in O(blocks matched) thanks to *anchoring*:

  A published block is **anchored** when a sequence holds it or one of its published
  children is anchored. An unanchored block has refcount 0 and so has its whole subtree, so
  leaf-by-leaf eviction can reclaim all of it; an anchored block can never be evicted while
  things stay as they are. The manager keeps ``anchored_children`` per block and the count
  of unanchored published blocks (``BlockPool.num_reclaimable``). Then

      admit succeeds  <=>  new blocks needed <= free + reclaimable - (matched unanchored)

  because pinning a hit anchors exactly the matched blocks that were unanchored.

  NOTE: anchoring is not the same as "refcount > 0 somewhere below". A sequence whose block
  is a private duplicate publishes its next block under the *canonical* twin, which it does
  not hold; the canonical is then evictable-looking (refcount 0) yet pinned by its child.
  Counting only refcounts would make ``can_admit`` promise blocks eviction cannot deliver.
  Propagation walks up only through blocks whose anchored state flips, so it costs O(1)
  per block in the common root-to-leaf attach order.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from itertools import repeat
from operator import getitem
from typing import TYPE_CHECKING, NamedTuple

from prefixkv.spec.contract import (
    blocks_for,
    check_append,
    check_cache_options,
    check_commit,
    check_continue,
    check_count,
    check_free_list,
    check_growth,
    check_pool_shape,
    check_reset,
    check_rollback,
    chunk_end,
    count_admission,
    full_prompt_cap,
    live_seq,
    lost_reuse,
    out_of_blocks,
)
from prefixkv.spec.errors import DuplicateSequence, OutOfBlocks
from prefixkv.spec.events import AllBlocksCleared, BlockRemoved, KVEvent
from prefixkv.spec.identity import BlockHasher, fast_hash
from prefixkv.spec.multimodal import clamp_out_of_spans
from prefixkv.spec.protocol import PrefixCache
from prefixkv.spec.request import Request, SeqId
from prefixkv.spec.results import Admission, CacheStats, LostReuse, Match
from prefixkv.spec.state import BlockView, CacheState, seq_view

from prefixkv.errors import InvalidConfig, require_int

from ._fused import FusedSteps
from ._host import host_memory
from ._index import HashIndex
from ._keys import ChainKeys
from ._leaves import COMPACT_SLACK
from ._pool import NO_PARENT, BlockPool
from ._publication import Publisher
from ._record import EvictionRecord
from ._sequence import SeqState
from ._stats import Counters
from ._walk import PrefixWalk

if TYPE_CHECKING:
    from ._checkpoints import CheckpointStore

__all__ = ["PrefixCacheManager"]


class Matched(NamedTuple):
    """A full match: the blocks to attach and what the admission must account for."""

    blocks: list[int]
    hashes: list[int]
    #: How many of ``blocks`` are unanchored (pinning them costs eviction supply).
    num_unanchored: int
    window: int
    lost: LostReuse
    #: The index keys of the prompt's full blocks (every one, matched or not), computed by
    #: the walk: the admission hands them to the sequence, so that publishing its prompt
    #: blocks hashes nothing again.
    keys: list[int]


class AdmitPlan(NamedTuple):
    """A checked admission, ready to apply."""

    blocks: list[int]
    hashes: list[int]
    #: The reserved end (tokens) and the number of new blocks it needs.
    end: int
    need: int
    window: int
    lost: LostReuse
    #: The prompt's index keys (:attr:`Matched.keys`).
    keys: list[int]


def _allocate_pool(
    num_blocks: int, block_size: int, wire_hashes: bool, heap_slack: int = COMPACT_SLACK
) -> BlockPool:
    """The block pool, or ``InvalidConfig`` when the shape (within the contract's bounds)
    needs more memory than this host has.

    NOTE: the pool is allocated up front and zero-filled, so a pool larger than physical
    memory is refused by its size before anything is allocated: on an overcommitting host
    the allocation itself would not fail, the kernel would kill the process instead.
    """
    need = BlockPool.nbytes(num_blocks, block_size, wire_hashes=wire_hashes)
    have = host_memory()
    too_big = InvalidConfig(
        f"a pool of {num_blocks} blocks x {block_size} tokens needs {need / 2**30:.1f} GiB "
        "up front, more than this host can allocate"
        + ("" if have is None else f" ({have / 2**30:.1f} GiB of memory)")
        + ": give fewer blocks or smaller ones"
    )
    if have is not None and need > have:
        raise too_big
    try:
        return BlockPool(num_blocks, block_size, wire_hashes=wire_hashes, heap_slack=heap_slack)
    except MemoryError:
        raise too_big from None


class _ManagerCore(PrefixCache):
    """The manager's semantic core: every call checked by the contract, then applied.

    Not a cache on its own: :class:`PrefixCacheManager` puts the fused steps
    (:class:`._fused.FusedSteps`: ``advance``, ``advance_batch``, ``advance_columns`` and the
    commit fast path) in front of it.

    ``checkpoints``: a :class:`~prefixkv.impl._checkpoints.CheckpointStore` makes the
    manager a hybrid cache (state slots, checkpoints, routed experts): the operations call
    its hooks (listed in that module), and the fused paths are off (``_fused_inline``).
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        hasher: BlockHasher = fast_hash,
        record_events: bool = False,
        checkpoints: CheckpointStore | None = None,
        heap_slack: int = COMPACT_SLACK,
    ) -> None:
        """Build an empty cache.

        Args:
            num_blocks: the pool's blocks.
            block_size: tokens per block.
            hasher: the block hasher (see :mod:`prefixkv.spec.identity`).
            record_events: whether to queue KV events.
            checkpoints: a checkpoint store (the hybrid manager's; None: a KV-only cache).
            heap_slack: a test knob: the stale entries the eviction heap tolerates beyond
                twice the cached blocks before it is rebuilt, an int >= ``-num_blocks``
                (``InvalidConfig`` otherwise). The default suits any pool; the conformance
                machines pass a negative one so that small pools rebuild it often.
        """
        self._num_blocks, self._block_size = check_pool_shape(num_blocks, block_size)
        heap_slack = require_int(heap_slack, "heap_slack", minimum=-self._num_blocks)
        # NOTE: off by default, as in the engines: a queue nobody drains is a memory leak.
        hasher, self._record_events = check_cache_options(hasher, record_events)
        # NOTE: with the default hasher the index files blocks under a *keyed* chain hash
        # (see ._keys); snapshots carry the identity hash, derived on demand. Events carry
        # the event hash (prefixkv.spec.identity.event_hash), whatever the hasher: kept per
        # block while events are recorded, and computed only then.
        self._keys = ChainKeys(self._block_size, hasher)
        wire_hashes = self._record_events
        self._pool = _allocate_pool(self._num_blocks, self._block_size, wire_hashes, heap_slack)
        self._index = HashIndex()
        self._seqs: dict[SeqId, SeqState] = {}
        self._events: list[KVEvent] = []
        self._clock = 0
        self._counters = Counters()
        # Evicted identities, at most num_blocks of them: only to tell "evicted" from
        # "never cached" in LostReuse (see ._record).
        self._record = EvictionRecord(self._num_blocks, self._pool.block_nbytes)
        self._walk = PrefixWalk(self._pool, self._index, self._keys)
        self._publisher = Publisher(self._pool, self._index, self._keys, self._record)
        if checkpoints is not None:
            checkpoints.attach(self._block_size, self._pool, self._publisher)
        #: What hangs off nodes and sequences besides their KV (None: nothing; module doc of
        #: ._checkpoints for the hooks it is called through).
        self._checkpoints = checkpoints
        #: NOTE: the fused paths (``advance``, ``advance_batch``'s steps, a commit within a
        #: block) apply a step's parts inline, calling no hook. With a checkpoint store every
        #: part must reach its hook, so they are off: ``advance`` then checks every part as
        #: usual and runs the public calls in turn (``FusedSteps._advance_general``).
        self._fused_inline = checkpoints is None

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def hasher(self) -> BlockHasher:
        return self._keys.hasher

    # -- lookups ---------------------------------------------------------------------------

    def _seq(self, seq_id: object) -> SeqState:
        # A plain int or str id skips check_seq_id (same verdicts, no call); any other
        # object, and an id that is not live, gets the contract's check and error.
        seq = self._seqs.get(seq_id) if type(seq_id) is int or type(seq_id) is str else None
        return seq if seq is not None else live_seq(self._seqs, seq_id)

    def _match(self, req: Request) -> Matched:
        """The full match: walk, cap, span clamp, window, lost-reuse split (see the spec)."""
        blocks, hashes, first_unanchored, capped, keys = self._walk.lookup(req)
        bs, n, spans = self._block_size, req.num_tokens, req.spans
        m = len(blocks)
        k1 = clamp_out_of_spans(m, spans, bs) if spans else m
        window = min(req.recompute_blocks, k1)
        attached = k1 - window
        if spans:
            attached = clamp_out_of_spans(attached, spans, bs)
        evicted = 0
        if not capped and self._record:
            # The chain's name so far: the last matched block's serial, or the namespace.
            name: int | bytes = (
                self._pool.serial[blocks[-1]]
                if blocks
                else self._keys.namespace_key(req.namespace)[0]
            )
            evicted = self._record.evicted_run(
                name, req.token_bytes, spans, bs, m, full_prompt_cap(n, bs)
            )
        lost = lost_reuse(n, bs, m, window, attached, capped, evicted)
        if attached < m:
            del blocks[attached:]
            del hashes[attached:]
        found = Matched(blocks, hashes, max(0, attached - first_unanchored), window, lost, keys)
        if self._checkpoints is not None:
            return self._checkpoints.on_lookup(req, found)
        return found

    def match(self, req: Request) -> Match:
        blocks, _, _, window, lost, _ = self._match(req)
        m = Match(req.num_tokens, len(blocks) * self._block_size, tuple(blocks), lost, window)
        return m if self._checkpoints is None else self._checkpoints.on_match(m)

    def block_table(self, seq_id: SeqId) -> tuple[int, ...]:
        return tuple(self._seq(seq_id).blocks)

    def num_computed_tokens(self, seq_id: SeqId) -> int:
        return self._seq(seq_id).num_computed

    def seq_ids(self) -> tuple[SeqId, ...]:
        return tuple(self._seqs)

    def stats(self) -> CacheStats:
        stats = CacheStats(
            num_blocks=self._num_blocks,
            block_size=self._block_size,
            num_free_blocks=self._pool.num_free,
            num_cached_blocks=self._pool.num_cached,
            num_used_blocks=self._pool.num_used,
            num_published_blocks=self._pool.num_published,
            num_sequences=len(self._seqs),
            **self._counters.as_dict(),
        )
        return stats if self._checkpoints is None else self._checkpoints.with_stats(stats)

    @property
    def record_events(self) -> bool:
        return self._record_events

    def take_events(self) -> list[KVEvent]:
        """Drain queued KV events; always empty unless built with ``record_events=True``."""
        events, self._events = self._events, []
        return events

    def _event_queue(self) -> list[KVEvent] | None:
        """Where a hook queues its events: the manager's queue while it records them."""
        return self._events if self._record_events else None

    # -- eviction, allocation, release -----------------------------------------------------

    def _evict(self, count: int) -> int:
        """Evict up to ``count`` leaves in eviction order; returns how many were evicted.

        NOTE: the victims go as one batch through each part, one call per part (the pool
        pops them, the index drops them, the record remembers them, the pool forgets them),
        not several calls per victim: with a full pool every allocation evicts, so this is
        on the decode path, where a single victim is the common case. Events and the evict
        hook take a step per victim, and only when they are on.
        """
        pool = self._pool
        victims = pool.pop_leaves(count)
        if len(victims) == 1:
            b = victims[0]
            self._index.remove(pool.key[b], b)
        elif victims:
            self._index.remove_all(list(map(getitem, repeat(pool.key), victims)), victims)
        else:
            return 0
        self._record.remember(pool, victims)
        store = self._checkpoints
        if self._record_events or store is not None:
            wire = pool.event_hash  # the event hashes (kept while events are recorded)
            events = self._events if self._record_events else None
            for b in victims:
                if events is not None:
                    events.append(BlockRemoved((wire[b],)))
                if store is not None:
                    # NOTE: per victim, right after its BlockRemoved: a hybrid cache's
                    # checkpoint removal must follow its own block's removal, as the spec
                    # emits them.
                    store.on_evict(b, events)
        pool.forget(victims)
        self._counters.evictions += len(victims)
        return len(victims)

    def _allocate(self, count: int) -> tuple[list[int], int]:
        """Take ``count`` blocks, evicting leaves first if needed. Supply was checked."""
        pool = self._pool
        evicted = 0
        short = count - pool.num_free
        if short > 0:
            evicted = self._evict(short)
            if evicted != short:  # pragma: no cover - guarded by the exact capacity check
                raise AssertionError("eviction ran dry after the capacity check passed")
            pool.maybe_compact()
        return pool.allocate(count), evicted

    def _out_of_blocks(self, need: int, supply: int) -> OutOfBlocks:
        return out_of_blocks(need, supply)

    def _release(self, blocks: Sequence[int]) -> None:
        """Drop one hold on each of ``blocks`` (the pool ages them by the manager's clock)."""
        self._pool.release(blocks, self._clock)

    # -- admission -------------------------------------------------------------------------

    def _plan(self, req: Request, num_new_tokens: int | None) -> AdmitPlan:
        """Validate and size an admission; raises what ``admit`` would raise."""
        blocks, hashes, unanchored, window, lost, keys = self._match(req)
        if num_new_tokens is not None:
            check_count(num_new_tokens, "num_new_tokens", minimum=1)
        if req.seq_id in self._seqs:
            raise DuplicateSequence(f"sequence {req.seq_id!r} is already live")
        bs = self._block_size
        cached = len(blocks) * bs
        if num_new_tokens is None and req.kv_token_limit is None:
            end = req.num_tokens  # the common case: the whole prompt, no span can be cut
        else:
            end = chunk_end(cached, req.num_tokens, num_new_tokens, req.kv_token_limit, req.spans)
        need = -(-end // bs) - len(blocks)
        supply = self._pool.supply - unanchored
        if need > supply:
            raise self._out_of_blocks(need, supply)
        if self._checkpoints is not None:
            self._checkpoints.check_supply(len(self._seqs), bool(blocks))
        return AdmitPlan(blocks, hashes, end, need, window, lost, keys)

    def can_admit(self, req: Request, num_new_tokens: int | None = None) -> bool:
        try:
            self._plan(req, num_new_tokens)
        except OutOfBlocks:
            return False
        return True

    def admit(self, req: Request, num_new_tokens: int | None = None) -> Admission:
        blocks, hashes, end, need, window, lost, keys = self._plan(req, num_new_tokens)
        self._pool.pin(blocks)  # pin the hit, root first, before evicting anything
        cached = len(blocks) * self._block_size
        new, evicted = self._allocate(need)
        num_matched = len(blocks)
        blocks.extend(new)
        token_array = array("I")
        token_array.frombytes(req.token_bytes)
        ns, nsd, seed = self._keys.namespace_key(req.namespace)
        pool = self._pool
        seq = self._seqs[req.seq_id] = SeqState(
            seq_id=req.seq_id,
            namespace=ns,
            ns_digest=nsd,
            seed=seed,
            adapter=req.namespace.adapter,
            tokens=token_array,
            blocks=blocks,
            hashes=hashes,
            wire=[pool.event_hash[b] for b in blocks[:num_matched]] if pool.wire_hashes else [],
            num_computed=cached,
            num_reserved=end,
            num_cached=cached,
            window_blocks=window,
            kv_token_limit=req.kv_token_limit,
            spans=req.spans,
        )
        seq.prompt_keys = keys
        count_admission(self._counters, req.num_tokens, cached, lost)
        adm = Admission(
            seq_id=req.seq_id,
            num_cached_tokens=cached,
            num_scheduled_tokens=end - cached,
            block_ids=tuple(blocks),
            num_new_blocks=len(blocks) - num_matched,
            num_evicted=evicted,
            lost=lost,
            num_window_blocks=window,
        )
        if self._checkpoints is not None:
            return self._checkpoints.on_admit(seq, adm, self._event_queue())
        return adm

    def _chunk_plan(self, seq: SeqState, num_new_tokens: int | None) -> tuple[int, int]:
        """The checked next chunk: its end and the new blocks it needs (or the error)."""
        check_continue(
            seq.seq_id, num_new_tokens, seq.num_computed, seq.num_reserved, seq.prompt_len
        )
        end = chunk_end(
            seq.num_reserved, seq.prompt_len, num_new_tokens, seq.kv_token_limit, seq.spans
        )
        need = blocks_for(end, self._block_size) - len(seq.blocks)
        supply = self._pool.supply
        if need > supply:
            raise self._out_of_blocks(need, supply)
        return end, need

    def can_continue_prefill(self, seq_id: SeqId, num_new_tokens: int | None = None) -> bool:
        try:
            self._chunk_plan(self._seq(seq_id), num_new_tokens)
        except OutOfBlocks:
            return False
        return True

    def continue_prefill(self, seq_id: SeqId, num_new_tokens: int | None = None) -> int:
        """Reserve the next prefill chunk; see :meth:`~prefixkv.spec.SpecCache.continue_prefill`."""
        seq = self._seq(seq_id)
        end, need = self._chunk_plan(seq, num_new_tokens)
        if need > 0:
            new, _ = self._allocate(need)
            seq.blocks.extend(new)
        start = seq.num_reserved
        seq.num_reserved = end
        if self._checkpoints is not None:
            self._checkpoints.on_reserve(seq, self._event_queue())
        return end - start

    # -- growth, commit, rollback ----------------------------------------------------------

    def _append_need(self, seq: SeqState, num_tokens: int) -> int:
        """The new blocks ``append(num_tokens)`` needs (or the error it raises)."""
        reserved = check_append(
            seq.seq_id,
            num_tokens,
            seq.num_reserved,
            seq.num_computed,
            seq.prompt_len,
            seq.kv_token_limit,
            seq.spans,
        )
        return blocks_for(reserved, self._block_size) - len(seq.blocks)

    def can_append(self, seq_id: SeqId, num_tokens: int) -> bool:
        need = self._append_need(self._seq(seq_id), num_tokens)
        return need <= self._pool.supply

    def append(self, seq_id: SeqId, num_tokens: int) -> list[int]:
        # Hot path (every decode step): the common case is inlined.
        seq = self._seqs.get(seq_id) if type(seq_id) is str or type(seq_id) is int else None
        if seq is None:
            seq = self._seq(seq_id)
        if type(num_tokens) is not int or num_tokens < 1:
            check_count(num_tokens, "num_tokens", minimum=1)
        reserved = seq.num_reserved + num_tokens
        if seq.num_reserved < seq.prompt_len:  # still prefilling: chunk rules apply
            check_growth(
                seq.seq_id,
                seq.num_reserved,
                reserved,
                seq.num_computed,
                seq.prompt_len,
                seq.kv_token_limit,
                seq.spans,
            )
        bs = self._block_size
        if reserved <= len(seq.blocks) * bs:  # the held blocks (ceil(reserved / bs)) suffice
            seq.num_reserved = reserved
            if self._checkpoints is not None:
                self._checkpoints.on_reserve(seq, self._event_queue())
            return []
        need = -(-reserved // bs) - len(seq.blocks)
        supply = self._pool.supply
        if need > supply:
            raise self._out_of_blocks(need, supply)
        new, _ = self._allocate(need)
        seq.blocks.extend(new)
        seq.num_reserved = reserved
        if self._checkpoints is not None:
            self._checkpoints.on_reserve(seq, self._event_queue())
        return new

    def commit(self, seq_id: SeqId, num_computed: int, accepted_tokens: Sequence[int] = ()) -> None:
        seq = self._seq(seq_id)
        accepted, new_computed = self._check_commit_args(seq, num_computed, accepted_tokens)
        self._apply_commit(seq, accepted, new_computed)

    def _check_commit_args(
        self, seq: SeqState, num_computed: object, accepted_tokens: Sequence[int]
    ) -> tuple[Sequence[int], int]:
        """What ``commit`` raises (the contract's :func:`check_commit`); returns the checked
        tokens and the new computed count."""
        return check_commit(
            seq.seq_id,
            seq.num_computed,
            seq.num_reserved,
            len(seq.tokens),
            num_computed,
            accepted_tokens,
        )

    def _apply_commit(self, seq: SeqState, accepted: Sequence[int], new_computed: int) -> None:
        computed = seq.num_computed
        seq.tokens.extend(accepted)
        seq.num_computed = new_computed
        bs = self._block_size
        if new_computed // bs > computed // bs:
            self._counters.blocks_published += self._publisher.publish(
                seq,
                computed // bs,
                new_computed // bs,
                self._events if self._record_events else None,
            )
        if self._checkpoints is not None:
            self._checkpoints.on_commit(seq, self._event_queue())

    def rollback(self, seq_id: SeqId, num_tokens: int) -> None:
        seq = self._seq(seq_id)
        seq.num_reserved = check_rollback(
            seq.seq_id, num_tokens, seq.num_reserved, seq.num_computed, seq.spans
        )
        keep = -(-seq.num_reserved // self._block_size)
        dropped = seq.blocks[keep:]
        if dropped:
            del seq.blocks[keep:]
            self._release(dropped)
        if self._checkpoints is not None:
            self._checkpoints.on_reserve(seq, self._event_queue())

    # -- release ---------------------------------------------------------------------------

    def free(self, seq_ids: Iterable[SeqId]) -> None:
        ids = check_free_list(seq_ids, self._seqs)
        self._clock += 1
        seqs = self._seqs
        for seq_id in ids:
            self._release(seqs.pop(seq_id).blocks)
        if self._checkpoints is not None:
            self._checkpoints.on_free(ids)
        self._pool.maybe_compact()

    def evict(self, num_blocks: int) -> int:
        check_count(num_blocks, "num_blocks", minimum=0)
        evicted = self._evict(num_blocks)
        self._pool.maybe_compact()
        return evicted

    def reset(self, *, preserve_cache: bool) -> None:
        if check_reset(preserve_cache, len(self._seqs)):
            if self._seqs:
                self.free(list(self._seqs))
            return
        self._pool.clear(self._index.blocks())
        self._index.clear()
        self._record.clear()
        if self._record_events:
            self._events.append(AllBlocksCleared())
        if self._checkpoints is not None:
            self._checkpoints.on_reset()

    # -- inspection ------------------------------------------------------------------------

    def _wire_hash(self, block: int) -> int:
        """The event hash events carry for a published block. Only meaningful while the
        manager records events: then the pool keeps it."""
        return self._pool.event_hash[block]

    def _identity_hashes(self) -> dict[int, int]:
        """The identity hash of every published block (what the spec indexes by)."""
        pool = self._pool
        published = self._index.blocks()
        hasher = self._keys.hasher
        if not self._keys.keyed:
            return {b: pool.key[b] for b in published}
        # Derived root first: a parent's depth is one less than its child's.
        out: dict[int, int] = {}
        for b in sorted(published, key=pool.depth.__getitem__):
            p = pool.parent[b]
            parent_hash = None if p == NO_PARENT else out[p]
            ns = pool.namespace[b]
            assert ns is not None
            out[b] = hasher(parent_hash, ns, pool.token_ids(b), pool.extra.get(b, ()))
        return out

    def snapshot(self) -> CacheState:
        pool = self._pool
        views = []
        materialized = len(pool.ref)
        identity_hash = self._identity_hashes()
        for b in range(self._num_blocks):
            if b >= materialized or not pool.depth[b]:
                views.append(BlockView(b, pool.ref[b] if b < materialized else 0, False))
                continue
            p = pool.parent[b]
            views.append(
                BlockView(
                    block_id=b,
                    refcount=pool.ref[b],
                    published=True,
                    namespace=pool.namespace[b],
                    parent=None if p == NO_PARENT else p,
                    token_ids=pool.token_ids(b),
                    extra_keys=pool.extra.get(b, ()),
                    block_hash=identity_hash[b],
                    event_hash=pool.event_hash[b] if pool.wire_hashes else None,
                    depth=pool.depth[b],
                    last_use=pool.last_use[b] if pool.ref[b] == 0 else 0,
                )
            )
        seqs = tuple(seq_view(s, s.namespace) for s in self._seqs.values())
        snap = CacheState(
            num_blocks=self._num_blocks,
            block_size=self._block_size,
            blocks=tuple(views),
            free_queue=pool.free_queue(),
            index=tuple(sorted((h, b) for b, h in identity_hash.items())),
            sequences=seqs,
            stats=self.stats(),
            pending_events=tuple(self._events),
        )
        return snap if self._checkpoints is None else self._checkpoints.with_snapshot(snap)

    def largest_index_bucket(self) -> int:
        """The most published blocks the index files under one key (for inspection: the
        crafted-collision benchmark; 1 when nothing collides)."""
        return self._index.largest_bucket()

    def eviction_order(self) -> list[int]:
        """Cached leaves in the order they would be evicted (for inspection)."""
        return self._pool.eviction_order()


class PrefixCacheManager(FusedSteps, _ManagerCore):
    """A paged KV prefix cache with O(blocks touched) operations: the semantic core, with
    the fused decode steps (:class:`._fused.FusedSteps`) in front of it.

    >>> from prefixkv.spec import Namespace, Request
    >>> cache = PrefixCacheManager(num_blocks=64, block_size=4)
    >>> ns = Namespace("tiny-llm@1")
    >>> adm = cache.admit(Request("a", list(range(10)), ns))
    >>> cache.commit("a", adm.num_scheduled_tokens, [42])  # prefill done, first token sampled
    >>> cache.match(Request("b", list(range(12)), ns)).num_cached_tokens
    8
    """
