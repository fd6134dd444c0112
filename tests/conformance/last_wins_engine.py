"""A minimal engine that keeps no parent pointers and whose index keeps only the newest of
several identical blocks (``duplicates="last-wins"``), and its adapter on
:func:`~prefixkv.conformance.toolkit.build_snapshot`: the most common correct design, which
the kit must pass. ``WrongParentHash`` chains a block's hash to the wrong parent (the
sequence's first block), a bug the kit must catch under every duplicates mode;
``PublishesAhead`` publishes a block before its KV is written (another INV-PUBLISH)."""

from __future__ import annotations

from typing import Any, cast

from prefixkv.spec import Admission, CacheState, InvalidRequest, Match, OutOfBlocks, SeqId, SeqView
from prefixkv.spec import Request as PkvRequest

from examples.plain_engine import NoFreeBlocks, PlainEngine, PlainRequest
from prefixkv.conformance import Capabilities, adapter
from prefixkv.conformance import toolkit as tk
from prefixkv.conformance.capabilities import Duplicates

__all__ = ["LastWinsAdapter", "LastWinsEngine", "PublishesAhead", "WrongParentHash", "make"]


class LastWinsEngine(PlainEngine):
    """The plain engine, with a last-wins index: a block computed with a cached twin's
    identity is cached too and takes over the hash; the older copy stays cached, read-only,
    until it is reused."""

    def parent_hash_of(self, blocks: list[int], j: int) -> int | None:
        return self.blocks[blocks[j - 1]].block_hash if j else None

    def computed(self, req_id: object, num_tokens: int, new_tokens: list[int]) -> None:
        req, bs = self.requests[req_id], self.block_size
        first = req.num_computed // bs
        req.tokens += new_tokens
        req.num_computed += num_tokens
        for j in range(first, req.num_computed // bs):
            blk = self.blocks[req.blocks[j]]
            parent = self.parent_hash_of(req.blocks, j)
            if (j and parent is None) or blk.block_hash is not None:
                continue  # a hit, or a block after an uncached one
            chunk = tuple(req.tokens[j * bs : (j + 1) * bs])
            blk.block_hash = hash((parent, req.namespace, chunk))
            blk.parent_hash, blk.tokens, blk.namespace = parent, chunk, req.namespace
            self.cached[blk.block_hash] = blk.block_id  # last wins

    def _take(self) -> int:
        b = self.free_list.popleft()
        blk = self.blocks[b]
        if blk.block_hash is not None:  # evicted as it is reused; the index may name a twin
            if self.cached.get(blk.block_hash) == b:
                del self.cached[blk.block_hash]
            blk.block_hash = None
            self.num_evicted += 1
        blk.ref_cnt = 1
        return b


class PublishesAhead(LastWinsEngine):
    """Bug: a commit also publishes the next block once its tokens are known, before its KV
    is written."""

    def computed(self, req_id: object, num_tokens: int, new_tokens: list[int]) -> None:
        req = self.requests[req_id]
        super().computed(req_id, num_tokens, new_tokens)
        j, bs = req.num_computed // self.block_size, self.block_size
        if j < len(req.blocks) and len(req.tokens) >= (j + 1) * bs and j:
            blk, parent = self.blocks[req.blocks[j]], self.parent_hash_of(req.blocks, j)
            if blk.block_hash is None and parent is not None:
                chunk = tuple(req.tokens[j * bs : (j + 1) * bs])
                blk.block_hash = hash((parent, req.namespace, chunk))
                blk.parent_hash, blk.tokens, blk.namespace = parent, chunk, req.namespace
                self.cached[blk.block_hash] = blk.block_id


class WrongParentHash(LastWinsEngine):
    """Bug: every block after the second chains to the sequence's first block."""

    def parent_hash_of(self, blocks: list[int], j: int) -> int | None:
        return self.blocks[blocks[0 if j > 1 else j - 1]].block_hash if j else None


class LastWinsAdapter(tk.AdapterBase[Any]):
    def __init__(self, engine: PlainEngine) -> None:
        super().__init__(len(engine.blocks), engine.block_size)
        self.engine = engine
        # the engine keys its requests by any object; the kit's by sequence id
        self.reqs = cast("dict[SeqId, PlainRequest]", engine.requests)

    def _plan(self, req: object, budget: object) -> tuple[list[int], bool]:
        r = tk.check_request(req)
        if budget is not None:
            raise InvalidRequest("whole prompts only")
        hits = self.engine.lookup(list(r.token_ids), r.namespace.key())
        return hits, self.engine.blocks_needed(r.num_tokens, hits) <= self.engine.num_free(hits)

    def match(self, req: PkvRequest) -> Match:
        hits, _ = self._plan(req, None)
        return Match(req.num_tokens, len(hits) * self.block_size, tuple(hits))

    def can_admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> bool:
        return self._plan(req, num_new_tokens)[1]

    def admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> Admission:
        hits, _ = self._plan(tk.check_new(req, self.reqs, num_new_tokens), num_new_tokens)
        evicted = self.engine.num_evicted
        try:
            r = self.engine.allocate(req.seq_id, list(req.token_ids), req.namespace.key())
        except NoFreeBlocks as exc:
            raise OutOfBlocks(str(exc)) from None
        self.counters.admitted(req.num_tokens, r.num_hit_tokens)
        return Admission(req.seq_id, r.num_hit_tokens, req.num_tokens - r.num_hit_tokens,
                         tuple(r.blocks), len(r.blocks) - len(hits),
                         self.engine.num_evicted - evicted)  # fmt: skip

    def can_append(self, seq_id: Any, num_tokens: int) -> bool:
        r, n = tk.live(self.reqs, seq_id), tk.check_count(num_tokens, "num_tokens")
        return self.engine.blocks_needed(r.num_slots + n, r.blocks) <= self.engine.num_free()

    def extend(self, seq_id: Any, num_tokens: int) -> list[int]:
        before = len(self.reqs[seq_id].blocks)
        self.engine.grow(seq_id, num_tokens)
        return self.reqs[seq_id].blocks[before:]

    def commit(self, seq_id: Any, num_computed: int, accepted_tokens: Any = ()) -> None:
        r = tk.live(self.reqs, seq_id)
        n, tokens = tk.check_commit(num_computed, accepted_tokens, committed=r.num_computed,
                                    allocated=r.num_slots, known=len(r.tokens))  # fmt: skip
        self.engine.computed(seq_id, n, tokens)

    def release(self, seq_id: Any) -> None:
        self.engine.release(seq_id)

    def block_table(self, seq_id: Any) -> tuple[int, ...]:
        return tuple(tk.live(self.reqs, seq_id).blocks)

    def num_computed_tokens(self, seq_id: Any) -> int:
        return int(tk.live(self.reqs, seq_id).num_computed)

    def snapshot(self) -> CacheState:
        e, self.counters.evictions = self.engine, self.engine.num_evicted
        blocks = [tk.Block(b.block_id, b.ref_cnt, b.block_hash, b.parent_hash, b.tokens,
                           b.namespace) for b in e.blocks]  # fmt: skip
        index = [(h, b) for h, b in e.cached.items()]
        seqs = [SeqView(cast(SeqId, i), r.namespace, tuple(r.tokens), tuple(r.blocks),
                        r.num_computed, r.num_slots, r.num_prompt_tokens, r.num_hit_tokens)
                for i, r in e.requests.items()]  # fmt: skip
        return tk.build_snapshot(blocks, seqs, e.free_list, self.counters,
                                 block_size=e.block_size, index=index)  # fmt: skip


def make(engine: type[PlainEngine] = LastWinsEngine, duplicates: Duplicates = "last-wins") -> Any:
    """An adapter factory for ``engine`` declaring ``duplicates``."""

    caps = Capabilities(
        duplicates=duplicates, eviction="any", exact=False, evict=False, reset=False,
        speculative=False, partial_admission=False, chunked_prefill=False, multimodal=False,
        recompute_windows=False, lost_reuse=False, events=False,
    )  # fmt: skip

    @adapter(capabilities=caps)
    def factory(num_blocks: int, block_size: int, *, record_events: bool) -> LastWinsAdapter:
        return LastWinsAdapter(engine(num_blocks, block_size))

    return factory
