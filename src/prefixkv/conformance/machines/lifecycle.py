"""Lifecycle rules: requests arrive, share prefixes, grow, commit, roll back and finish.

The text-only workload of every machine: admissions (fresh, parallel samples, whole engine
lives, at the pool's edge, hot prefixes, preemption, multi-turn), decode growth with
speculative tokens, commits and rollbacks, batched frees, eviction, resets and the pure
queries. Rules that need an operation the candidate lacks never fire.
"""

from __future__ import annotations

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, consumes, multiple, precondition, rule

from prefixkv.spec import Admission, Request, SeqId

from .checks import Targets, counted
from .steps import ProtocolSteps
from .strategies import budgets, namespace_ids, prompts, sampled_tokens

__all__ = ["LifecycleRules"]


class LifecycleRules(ProtocolSteps):
    """Admission, growth, release and query rules (see the module doc)."""

    seqs = Bundle("seqs")  # the live sequences (the same bundle in every mixin)

    # -- admission rules -------------------------------------------------------------------

    @rule(target=seqs, ns=namespace_ids(), tokens=prompts(), budget=budgets())
    @counted
    def admit(self, ns: int, tokens: tuple[int, ...], budget: int | None) -> Targets:
        """match, can_admit and admit a fresh sequence (admit even when it cannot fit)."""
        req = Request(self._new_id(), self._prompt(tokens), self._ns(ns))
        adm = self._admit(req, budget, only_if_possible=False)
        return multiple() if adm is None else req.seq_id

    @rule(
        target=seqs,
        ns=namespace_ids(),
        tokens=prompts(),
        n=st.integers(2, 3),
        steps=st.integers(0, 4),
        sampled=sampled_tokens(),
        finish=st.sampled_from(["none", "first", "group"]),
    )
    @counted
    def parallel_sampling(
        self,
        ns: int,
        tokens: tuple[int, ...],
        n: int,
        steps: int,
        sampled: tuple[int, ...],
        finish: str,
    ) -> Targets:
        """Parallel sampling: one prompt admitted ``n`` times in one step (same-step duplicate
        prompts), prefilled together, then each sample decodes its own tokens. ``finish``:
        the first sample finishes early, or the whole group finishes in one batched free
        (the samples share their prompt blocks: each must be released once per holder)."""
        admitted: list[tuple[SeqId, Admission]] = []
        for _ in range(n):
            req = Request(self._new_id(), self._prompt(tokens), self._ns(ns))
            adm = self._admit(req, None, only_if_possible=True)
            if adm is not None:
                admitted.append((req.seq_id, adm))
        for i, (seq_id, adm) in enumerate(admitted):
            self._commit_prefill(seq_id, adm, sampled[i % len(sampled) :] + sampled)
        self.oracle.end_step()  # the samples were scheduled and prefilled in one step
        live = [seq_id for seq_id, _ in admitted]
        if finish == "first" and live:
            self._free(live[:1])
            live = live[1:]
        for step in range(steps):
            for i, seq_id in enumerate(live):
                rotated = sampled[(i + step) % len(sampled) :] + sampled
                self._advance(seq_id, 1, 1, rotated)
            self.oracle.end_step()  # one decode step of the whole group
        if finish == "group" and live:
            self._free([seq_id for seq_id in live if seq_id in self.oracle.views])
            live = []
        return multiple(*(seq_id for seq_id in live if seq_id in self.oracle.views))

    @rule(
        target=seqs,
        ns=namespace_ids(),
        tokens=prompts(),
        budget=budgets(),
        steps=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=3),
        sampled=sampled_tokens(),
        finish=st.booleans(),
    )
    @counted
    def engine_step(
        self,
        ns: int,
        tokens: tuple[int, ...],
        budget: int | None,
        steps: list[tuple[int, int]],
        sampled: tuple[int, ...],
        finish: bool,
    ) -> Targets:
        """A request's life in an engine: admit, prefill (chunked), speculative decode
        steps, and (if ``finish``) completion."""
        req = Request(self._new_id(), self._prompt(tokens), self._ns(ns))
        adm = self._admit(req, budget, only_if_possible=True)
        if adm is None:
            return multiple()
        self._commit_prefill(req.seq_id, adm, sampled)
        for k, a in steps:
            self.oracle.end_step()
            self._advance(req.seq_id, k, a, sampled)
        if finish and req.seq_id in self.oracle.views:
            self._free([req.seq_id])
            return multiple()
        return req.seq_id if req.seq_id in self.oracle.views else multiple()

    @rule(target=seqs, seq=seqs, slack=st.integers(-1, 1), filler=st.integers(1, 4))
    @counted
    def admit_at_the_edge(self, seq: SeqId, slack: int, filler: int) -> Targets:
        """Share a live sequence's computed blocks in a prompt sized to the pool's edge.

        The new blocks it needs are the free and evictable blocks, ``slack`` more or less.
        Hits on blocks a live sequence holds cost no supply, so this is where a
        ``can_admit`` (or an ``admit``) that counts them as new allocations is wrong.
        """
        new = self._admit_at_the_edge(seq, slack, filler)
        return multiple() if new is None else new

    @rule(
        target=seqs,
        ns=namespace_ids(),
        tokens=prompts(),
        slack=st.integers(-1, 0),
        filler=st.integers(1, 4),
    )
    @counted
    def fits_thanks_to_hits(
        self, ns: int, tokens: tuple[int, ...], slack: int, filler: int
    ) -> Targets:
        """Pool pressure with a shared prefix: a prompt is admitted and prefilled (its full
        blocks are published and stay held), and in the next step a prompt that shares them
        is sized so that it fits only because they are hits (:meth:`admit_at_the_edge` on a
        sequence that surely has computed blocks, with no room to spare)."""
        req = Request(self._new_id(), self._prompt(tokens), self._ns(ns))
        adm = self._admit(req, None, only_if_possible=True)
        if adm is None:
            return multiple()
        self._commit_prefill(req.seq_id, adm, (filler,))
        self.oracle.end_step()
        new = self._admit_at_the_edge(req.seq_id, slack, filler)
        live = [s for s in (req.seq_id, new) if s is not None and s in self.oracle.views]
        return multiple(*live)

    def _admit_at_the_edge(self, seq: SeqId, slack: int, filler: int) -> SeqId | None:
        """The admission of :meth:`admit_at_the_edge`; the new sequence's id, or None."""
        view = self.oracle.view(seq)
        snap = self.oracle.snap_c
        if view is None or snap is None:
            return None
        bs = self.block_size
        shared = view.token_ids[: min(view.num_computed, len(view.token_ids)) // bs * bs]
        supply = snap.stats.num_free_blocks + snap.stats.num_cached_blocks
        new = max(1, (supply + slack) * bs - bs // 2)
        req = Request(self._new_id(), shared + (filler,) * new, self._ns(self._seq_ns.get(seq, 0)))
        adm = self._admit(req, None, only_if_possible=False)
        return None if adm is None else req.seq_id

    @rule(ns=namespace_ids(), tokens=prompts(), repeats=st.integers(1, 6))
    @counted
    def hot_prefix(self, ns: int, tokens: tuple[int, ...], repeats: int) -> None:
        """A hot prompt: many short requests, one after another, each admitted (a hit after
        the first), prefilled and finished. Cached blocks are released over and over."""
        for i in range(repeats):
            req = Request(self._new_id(), self._prompt(tokens), self._ns(ns))
            adm = self._admit(req, None, only_if_possible=True)
            if adm is None:
                return
            self._commit_prefill(req.seq_id, adm, (i % 4 + 1,))
            self._free([req.seq_id])

    @rule(target=seqs, seq=consumes(seqs), budget=budgets(), sampled=sampled_tokens())
    @counted
    def preempt(self, seq: SeqId, budget: int | None, sampled: tuple[int, ...]) -> Targets:
        """Preemption: free a sequence, then re-admit it under the same id to recompute."""
        view = self.oracle.view(seq)
        if view is None:
            return multiple()
        ns = self._seq_ns.get(seq, 0)
        self._free([seq])
        req = self._requests.get(seq)
        again = (
            Request(seq, view.token_ids, self._ns(ns))
            if req is None
            else attrs.evolve(req, token_ids=view.token_ids)
        )
        adm = self._admit(again, budget, only_if_possible=True)
        if adm is None:
            return multiple()
        self._commit_prefill(seq, adm, sampled)
        return seq

    @rule(target=seqs, pick=st.integers(0, 15), extra=sampled_tokens(), budget=budgets())
    @counted
    def next_turn(self, pick: int, extra: tuple[int, ...], budget: int | None) -> Targets:
        """Multi-turn: re-admit a finished sequence's history plus new user tokens."""
        if not self._history:
            self._history.append((0, (7, 7, 7), ()))
        ns, tokens, spans = self._history[pick % len(self._history)]
        req = Request(self._new_id(), tokens + extra, self._ns(ns), spans=spans)
        adm = self._admit(req, budget, only_if_possible=True)
        if adm is None:
            return multiple()
        self._commit_prefill(req.seq_id, adm, extra)
        return req.seq_id

    # -- growth, commit, rollback ----------------------------------------------------------

    @rule(
        seq=seqs,
        k=st.integers(0, 4),
        a=st.integers(0, 4),
        sampled=sampled_tokens(),
    )
    @counted
    def advance(self, seq: SeqId, k: int, a: int, sampled: tuple[int, ...]) -> None:
        """The next engine step of a live sequence: a prefill chunk or a speculative decode."""
        self._advance(seq, k, a, sampled)

    @rule(seq=seqs, n=st.integers(1, 6))
    @counted
    def append(self, seq: SeqId, n: int) -> None:
        """can_append then append several slots (append even when it cannot fit); one slot
        at a time without ``speculative``."""
        self._append(seq, n if self.caps.speculative else 1, only_if_possible=False)

    @rule(seq=seqs, n=st.integers(0, 7), accepted=st.lists(st.integers(1, 4), max_size=3))
    @counted
    def commit(self, seq: SeqId, n: int, accepted: list[int]) -> None:
        """Commit ``n`` slots with some accepted tokens; ``n`` is clamped to what is valid,
        except that ``n == 7`` commits one slot past the reservation (an engine error)."""
        view = self.oracle.view(seq)
        if view is None:
            return
        unwritten = view.num_reserved - view.num_computed
        if n == 7:
            # an engine error the candidate must refuse: not a refusal of the workload
            refused = self.oracle.refused_in_rule
            self._commit(seq, unwritten + 1, tuple(accepted[:1]) or (1,))
            self.oracle.refused_in_rule = refused
            return
        if not self.caps.speculative:
            accepted = accepted[:1]  # one token a step: nothing to accept beyond it
        known = len(view.token_ids) + len(accepted)
        n = max(0, min(n, unwritten, known - view.num_computed))
        self._commit(seq, n, tuple(accepted))

    @precondition(lambda self: self.caps.rolls_back)
    @rule(seq=seqs, n=st.integers(1, 6))
    @counted
    def rollback(self, seq: SeqId, n: int) -> None:
        """Roll back up to ``n`` unwritten slots (reserve some first if there are none)."""
        view = self.oracle.view(seq)
        if view is None:
            return
        unwritten = view.num_reserved - view.num_computed
        if not unwritten:
            if not self._append(seq, n, only_if_possible=True):
                return
            unwritten = n
        n = min(n, unwritten)
        self.oracle.op("rollback", lambda c: c.rollback(seq, n))

    # -- release, eviction, reset ----------------------------------------------------------

    @rule(first=consumes(seqs), more=st.integers(0, 2))
    @counted
    def free(self, first: SeqId, more: int) -> None:
        """Batched free of ``first`` and up to ``more`` other live sequences."""
        others = [s for s in self.oracle.views if s != first][-more:] if more else []
        self._free([first, *others])

    @precondition(lambda self: self.caps.evict)
    @rule(n=st.integers(0, 4))
    @counted
    def evict(self, n: int) -> None:
        """Evict up to ``n`` cached leaves (any cached blocks under ``eviction=any``)."""
        self._evict(n)

    def _evict(self, n: int) -> None:
        cached = self.oracle.state.stats.num_cached_blocks
        out = self.oracle.op("evict", lambda c: c.evict(n))
        if out.raised or self.caps.eviction != "any":
            return
        # Any-order eviction: every refcount-0 published block is evictable, reachable or
        # not. Evicting fewer than asked while some are left means some leaked.
        after = self.oracle.state.stats.num_cached_blocks
        if out.value != min(n, cached) or after != cached - out.value:
            self.oracle.fail(
                "EVICT",
                f"evict({n}) returned {out.value} with {cached} cached blocks; {after} are "
                f"cached after it (expected {cached - min(n, cached)}): cached blocks that "
                "cannot be evicted are leaked",
            )

    @precondition(lambda self: self.caps.evict)
    @rule(ns=namespace_ids(), tokens=prompts(), filler=st.integers(1, 4), small=st.booleans())
    @counted
    def churn_then_evict(self, ns: int, tokens: tuple[int, ...], filler: int, small: bool) -> None:
        """Cache churn, then an eviction of everything: a prompt is prefilled and finished
        (its blocks stay cached), a fresh prompt makes the cache give up cached blocks,
        whichever its policy picks, and is cancelled before its forward pass (so the blocks
        it took come back unpublished); then ``evict`` is asked for the whole
        pool (``EVICT`` under ``eviction=any``). The fresh prompt needs one block more than
        is free (a cache that takes free blocks first gives up one cached block), or, if
        ``small``, one block (a cache that evicts in its own order, free blocks or not,
        gives up one there). Under any-order eviction that is often a parent whose child
        stays cached and unreachable."""
        req = Request(self._new_id(), self._prompt(tokens), self._ns(ns))
        adm = self._admit(req, None, only_if_possible=True)
        if adm is None:
            return
        self._commit_prefill(req.seq_id, adm, (filler,))
        self._free([req.seq_id])
        bs, free = self.block_size, self.oracle.state.stats.num_free_blocks
        # token 0 is outside the drawn alphabet: the fresh prompt hits nothing
        fresh = Request(self._new_id(), (0,) * ((1 if small else free + 1) * bs), self._ns(ns))
        adm = self._admit(fresh, None, only_if_possible=True)
        if adm is None:
            return
        self._free([fresh.seq_id])  # cancelled before its forward pass: nothing published
        self.oracle.end_step()
        self._evict(self.oracle.state.num_blocks)

    @precondition(lambda self: self.caps.reset)
    @rule(mode=st.sampled_from(["preserve", "full", "drain_then_full"]))
    @counted
    def reset(self, mode: str) -> None:
        """reset(preserve_cache=True), a full reset (refused while live), or both in turn."""
        if mode != "full":
            self._run_scheduled(list(self.oracle.views))
            self._remember(list(self.oracle.views))
            self.oracle.op("reset", lambda c: c.reset(preserve_cache=True))
            self._prune_seqs()
            self._check_reclaimable()
        if mode != "preserve":
            self.oracle.op("reset", lambda c: c.reset(preserve_cache=False))

    # -- queries ---------------------------------------------------------------------------

    @rule(ns=namespace_ids(), tokens=prompts())
    @counted
    def match(self, ns: int, tokens: tuple[int, ...]) -> None:
        """A pure match, checked against INV-MATCH."""
        req = Request("probe", self._prompt(tokens), self._ns(ns))
        out = self.oracle.op("match", lambda c: c.match(req), pure=True)
        if not out.raised:
            self.oracle.check_match(req, out.value, "match")

    @rule(seq=seqs)
    @counted
    def inspect(self, seq: SeqId) -> None:
        """block_table and num_computed_tokens of a live sequence."""
        self.oracle.op("block_table", lambda c: c.block_table(seq), pure=True)
        self.oracle.op("num_computed_tokens", lambda c: c.num_computed_tokens(seq), pure=True)

    @rule()
    @counted
    def observe(self) -> None:
        """seq_ids and stats."""
        self.oracle.op("seq_ids", lambda c: c.seq_ids(), pure=True)
        self.oracle.op("stats", lambda c: c.stats(), pure=True)

    @rule()
    @counted
    def take_events(self) -> None:
        """Drain the KV events (the state check compares the pending ones every step)."""
        self.oracle.op("take_events", lambda c: c.take_events())
