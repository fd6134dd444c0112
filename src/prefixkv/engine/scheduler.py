"""The reference scheduler: continuous batching over the public cache API.

One engine step is three calls::

    plan = scheduler.schedule()        # decide, and reserve the step's slots in the cache
    output = runner.forward(plan)      # the model writes KV for plan's positions, samples
    scheduler.commit_step(output)      # commit written KV and sampled tokens; finish, free

or ``scheduler.cancel_step()`` instead of the commit when the forward failed: every
reservation of the step is given back and the step's admissions return to the queue.

What ``schedule`` does, in order (each decision is a pure function of :mod:`.policy`):

1. **Decode.** Running sequences in the decode phase, in round-robin order, each get their
   pending token plus the drafts the drafter proposes (speculative decoding), within the
   decode share of the budget (:func:`~.policy.split_budget`). A decode whose ``append``
   cannot be satisfied preempts the newest running sequence not yet scheduled this step
   (:func:`~.policy.choose_victim`), itself last: *preemption by recompute* frees it, and
   it is re-admitted later with its prompt plus the output so far as its new prompt, whose
   committed blocks the cache serves back as a prefix hit.
2. **Prefill chunks.** Sequences in the middle of a chunked prefill reserve their next
   chunk with ``continue_prefill`` (at most the budget left and their ``kv_token_limit``).
3. **Admission.** Waiting requests, first come first served, are admitted with
   ``can_admit`` then ``admit`` (one transaction; the prediction is exact) and the budget
   left as ``num_new_tokens``: a long prompt gets its first chunk now, resumed right after
   its cached prefix.

An idle step (nothing running, nothing waiting) returns an empty plan and calls nothing on
the cache that changes it (choice 12).

Cache off: the same scheduler, but every admission gets a namespace of its own, so nothing
is ever shared. Both runs schedule the same way; only what the cache can serve differs,
which is what makes "cache on == cache off" a like-for-like comparison.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import attrs

from prefixkv.spec.errors import DuplicateSequence, InvalidOperation, OutOfBlocks
from prefixkv.spec.framing import frame, u64
from prefixkv.spec.namespace import Namespace
from prefixkv.spec.protocol import PrefixCache
from prefixkv.spec.request import Request

from . import policy
from .generation import Generation, GenerationRequest, MultimodalItem, Status
from .policy import SchedulerConfig
from .step import Kind, ScheduledSeq, StepOutput, StepPlan

__all__ = ["Drafter", "Scheduler", "SchedulerStats"]


class Drafter(Protocol):
    """Proposes draft tokens for speculative decoding from a sequence's tokens so far."""

    def propose(self, tokens: Sequence[int], max_tokens: int) -> list[int]: ...


@attrs.define
class SchedulerStats:
    steps: int = 0
    idle_steps: int = 0
    preemptions: int = 0
    prefill_chunks: int = 0
    decode_steps: int = 0
    drafts_proposed: int = 0
    drafts_accepted: int = 0
    cancelled_steps: int = 0


@attrs.define
class _Reservation:
    """What ``schedule`` reserved for one sequence, so ``cancel_step`` can give it back."""

    generation: Generation
    kind: str  # "admit", "chunk" or "append"
    num_tokens: int


@attrs.define
class _StepBuild:
    """The step being planned, passed through ``schedule``'s three phases."""

    scheduled: list[Generation] = attrs.Factory(list)
    entries: list[ScheduledSeq] = attrs.Factory(list)
    preempted: list[str] = attrs.Factory(list)  # request ids, in preemption order
    used_decode: int = 0
    used_prefill: int = 0

    def budget_left(self, config: SchedulerConfig) -> int:
        """Tokens of the step's budget not yet given to a decode or a prefill."""
        return config.max_num_batched_tokens - self.used_decode - self.used_prefill


def _off_namespace(base: Namespace, request_id: str, attempt: int) -> Namespace:
    """A namespace no other admission shares: cache off, like for like.

    Framed (:mod:`prefixkv.spec.framing`, injective), so ``("a", 12)`` and ``("a1", 2)``
    never collide.
    """
    salt = b"prefixkv-cache-off" + frame(request_id.encode("utf-8")) + u64(attempt)
    if base.salt is not None:
        salt += frame(base.salt)
    return Namespace(base.model, base.adapter, salt)


class Scheduler:
    """Plans engine steps over a :class:`~prefixkv.spec.protocol.PrefixCache`.

    Uses only the public cache API. ``cache_enabled=False`` gives each admission a private
    namespace (nothing is reused), everything else unchanged.
    """

    def __init__(
        self,
        cache: PrefixCache,
        config: SchedulerConfig | None = None,
        *,
        cache_enabled: bool = True,
        drafter: Drafter | None = None,
    ) -> None:
        self.cache = cache
        self.config = SchedulerConfig() if config is None else config
        self.cache_enabled = cache_enabled
        self.drafter = drafter
        self.stats = SchedulerStats()
        self._generations: dict[str, Generation] = {}
        self._waiting: deque[Generation] = deque()
        self._running: list[Generation] = []  # admission order
        self._rr = 0
        self._step = 0
        self._plan: StepPlan | None = None
        self._journal: list[_Reservation] = []

    # -- requests --------------------------------------------------------------------------

    def add(self, request: GenerationRequest) -> Generation:
        """Queue a request; its id must be new to this scheduler."""
        if request.request_id in self._generations:
            raise DuplicateSequence(f"request {request.request_id!r} was already added")
        gen = Generation(request=request, arrival=self._step)
        self._generations[request.request_id] = gen
        self._waiting.append(gen)
        return gen

    def generation(self, request_id: str) -> Generation:
        return self._generations[request_id]

    @property
    def generations(self) -> tuple[Generation, ...]:
        return tuple(self._generations.values())

    @property
    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def step_index(self) -> int:
        return self._step

    # -- planning --------------------------------------------------------------------------

    def _cache_request(self, gen: Generation) -> Request:
        req = gen.request
        ns = req.namespace
        if not self.cache_enabled:
            ns = _off_namespace(ns, req.request_id, gen.admissions)
        return req.cache_request(ns, gen.tokens)

    def _preempt(self, gen: Generation) -> None:
        """Preemption by recompute: free the sequence; it re-enters the queue at the front."""
        self.cache.free([gen.request_id])
        self._running.remove(gen)
        gen.status = Status.WAITING
        gen.num_prompt = gen.num_computed = 0
        gen.preemptions += 1
        self.stats.preemptions += 1
        self._waiting.appendleft(gen)

    def _make_room(
        self,
        gen: Generation,
        fits: Callable[[], bool],
        build: _StepBuild,
    ) -> bool:
        """Preempt newer sequences until ``fits()``; False if ``gen`` itself had to go."""
        while not fits():
            victim = policy.choose_victim(self._running, build.scheduled)
            if victim is None or victim is gen:
                self._preempt(gen)
                build.preempted.append(gen.request_id)
                return False
            self._preempt(victim)
            build.preempted.append(victim.request_id)
        return True

    def _items_in(self, gen: Generation, start: int, end: int) -> tuple[MultimodalItem, ...]:
        return tuple(
            item
            for item in gen.request.multimodal
            if item.span.start < end and item.span.end > start
        )

    def schedule(self) -> StepPlan:
        """Plan the next step and reserve its slots in the cache (see the module docstring).

        Returns:
            The step's plan: one entry per scheduled sequence, in the order decided.

        Raises:
            InvalidOperation: the previous step is neither committed nor cancelled.
            OutOfBlocks: a waiting request cannot fit even an empty pool.
        """
        if self._plan is not None:
            raise InvalidOperation("the previous step is neither committed nor cancelled")
        self._step += 1
        self.stats.steps += 1
        if not self._waiting and not self._running:
            self.stats.idle_steps += 1
            self._plan = StepPlan(step=self._step, seqs=())
            return self._plan
        self._journal = []
        build = _StepBuild()
        self._schedule_decodes(build)
        self._schedule_chunks(build)
        self._schedule_admissions(build)
        self._plan = StepPlan(
            step=self._step,
            seqs=tuple(build.entries),
            preempted=tuple(build.preempted),
            num_prefill_tokens=build.used_prefill,
            num_decode_tokens=build.used_decode,
        )
        if self._plan.is_idle:
            self.stats.idle_steps += 1
        return self._plan

    def _schedule_decodes(self, build: _StepBuild) -> None:
        """Phase 1: decodes, round robin, each with its drafts, within the decode budget."""
        cfg = self.config
        cache = self.cache
        decoding = [g for g in self._running if g.status is Status.DECODE]
        order = policy.rotate(decoding, self._rr)
        drafts: dict[int, list[int]] = {}
        for g in order:
            proposal: list[int] = []
            if self.drafter is not None and cfg.num_draft_tokens and g.remaining > 1:
                limit = min(cfg.num_draft_tokens, g.remaining - 1)
                proposal = list(self.drafter.propose(g.tokens, limit))[:limit]
            drafts[id(g)] = proposal
        decode_demand = sum(1 + len(drafts[id(g)]) for g in order)
        prefill_demand = sum(g.prompt_left for g in self._running if g.status is Status.PREFILL)
        prefill_demand += sum(len(g.tokens) for g in self._waiting)
        decode_budget, _ = policy.split_budget(
            cfg.max_num_batched_tokens, decode_demand, prefill_demand, cfg.min_prefill_tokens
        )
        served = 0
        for g in order:
            if g.status is not Status.DECODE:  # preempted earlier in this loop
                continue
            keep = policy.fit_decode(len(drafts[id(g)]), decode_budget - build.used_decode)
            if keep < 0:
                break
            proposal = drafts[id(g)][:keep]
            n = 1 + len(proposal)

            def fits(g: Generation = g, n: int = n) -> bool:
                return cache.can_append(g.request_id, n)

            if not self._make_room(g, fits, build):
                continue
            cache.append(g.request_id, n)
            self._journal.append(_Reservation(g, "append", n))
            build.scheduled.append(g)
            served += 1
            build.used_decode += n
            build.entries.append(
                ScheduledSeq(
                    seq_id=g.request_id,
                    kind=Kind.DECODE,
                    start=g.num_computed,
                    token_ids=(g.tokens[-1], *proposal),
                    block_ids=cache.block_table(g.request_id),
                    sample=True,
                    draft_tokens=tuple(proposal),
                )
            )
        self._rr += served

    def _schedule_chunks(self, build: _StepBuild) -> None:
        """Phase 2: the next chunks of running prefills, oldest admission first."""
        cache = self.cache
        for g in list(self._running):
            if build.budget_left(self.config) <= 0:
                break
            if g.status is not Status.PREFILL or g in build.scheduled:
                continue
            budget = build.budget_left(self.config)

            def chunk_fits(g: Generation = g, b: int = budget) -> bool:
                return cache.can_continue_prefill(g.request_id, b)

            if not self._make_room(g, chunk_fits, build):
                continue
            n = cache.continue_prefill(g.request_id, budget)
            self._journal.append(_Reservation(g, "chunk", n))
            self.stats.prefill_chunks += 1
            build.scheduled.append(g)
            build.entries.append(self._prefill_entry(g, n))
            build.used_prefill += n

    def _schedule_admissions(self, build: _StepBuild) -> None:
        """Phase 3: admit waiting requests, first come first served, while budget lasts."""
        cfg = self.config
        cache = self.cache
        while self._waiting and len(self._running) < cfg.max_num_seqs:
            budget = build.budget_left(cfg)
            if budget <= 0:
                break
            g = self._waiting[0]
            if g.request_id in build.preempted:
                break  # preempted to make room this step: admitting it now would thrash
            req = self._cache_request(g)
            if not cache.can_admit(req, budget):
                if not self._running and not build.scheduled:
                    # Nothing holds a block, so the pool can never fit this request.
                    cache.admit(req, budget)  # raises OutOfBlocks with the numbers
                    raise OutOfBlocks("admission failed after can_admit")  # pragma: no cover
                break
            adm = cache.admit(req, budget)
            self._waiting.popleft()
            g.status = Status.PREFILL
            g.num_prompt = len(g.tokens)
            g.num_computed = adm.num_cached_tokens
            g.admissions += 1
            if g.admissions == 1:
                g.num_cached_at_admission = adm.num_cached_tokens
            self._running.append(g)
            self._journal.append(_Reservation(g, "admit", adm.num_scheduled_tokens))
            build.scheduled.append(g)
            build.entries.append(self._prefill_entry(g, adm.num_scheduled_tokens))
            build.used_prefill += adm.num_scheduled_tokens

    def _prefill_entry(self, g: Generation, n: int) -> ScheduledSeq:
        start = g.num_computed
        end = start + n
        return ScheduledSeq(
            seq_id=g.request_id,
            kind=Kind.PREFILL,
            start=start,
            token_ids=tuple(g.tokens[start:end]),
            block_ids=self.cache.block_table(g.request_id),
            sample=end == g.num_prompt,
            multimodal=self._items_in(g, start, end),
        )

    # -- after the forward -----------------------------------------------------------------

    def commit_step(self, output: StepOutput) -> list[Generation]:
        """Commit the planned step with the sampled tokens; returns the generations that
        finished (their sequences are freed, their committed blocks stay cached)."""
        plan = self._plan
        if plan is None:
            raise InvalidOperation("no step is planned")
        if len(output.sampled) != len(plan.seqs):
            raise InvalidOperation(
                f"the plan has {len(plan.seqs)} sequences, the output {len(output.sampled)}"
            )
        for entry, sampled in zip(plan.seqs, output.sampled, strict=True):
            if len(sampled) != entry.num_samples:
                raise InvalidOperation(
                    f"{entry.seq_id!r}: expected {entry.num_samples} sampled tokens, "
                    f"got {len(sampled)}"
                )
        finished: list[Generation] = []
        cache = self.cache
        for entry, sampled in zip(plan.seqs, output.sampled, strict=True):
            g = self._generations[str(entry.seq_id)]
            if entry.kind is Kind.PREFILL:
                new = list(sampled)
                cache.commit(g.request_id, entry.num_tokens, new)
                g.num_computed += entry.num_tokens
                if not entry.sample:
                    continue
                g.tokens.extend(new)
                g.status = Status.DECODE
            else:
                accepted, new = policy.verify_greedy(entry.draft_tokens, sampled)
                new = new[: g.remaining]
                g.drafts_proposed += len(entry.draft_tokens)
                g.drafts_accepted += min(accepted, len(new))
                self.stats.drafts_proposed += len(entry.draft_tokens)
                self.stats.drafts_accepted += min(accepted, len(new))
                self.stats.decode_steps += 1
                # KV is valid for the pending token and the drafts that were kept; the
                # rest of the reservation held rejected drafts: roll it back (choice 10).
                cache.commit(g.request_id, len(new), new)
                rejected = entry.num_tokens - len(new)
                if rejected:
                    cache.rollback(g.request_id, rejected)
                g.num_computed += len(new)
                g.tokens.extend(new)
            if g.first_token_step is None:
                g.first_token_step = plan.step
            if g.remaining <= 0:
                finished.append(g)
        if finished:
            cache.free([g.request_id for g in finished])
            for g in finished:
                self._running.remove(g)
                g.status = Status.FINISHED
                g.finish_step = plan.step
        self._plan = None
        self._journal = []
        return finished

    def cancel_step(self) -> None:
        """Give back every reservation of the planned step (the forward did not happen).

        Appends and chunks are rolled back; admissions are freed and their requests go
        back to the front of the queue. Preemptions made while planning stay done (their
        requests are waiting and will be recomputed), and admission statistics stay
        counted: the cache counted those admissions when they happened.
        """
        if self._plan is None:
            raise InvalidOperation("no step is planned")
        readmit: list[Generation] = []
        for r in reversed(self._journal):
            g = r.generation
            if r.kind == "admit":
                self.cache.free([g.request_id])
                self._running.remove(g)
                g.status = Status.WAITING
                g.num_prompt = g.num_computed = 0
                g.admissions -= 1
                readmit.append(g)
            elif r.num_tokens:
                self.cache.rollback(g.request_id, r.num_tokens)
        # readmit holds the step's admissions newest first; appendleft restores FCFS order.
        for g in readmit:
            self._waiting.appendleft(g)
        self.stats.cancelled_steps += 1
        self._plan = None
        self._journal = []

    def finished(self) -> Iterable[Generation]:
        return (g for g in self._generations.values() if g.finished)
