"""A small block manager in the style of common engines, for the conformance kit.

It shares no code with prefixkv's caches: a chained block hash, one free deque that also
holds cached blocks (allocation takes the first block that is free or a cached leaf, and
evicts it if cached), refcounts, and hits removed from the free deque with an O(n)
``deque.remove``. It keeps its own policy (FIFO over released blocks, not the spec's LRU),
so it is checked in policy-agnostic mode: ``Capabilities(exact=False, ...)``.

It renders itself as a :class:`~prefixkv.spec.CacheState` in :meth:`snapshot`; that, and
raising prefixkv's error types, is all an adapter for a real engine has to add.

:data:`BUGS` lists classic prefix-cache bugs as subclasses; the conformance tests show that
the correct manager passes and each buggy one fails with a short replay.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from prefixkv.spec import (
    Admission,
    BlockView,
    CacheBusy,
    CacheState,
    CacheStats,
    DuplicateSequence,
    InvalidOperation,
    InvalidRequest,
    Match,
    OutOfBlocks,
    Request,
    SeqView,
    UnknownSequence,
)

from prefixkv.conformance import Capabilities, DeclaredAdapter, adapter

__all__ = ["BUGS", "CAPABILITIES", "EngineStyleManager", "make_manager"]

#: What the manager supports: text prompts only, its own eviction order.
CAPABILITIES = Capabilities(
    multimodal=False,
    recompute_windows=False,
    chunked_prefill=False,
    lost_reuse=False,
    events=False,
    exact=False,
)


def _count(value: object, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidRequest(f"{what} must be an int >= {minimum}, got {value!r}")
    return value


def _seq_id(value: object) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidRequest(f"bad sequence id {value!r}")
    return value


class _Block:
    __slots__ = ("children", "depth", "hash", "ns", "parent", "ref", "tokens")

    def __init__(self) -> None:
        self.ref = 0
        self.hash: int | None = None  # set iff cached (published)
        self.tokens: tuple[int, ...] = ()
        self.parent = -1
        self.ns = b""
        self.depth = 0
        self.children = 0  # cached blocks whose parent this is


class _Seq:
    def __init__(self, req: Request, blocks: list[int], cached: int, reserved: int) -> None:
        self.id = req.seq_id
        self.ns = req.namespace.key()
        self.tokens = list(req.token_ids)
        self.prompt = len(req.token_ids)
        self.blocks = blocks
        self.cached = cached
        self.computed = cached
        self.reserved = reserved


class EngineStyleManager:
    """Hash chain, free deque with cached blocks, refcounts (see the module doc)."""

    def __init__(self, num_blocks: int, block_size: int, *, record_events: bool = False) -> None:
        self.num_blocks = _count(num_blocks, "num_blocks", 1)
        self.block_size = _count(block_size, "block_size", 1)
        self.blocks = [_Block() for _ in range(num_blocks)]
        self.hash_to_block: dict[int, int] = {}
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.seqs: dict[Any, _Seq] = {}
        self.counters = dict.fromkeys(
            ("queries", "hits", "admissions", "evictions", "published"), 0
        )

    # -- identity and lookup -----------------------------------------------------------

    def block_hash(self, parent_hash: int | None, ns: bytes, tokens: tuple[int, ...]) -> int:
        return hash((parent_hash, ns, tokens))

    def _verify(self, b: int, parent: int, ns: bytes, tokens: tuple[int, ...]) -> bool:
        blk = self.blocks[b]
        return blk.tokens == tokens and blk.parent == parent and blk.ns == ns

    def _lookup(self, req: Request) -> list[int]:
        if not isinstance(req, Request):
            raise InvalidRequest(f"expected a Request, got {req!r}")
        bs, ns, tokens = self.block_size, req.namespace.key(), req.token_ids
        hits: list[int] = []
        h: int | None = None
        parent = -1
        for j in range((len(tokens) - 1) // bs):  # leave one token to compute
            chunk = tuple(tokens[j * bs : (j + 1) * bs])
            h = self.block_hash(h, ns, chunk)
            b = self.hash_to_block.get(h, -1)
            if b < 0 or not self._verify(b, parent, ns, chunk):
                break
            hits.append(b)
            parent = b
        return hits

    def match(self, req: Request) -> Match:
        hits = self._lookup(req)
        return Match(req.num_tokens, len(hits) * self.block_size, tuple(hits))

    # -- capacity ----------------------------------------------------------------------

    def _supply(self, pinned: Iterable[int] = ()) -> int:
        """Blocks an allocation could get: free ones, and cached ones that no held block
        (nor a block about to be pinned) descends from."""
        anchored: set[int] = set()
        roots = [b for b, blk in enumerate(self.blocks) if blk.ref and blk.hash is not None]
        for b in [*roots, *pinned]:
            while b >= 0 and b not in anchored:
                anchored.add(b)
                b = self.blocks[b].parent
        return sum(1 for b in self.free_ids if b not in anchored)

    def _plan(self, req: Request, budget: int | None) -> tuple[list[int], int, int]:
        hits = self._lookup(req)
        if budget is not None:
            _count(budget, "num_new_tokens", 1)
        if req.seq_id in self.seqs:
            raise DuplicateSequence(f"{req.seq_id!r} is live")
        cached = len(hits) * self.block_size
        end = req.num_tokens if budget is None else min(req.num_tokens, cached + budget)
        need = -(-end // self.block_size) - len(hits)
        return hits, end, need

    def can_admit(self, req: Request, num_new_tokens: int | None = None) -> bool:
        hits, _, need = self._plan(req, num_new_tokens)
        return need <= self._supply(hits)

    def _take(self) -> int:
        """The first block of the free deque that is free or a cached leaf; evicts it."""
        for b in self.free_ids:
            blk = self.blocks[b]
            if blk.hash is None or blk.children == 0:
                self.free_ids.remove(b)
                if blk.hash is not None:
                    self._evict_block(b)
                return b
        raise OutOfBlocks("no block left")  # callers check the supply first

    def _evict_block(self, b: int) -> None:
        blk = self.blocks[b]
        assert blk.hash is not None
        del self.hash_to_block[blk.hash]
        if blk.parent >= 0:
            self.blocks[blk.parent].children -= 1
        blk.hash, blk.tokens, blk.parent, blk.ns, blk.depth = None, (), -1, b"", 0
        self.counters["evictions"] += 1

    # -- admission, growth, commit -----------------------------------------------------

    def admit(self, req: Request, num_new_tokens: int | None = None) -> Admission:
        hits, end, need = self._plan(req, num_new_tokens)
        supply = self._supply(hits)
        if need > supply:
            raise OutOfBlocks(f"need {need} blocks, {supply} obtainable")
        for b in hits:
            if self.blocks[b].ref == 0:
                self.free_ids.remove(b)  # O(n), as in the engines that do this
            self.blocks[b].ref += 1
        evictions = self.counters["evictions"]
        new = [self._take() for _ in range(need)]
        for b in new:
            self.blocks[b].ref = 1
        cached = len(hits) * self.block_size
        self.seqs[req.seq_id] = _Seq(req, hits + new, cached, end)
        c = self.counters
        c["queries"] += req.num_tokens
        c["hits"] += cached
        c["admissions"] += 1
        return Admission(
            req.seq_id, cached, end - cached, (*hits, *new), need, c["evictions"] - evictions
        )

    def _seq(self, seq_id: Any) -> _Seq:
        seq = self.seqs.get(_seq_id(seq_id))
        if seq is None:
            raise UnknownSequence(f"{seq_id!r} is not live")
        return seq

    def can_append(self, seq_id: Any, num_tokens: int) -> bool:
        seq = self._seq(seq_id)
        need = -(-(seq.reserved + _count(num_tokens, "num_tokens", 1)) // self.block_size)
        return need - len(seq.blocks) <= self._supply()

    def append(self, seq_id: Any, num_tokens: int) -> list[int]:
        if not self.can_append(seq_id, num_tokens):
            raise OutOfBlocks("no room to append")
        seq = self._seq(seq_id)
        seq.reserved += num_tokens
        new = [self._take() for _ in range(-(-seq.reserved // self.block_size) - len(seq.blocks))]
        for b in new:
            self.blocks[b].ref = 1
        seq.blocks += new
        return new

    def commit(self, seq_id: Any, num_computed: int, accepted_tokens: Sequence[int] = ()) -> None:
        seq = self._seq(seq_id)
        _count(num_computed, "num_computed", 0)
        if isinstance(accepted_tokens, (str, bytes)) or not isinstance(accepted_tokens, Iterable):
            raise InvalidRequest("accepted_tokens must be a sequence of token ids")
        accepted = list(accepted_tokens)
        for t in accepted:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**32:
                raise InvalidRequest(f"bad token id {t!r}")
        new = seq.computed + num_computed
        if new > seq.reserved or new > len(seq.tokens) + len(accepted):
            raise InvalidOperation(f"cannot commit {new} tokens of {seq_id!r}")
        first = seq.computed // self.block_size
        seq.tokens += accepted
        seq.computed = new
        for j in range(first, new // self.block_size):
            self._publish(seq, j)

    def _publish(self, seq: _Seq, j: int) -> None:
        """Cache block ``j`` if its parent is cached in the table and no twin exists."""
        bs, b = self.block_size, seq.blocks[j]
        parent = seq.blocks[j - 1] if j else -1
        if parent >= 0 and self.blocks[parent].hash is None:
            return  # the parent is a private duplicate: stay private too
        tokens = tuple(seq.tokens[j * bs : (j + 1) * bs])
        h = self.block_hash(self.blocks[parent].hash if parent >= 0 else None, seq.ns, tokens)
        if h in self.hash_to_block:
            return  # a twin is cached (or a hash collision): stay private
        blk = self.blocks[b]
        blk.hash, blk.tokens, blk.parent, blk.ns = h, tokens, parent, seq.ns
        blk.depth = self.blocks[parent].depth + 1 if parent >= 0 else 1
        if parent >= 0:
            self.blocks[parent].children += 1
        self.hash_to_block[h] = b
        self.counters["published"] += 1

    def rollback(self, seq_id: Any, num_tokens: int) -> None:
        seq = self._seq(seq_id)
        _count(num_tokens, "num_tokens", 1)
        if seq.reserved - num_tokens < seq.computed:
            raise InvalidOperation("cannot roll back computed tokens")
        seq.reserved -= num_tokens
        keep = -(-seq.reserved // self.block_size)
        self._release(seq.blocks[keep:])
        del seq.blocks[keep:]

    # -- release -----------------------------------------------------------------------

    def _release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):  # children first, so they are evicted first
            blk = self.blocks[b]
            blk.ref -= 1
            if blk.ref == 0:
                self.free_ids.append(b)

    def free(self, seq_ids: Iterable[Any]) -> None:
        if isinstance(seq_ids, (str, bytes)) or not isinstance(seq_ids, Iterable):
            raise InvalidRequest("free takes an iterable of sequence ids")
        ids = [_seq_id(s) for s in seq_ids]
        if len(set(ids)) != len(ids):
            raise DuplicateSequence("a sequence is listed twice")
        for s in ids:
            self._seq(s)
        for s in ids:
            self._release(self.seqs.pop(s).blocks)

    def evict(self, num_blocks: int) -> int:
        _count(num_blocks, "num_blocks", 0)
        done = 0
        while done < num_blocks:
            leaf = next(
                (b for b in self.free_ids if self.blocks[b].hash is not None
                 and self.blocks[b].children == 0),
                -1,
            )  # fmt: skip
            if leaf < 0:
                break
            self._evict_block(leaf)
            done += 1
        return done

    def reset(self, *, preserve_cache: bool) -> None:
        if not isinstance(preserve_cache, bool):
            raise InvalidRequest("preserve_cache must be a bool")
        if preserve_cache:
            self.free(list(self.seqs))
            return
        if self.seqs:
            raise CacheBusy("sequences are live")
        for b, blk in enumerate(self.blocks):
            if blk.hash is not None:
                self._evict_block(b)
                self.counters["evictions"] -= 1  # a reset is not an eviction

    # -- queries -----------------------------------------------------------------------

    def block_table(self, seq_id: Any) -> tuple[int, ...]:
        return tuple(self._seq(seq_id).blocks)

    def num_computed_tokens(self, seq_id: Any) -> int:
        return self._seq(seq_id).computed

    def seq_ids(self) -> tuple[Any, ...]:
        return tuple(self.seqs)

    def take_events(self) -> list[Any]:
        return []

    def stats(self) -> CacheStats:
        c = self.counters
        cached = sum(1 for b in self.blocks if b.hash is not None and b.ref == 0)
        used = sum(1 for b in self.blocks if b.ref > 0)
        return CacheStats(
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            num_free_blocks=self.num_blocks - cached - used,
            num_cached_blocks=cached,
            num_used_blocks=used,
            num_published_blocks=len(self.hash_to_block),
            num_sequences=len(self.seqs),
            queries=c["queries"],
            hits=c["hits"],
            prefill_tokens=c["queries"],
            prefill_tokens_computed=c["queries"] - c["hits"],
            prefill_tokens_skipped=c["hits"],
            admissions=c["admissions"],
            evictions=c["evictions"],
            blocks_published=c["published"],
            # no split by cause: every uncached prompt token is reported as never cached
            lost_never_cached=c["queries"] - c["hits"],
        )

    def snapshot(self) -> CacheState:
        """The manager in prefixkv's neutral form: cached blocks in the free deque count as
        evictable, not free."""
        views = tuple(
            BlockView(b, blk.ref, False)
            if blk.hash is None
            else BlockView(
                b, blk.ref, True, blk.ns, None if blk.parent < 0 else blk.parent,
                blk.tokens, (), blk.hash, blk.depth,
            )
            for b, blk in enumerate(self.blocks)
        )  # fmt: skip
        seqs = tuple(
            SeqView(
                s.id, s.ns, tuple(s.tokens), tuple(s.blocks), s.computed, s.reserved,
                num_prompt_tokens=s.prompt, num_cached_tokens=s.cached,
            )
            for s in self.seqs.values()
        )  # fmt: skip
        return CacheState(
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            blocks=views,
            free_queue=tuple(b for b in self.free_ids if self.blocks[b].hash is None),
            index=tuple(sorted((h, b) for h, b in self.hash_to_block.items())),
            sequences=seqs,
            stats=self.stats(),
            pending_events=(),
        )


def factory_for(cls: type[EngineStyleManager]) -> DeclaredAdapter[EngineStyleManager]:
    """An adapter factory building ``cls``, with the manager's capabilities declared."""

    def make(num_blocks: int, block_size: int, *, record_events: bool) -> EngineStyleManager:
        return cls(num_blocks, block_size, record_events=record_events)

    make.__name__ = f"make_{cls.__name__}"
    return adapter(capabilities=CAPABILITIES)(make)


#: The adapter factory (``--prefixkv-adapter=examples.engine_style:make_manager``).
make_manager = factory_for(EngineStyleManager)


# -- classic bugs -------------------------------------------------------------------------


class StaleHashAfterReuse(EngineStyleManager):
    """A cached block is taken for reuse, but its hash entry is left behind."""

    def _evict_block(self, b: int) -> None:
        blk = self.blocks[b]
        h = blk.hash
        super()._evict_block(b)
        assert h is not None
        self.hash_to_block[h] = b


class HitVerifiedOnOwnBlock(EngineStyleManager):
    """The hash is not chained and a hit is verified on the block's own tokens only."""

    def block_hash(self, parent_hash: int | None, ns: bytes, tokens: tuple[int, ...]) -> int:
        return hash((ns, tokens))

    def _verify(self, b: int, parent: int, ns: bytes, tokens: tuple[int, ...]) -> bool:
        return self.blocks[b].tokens == tokens


class CanAdmitIgnoresHits(EngineStyleManager):
    """``can_admit`` sizes the admission as if nothing were cached."""

    def can_admit(self, req: Request, num_new_tokens: int | None = None) -> bool:
        hits, _, need = self._plan(req, num_new_tokens)
        return need + len(hits) <= self._supply()


class DoubleFreeInBatch(EngineStyleManager):
    """A batched free releases each block once, however many of the sequences hold it."""

    def free(self, seq_ids: Iterable[Any]) -> None:
        # anything but a valid batch of several live ids is the correct manager's to refuse
        ids = seq_ids if isinstance(seq_ids, list) else []
        try:
            valid = len(ids) >= 2 and len(set(ids)) == len(ids) and all(s in self.seqs for s in ids)
        except TypeError:  # an unhashable id
            valid = False
        if not valid:
            super().free(seq_ids)
            return
        seen: set[int] = set()
        for s in ids:
            blocks = [b for b in self.seqs.pop(s).blocks if b not in seen]
            seen.update(blocks)
            self._release(blocks)


#: name -> buggy manager class.
BUGS: dict[str, type[EngineStyleManager]] = {
    "stale_hash_after_reuse": StaleHashAfterReuse,
    "hit_verified_on_own_block": HitVerifiedOnOwnBlock,
    "can_admit_ignores_hits": CanAdmitIgnoresHits,
    "double_free_in_batch": DoubleFreeInBatch,
}

# One factory per bug, for the pytest plugin:
# ``--prefixkv-adapter=examples.engine_style:make_stale_hash_after_reuse``.
make_stale_hash_after_reuse = factory_for(StaleHashAfterReuse)
make_hit_verified_on_own_block = factory_for(HitVerifiedOnOwnBlock)
make_can_admit_ignores_hits = factory_for(CanAdmitIgnoresHits)
make_double_free_in_batch = factory_for(DoubleFreeInBatch)
