"""The conformance adapter for :mod:`examples.minimal_engine`: translation only.

The engine keeps no parents and counts no evictions, so the adapter records each block's
parent the first time it sees the block published (the block before it in the writer's
table, with :class:`~prefixkv.conformance.toolkit.Lineage`), and counts as evicted the
cached blocks an allocation reuses. Its index keeps the newest of identical blocks:
``duplicates="last-wins"``. It has no rollback, no eviction call and no cache reset.
"""

from __future__ import annotations

from typing import Any

from prefixkv.spec import Admission, CacheState, Match, OutOfBlocks
from prefixkv.spec import Request as PkvRequest

from prefixkv.conformance import Capabilities, DeclaredAdapter, adapter
from prefixkv.conformance import toolkit as tk

from .minimal_engine import BUGS, MinimalEngine, NoFreeBlocks, Sequence

__all__ = ["CAPABILITIES", "MinimalEngineAdapter", "make_manager"]

CAPABILITIES = Capabilities(
    duplicates="last-wins", eviction="any", exact=False, evict=False, reset=False,
    speculative=False, rollback=False, partial_admission=False, chunked_prefill=False,
    multimodal=False, recompute_windows=False, lost_reuse=False, events=False,
)  # fmt: skip


class MinimalEngineAdapter(tk.AdapterBase[Sequence]):  # prefixkv's calls -> the engine's
    def __init__(self, engine: MinimalEngine) -> None:
        super().__init__(len(engine.blocks), engine.block_size)
        self.e, self.reqs, self.lineage = engine, engine.seqs, tk.Lineage()

    def _seq(self, req: PkvRequest, budget: int | None = None) -> Sequence:
        r = tk.check_new(req, self.reqs, budget)
        return Sequence(r.seq_id, list(r.token_ids), r.namespace.key())

    def match(self, req: PkvRequest) -> Match:  # the engine's lookup has no room check
        return tk.match_of(req, self.e.cached_prefix(self._seq(req)), self.block_size)

    def can_admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> bool:
        return self.e.can_allocate(self._seq(req, num_new_tokens))

    def _taking(self, call: Any, seq_id: Any) -> int:
        """Run an allocation; the cached blocks it reused were evicted."""
        cached = {b.block_id for b in self.e.blocks if b.hash != -1}
        before = len(self.reqs[seq_id].block_table) if seq_id in self.reqs else 0
        with tk.refusal(NoFreeBlocks, as_error=OutOfBlocks, what=repr(seq_id)):
            call()
        return self.counters.evicted_among(cached, self.reqs[seq_id].block_table[before:])

    def admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> Admission:
        s = self._seq(req, num_new_tokens)
        evicted = self._taking(lambda: self.e.allocate(s), s.seq_id)
        self.counters.admitted(req.num_tokens, hit := s.num_cached_tokens)
        return Admission(s.seq_id, hit, req.num_tokens - hit, tuple(s.block_table),
                         len(s.block_table) - hit // self.block_size, evicted)  # fmt: skip

    def can_append(self, seq_id: Any, num_tokens: int) -> bool:
        return self.e.can_append(tk.live(self.reqs, seq_id), tk.check_count(num_tokens, "n"))

    def extend(self, seq_id: Any, num_tokens: int) -> list[int]:
        before = len(self.reqs[seq_id].block_table)
        for _ in range(num_tokens):  # one decode slot at a time
            self._taking(lambda: self.e.may_append(self.reqs[seq_id]), seq_id)
        return self.reqs[seq_id].block_table[before:]

    def commit(self, seq_id: Any, num_computed: int, accepted_tokens: Any = ()) -> None:
        s = tk.live(self.reqs, seq_id)
        self.e.postprocess(s, *tk.check_commit(num_computed, accepted_tokens,
            committed=s.num_computed_tokens, allocated=s.num_slots,
            known=len(s.token_ids)))  # fmt: skip

    def release(self, seq_id: Any) -> None:
        self.e.deallocate(self.reqs[seq_id])

    def block_table(self, seq_id: Any) -> tuple[int, ...]:
        return tuple(tk.live(self.reqs, seq_id).block_table)

    def num_computed_tokens(self, seq_id: Any) -> int:
        return tk.live(self.reqs, seq_id).num_computed_tokens

    def snapshot(self) -> CacheState:
        e, lin = self.e, self.lineage
        for s in e.seqs.values():  # a block's parent: the block before it in its writer
            for j, b in enumerate(s.block_table):
                if (blk := e.blocks[b]).hash != -1:
                    up = s.block_table[j - 1] if j else None
                    lin.observe(b, up, s.namespace, blk.token_ids, blk.hash)
        blocks = [lin.block(b.block_id, b.ref_count, None if b.hash == -1 else b.hash,
                            b.token_ids) for b in e.blocks]  # fmt: skip
        seqs = [tk.SeqBook(s.namespace, s.token_ids, s.num_prompt_tokens, s.num_slots,
                           s.num_computed_tokens, s.num_cached_tokens).view(i, s.block_table)
                for i, s in e.seqs.items()]  # fmt: skip
        return tk.build_snapshot(blocks, seqs, e.free_block_ids, self.counters,
                                 block_size=self.block_size,
                                 index=list(e.hash_to_block_id.items()))  # fmt: skip


def factory_for(cls: type[MinimalEngine] = MinimalEngine) -> DeclaredAdapter[MinimalEngineAdapter]:
    """An adapter factory for ``cls(num_blocks, block_size)``."""

    @adapter(capabilities=CAPABILITIES)
    def make(num_blocks: int, block_size: int, *, record_events: bool) -> MinimalEngineAdapter:
        return MinimalEngineAdapter(cls(num_blocks, block_size))

    return make


make_manager = factory_for()
#: name -> factory of each bug.
BUG_FACTORIES = {name: factory_for(cls) for name, cls in BUGS.items()}
