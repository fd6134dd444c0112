"""The hybrid-model differential machine: checkpoints and routed experts (choices 7, 11).

:class:`HybridMachine` is the whole :class:`~.differential.DifferentialMachine`
(every text, span, window, chunk, eviction, reset and bad-input rule) run on a pair of
hybrid caches, :class:`~prefixkv.spec.HybridSpecCache` against
:class:`~prefixkv.impl.HybridPrefixCacheManager`, with small state-slot pools so that slot
pressure is the common case. It adds:

* rules for the checkpoint lifecycle: issuing restores, aborting them, saving and
  restoring in the same step, eviction while restores are pending, hybrid queries, and
  bad hybrid inputs;
* the runtime state an engine keeps: after each commit (while ``keeps_states``, drawn per
  run) the state after the committed tokens, drafts included (``keep_state``), and bad
  keeps: past the committed tokens (a rejected or unverified draft's state), before them
  (stale), while a restore is pending;
* routed-expert data on commits (named after the committing sequence, so an overwrite
  instead of an enrichment shows in the state);
* the check ``HYBRID-HIT`` on every admission: it hits tokens only with a restore, and the
  restore is the checkpoint pinned by it at exactly the hit's boundary; its state slot is
  its runtime slot;
* INV-CKPT after every step (``invariants.check`` evaluates it on every hybrid snapshot),
  and counters of every lifecycle transition and checkpoint fate it saw
  (``coverage.variants``, keys ``ckpt:<from>-><to>`` and ``fate:<fate>@<operation>``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import initialize, multiple, precondition, rule

from prefixkv.spec import (
    HASHERS,
    Admission,
    BlockHasher,
    CacheState,
    CheckpointView,
    HybridSpecCache,
    InvalidOperation,
    InvalidRequest,
    Request,
    SeqId,
    SeqView,
    StateRef,
    UnknownSequence,
    fast_hash,
)

from ..adapters import BlockManagerAdapter, HybridAdapter
from ..capabilities import Capabilities
from .checks import Targets, bad_inputs_due, counted
from .coverage import RuleCoverage
from .description import MachineDescription, machine_class
from .differential import DifferentialMachine
from .factories import PairFactory, PoolConfig
from .strategies import budgets, namespace_ids, prompts, sampled_tokens

if TYPE_CHECKING:
    from prefixkv.impl import HybridPrefixCacheManager

__all__ = [
    "BAD_HYBRID_KINDS",
    "HybridMachine",
    "HybridPoolConfig",
    "build_hybrid_machine",
    "hybrid_candidate_class",
    "hybrid_spec_vs_impl",
]

#: Malformed hybrid inputs driven by ``bad_hybrid_input``.
BAD_HYBRID_KINDS = (
    "restore_unknown",
    "restore_not_pending",
    "state_slot_unknown",
    "pending_restore_unknown",
    "reservation_unknown",
    "experts_count",
    "experts_type",
    "runtime_state_unknown",
    "keep_unknown",
    "keep_draft_past_committed",
    "keep_stale",
    "keep_negative",
    "keep_while_restoring",
)

_FATES = ("saved", "discarded", "restored", "released_stale", "evicted")


@attrs.frozen
class HybridPoolConfig(PoolConfig):
    """A pool plus the hybrid knobs both caches of the pair are built with."""

    max_num_seqs: int = 4
    state_budget: int = 2
    decode_state_interval: int = 0


def hybrid_candidate_class() -> type[HybridPrefixCacheManager]:
    """``prefixkv.impl.HybridPrefixCacheManager``, resolved on every call (so that the
    mutation harness can install a patched ``prefixkv.impl`` first)."""
    module = importlib.import_module("prefixkv.impl")
    cls: type[HybridPrefixCacheManager] = module.HybridPrefixCacheManager
    return cls


def hybrid_spec_vs_impl(hasher: BlockHasher | str = fast_hash) -> PairFactory:
    """HybridSpecCache (reference) against the impl's hybrid manager (candidate)."""
    h = HASHERS[hasher] if isinstance(hasher, str) else hasher

    def make_pair(cfg: PoolConfig) -> tuple[BlockManagerAdapter, BlockManagerAdapter]:
        assert isinstance(cfg, HybridPoolConfig)
        slots = (cfg.max_num_seqs, cfg.state_budget, cfg.decode_state_interval)

        def one(cls: type[HybridSpecCache] | type[HybridPrefixCacheManager]) -> HybridAdapter:
            n, budget, interval = slots
            return cls(
                cfg.num_blocks,
                cfg.block_size,
                max_num_seqs=n,
                state_budget=budget,
                decode_state_interval=interval,
                hasher=h,
                record_events=cfg.record_events,
            )

        return one(HybridSpecCache), one(hybrid_candidate_class())

    make_pair.__name__ = f"hybrid_spec_vs_impl_{getattr(h, '__name__', 'hash')}"
    return make_pair


def _statuses(snap: CacheState | None) -> dict[int, CheckpointView]:
    if snap is None or snap.state_slots is None:
        return {}
    return {ck.slot: ck for ck in snap.state_slots.checkpoints}


class HybridMachine(DifferentialMachine):
    """The differential rules plus the hybrid ones; see the module doc.

    Build a runnable class with :func:`build_hybrid_machine`.
    """

    coverage: ClassVar[RuleCoverage] = RuleCoverage()

    def __init__(self) -> None:
        super().__init__()
        self._experts_on = False
        self._keeps_states = True
        self.oracle.observers.append(self._observe)

    # -- plumbing: counters of transitions and fates ---------------------------------------

    def _observe(self, name: str, before: CacheState | None, after: CacheState | None) -> None:
        """Count the lifecycle transitions of one operation (an oracle observer)."""
        if before is not None and after is not None and before is not after:
            self._count_transitions(name, before, after)

    def _count_transitions(self, name: str, before: CacheState, after: CacheState) -> None:
        variants = type(self).coverage.variants
        old, new = _statuses(before), _statuses(after)
        seqs: dict[SeqId | None, SeqView] = {v.seq_id: v for v in before.sequences}
        for slot in old.keys() | new.keys():
            a = old[slot].status if slot in old else "free"
            b = new[slot].status if slot in new else "free"
            if a != b:
                variants[f"ckpt:{a}->{b}"] += 1
            if a == "reserved" and b == "ready":
                owner = seqs.get(old[slot].owner)
                if owner is not None and new[slot].boundary > owner.num_prompt_tokens:
                    variants["decode_save"] += 1
        for fate in _FATES:
            delta = getattr(after.stats, f"checkpoints_{fate}") - getattr(
                before.stats, f"checkpoints_{fate}"
            )
            if delta > 0:
                variants[f"fate:{fate}@{name}"] += 1
        h = after.state_slots
        if h is not None and h.state_budget == 0 and h.checkpoints:
            variants["borrowed_runtime_slot"] += 1

    # -- hybrid checks on the composite steps ----------------------------------------------

    def _admit(
        self, req: Request, budget: int | None, *, only_if_possible: bool
    ) -> Admission | None:
        adm = super()._admit(req, budget, only_if_possible=only_if_possible)
        if adm is None:
            return None
        snap = self._hybrid_snapshot()
        if snap is None or snap.state_slots is None:
            return adm
        hit = adm.num_cached_tokens > 0
        if hit != (adm.restore_slot is not None):
            self.oracle.fail(
                "HYBRID-HIT", f"{adm.num_cached_tokens} tokens hit, restore {adm.restore_slot}"
            )
        if adm.restore_slot is not None:
            ck = _statuses(snap).get(adm.restore_slot)
            if ck is None or (ck.status, ck.owner, ck.boundary) != (
                "pinned",
                req.seq_id,
                adm.num_cached_tokens,
            ):
                self.oracle.fail(
                    "HYBRID-HIT",
                    f"{req.seq_id!r} restores slot {adm.restore_slot} at "
                    f"{adm.num_cached_tokens}, which holds {ck!r}",
                )
        if dict(snap.state_slots.runtime).get(req.seq_id) != adm.state_slot:
            self.oracle.fail("HYBRID-HIT", f"state slot {adm.state_slot} is not the runtime one")
        return adm

    def _commit(self, seq_id: SeqId, n: int, accepted: tuple[int, ...]) -> bool:
        """Commit, with routed-expert data for each completed block while it is on; then,
        as an engine does, keep the state after the committed tokens."""
        view = self.oracle.view(seq_id)
        if view is None or not self._experts_on:
            done = super()._commit(seq_id, n, accepted)
        else:
            bs = self.block_size
            experts = [
                f"{seq_id}:{j}".encode()
                for j in range(view.num_computed // bs, (view.num_computed + n) // bs)
            ]
            done = not self.oracle.op(
                "commit", lambda c: c.commit(seq_id, n, accepted, routed_experts=experts)
            ).raised
        if done and self._keeps_states:
            self._keep(seq_id)
        return done

    def _keep(self, seq_id: SeqId) -> bool:
        """keep_state at the committed tokens, unless a restore is pending."""
        held = self.oracle.op("runtime_state", _calling("runtime_state", seq_id), pure=True)
        view = self.oracle.view(seq_id)
        if held.raised or held.value is None or view is None:
            return False
        position = view.num_computed
        return not self.oracle.op("keep_state", _calling("keep_state", seq_id, position)).raised

    def _hybrid_snapshot(self) -> CacheState | None:
        """The snapshot the hybrid checks read (the reference's in exact mode); a hybrid
        candidate that renders no ``state_slots`` fails HYBRID-SNAPSHOT."""
        snap = self.oracle.snap_r if self.oracle.snap_r is not None else self.oracle.snap_c
        if snap is not None and snap.state_slots is None:
            self.oracle.fail("HYBRID-SNAPSHOT", "the snapshot of a hybrid cache has no state_slots")
        return snap

    def _check_ref(self, name: str, seq_id: SeqId, value: StateRef | None) -> None:
        """HYBRID-REF: what a hybrid query answers is what the snapshot holds. The pending
        restore is the checkpoint pinned by the sequence (INV-CKPT: at the position where its
        hit ends); the reservation is the one it owns; the runtime state is its runtime slot, at the
        position the snapshot gives (``None`` while the restore is pending)."""
        snap, view = self._hybrid_snapshot(), self.oracle.view(seq_id)
        if snap is None or snap.state_slots is None or view is None:
            return
        h = snap.state_slots
        if name in ("pending_restore", "checkpoint_reservation"):
            status = "pinned" if name == "pending_restore" else "reserved"
            own = [ck for ck in h.checkpoints if ck.owner == seq_id and ck.status == status]
            want: tuple[int | None, int] | None = (
                None if not own else (own[0].slot, own[0].boundary)
            )
        elif name == "runtime_state":
            if h.runtime_positions is None:
                return
            pos = dict(h.runtime_positions).get(seq_id)
            want = None if pos is None else (dict(h.runtime).get(seq_id), pos)
        else:
            return
        got = None if value is None else tuple(value)
        if got != want:
            self.oracle.fail(
                "HYBRID-REF", f"{name}({seq_id!r}) answered {value!r}; the snapshot holds {want}"
            )

    def _restore(self, seq_id: SeqId) -> bool:
        """pending_restore, then restore_issued if one is pending."""
        out = self.oracle.op("pending_restore", lambda c: c.pending_restore(seq_id), pure=True)
        if out.raised:
            return False
        self._check_ref("pending_restore", seq_id, out.value)
        if out.value is None:
            return False
        return not self.oracle.op("restore_issued", lambda c: c.restore_issued(seq_id)).raised

    def _hybrid_history(self, pick: int) -> tuple[int, tuple[int, ...]]:
        if not self._history:
            self._history.append((0, (7, 7, 7, 7, 7), ()))
        ns, tokens, _ = self._history[pick % len(self._history)]
        return ns, tokens

    # -- rules -----------------------------------------------------------------------------

    @rule(seq=DifferentialMachine.seqs)
    @counted
    def issue_restore(self, seq: SeqId) -> None:
        """The engine copied a pending restore's checkpoint into the runtime slot."""
        self._restore(seq)

    @rule(seq=DifferentialMachine.seqs)
    @counted
    def inspect_state(self, seq: SeqId) -> None:
        """state_slot, pending_restore, checkpoint_reservation and runtime_state of a live
        sequence."""
        for name in ("state_slot", "pending_restore", "checkpoint_reservation", "runtime_state"):
            out = self.oracle.op(name, _calling(name, seq), pure=True)
            if not out.raised:
                self._check_ref(name, seq, out.value)

    @rule(seq=DifferentialMachine.seqs, ahead=st.sampled_from((0, 0, 1, 2)))
    @counted
    def keep_state(self, seq: SeqId, ahead: int) -> None:
        """The engine keeps the state after the committed tokens (a late keep, or the first
        one of a run that does not keep after every commit); or, ``ahead`` > 0, the state
        of a draft token past them, which must be refused (it is rolled back, or not yet
        verified)."""
        if not ahead:
            if self._keep(seq):
                type(self).coverage.variants["keep_state"] += 1
            return
        view = self.oracle.view(seq)
        if view is None:
            return
        held = self.oracle.op("runtime_state", _calling("runtime_state", seq), pure=True)
        if held.raised or held.value is None:
            return
        position = view.num_computed + ahead
        # a draft's state must be refused: not a refusal of the workload
        refused = self.oracle.refused_in_rule
        self.oracle.op(
            "keep_state", _calling("keep_state", seq, position), must_raise=InvalidOperation
        )
        self.oracle.refused_in_rule = refused

    @rule()
    @counted
    def toggle_keeping(self) -> None:
        """The engine keeps the runtime state after each commit, or stops doing so (the
        runtime slot then lags behind the committed tokens until the next keep)."""
        self._keeps_states = not self._keeps_states

    @precondition(lambda self: self.caps.routed_experts)
    @rule()
    @counted
    def toggle_experts(self) -> None:
        """Commits carry routed-expert data, or stop carrying it."""
        self._experts_on = not self._experts_on

    @rule(
        target=DifferentialMachine.seqs,
        pick=st.integers(0, 15),
        extra=sampled_tokens(),
        window=st.integers(0, 2),
        budget=budgets(),
        issue=st.booleans(),
        decode=st.integers(0, 3),
    )
    @counted
    def resume(
        self,
        pick: int,
        extra: tuple[int, ...],
        window: int,
        budget: int | None,
        issue: bool,
        decode: int,
    ) -> Targets:
        """Multi-turn on a hybrid model: a remembered history plus new tokens (a hit
        restores a checkpoint), with a recompute window; issue the restore or not, prefill
        by chunks, then decode a few tokens (saving every interval)."""
        ns, tokens = self._hybrid_history(pick)
        req = Request(
            self._new_id(), tokens + extra, self._ns(ns), recompute_blocks=self._window(window)
        )
        adm = self._admit(req, budget, only_if_possible=True)
        if adm is None:
            return multiple()
        if issue:
            self._restore(req.seq_id)
        for _ in range(4):
            if not self._prefill_step(req.seq_id, budget, extra):
                break
        for i in range(decode):
            self._advance(req.seq_id, i % 3, i % 2, extra)
        return req.seq_id if req.seq_id in self.oracle.views else multiple()

    @rule(ns=namespace_ids(), tokens=prompts(), extra=sampled_tokens(), issue=st.booleans())
    @counted
    def save_and_restore_same_step(
        self, ns: int, tokens: tuple[int, ...], extra: tuple[int, ...], issue: bool
    ) -> None:
        """One sequence saves a checkpoint as its prefill commits; in the same step another
        with the same prefix is admitted and restores it, while the first decodes on."""
        tokens = self._prompt(tokens)
        first = Request(self._new_id(), tokens, self._ns(ns))
        adm = self._admit(first, None, only_if_possible=True)
        if adm is None:
            return
        self._commit_prefill(first.seq_id, adm, extra)
        second = Request(self._new_id(), tokens + extra, self._ns(ns))
        if self._admit(second, None, only_if_possible=True) is not None:
            if issue:
                self._restore(second.seq_id)
            self._remember([second.seq_id])
            self._free([second.seq_id])
        self._advance(first.seq_id, 1, 1, extra)
        self._remember([first.seq_id])
        self._free([first.seq_id])

    @rule(ns=namespace_ids(), tokens=prompts(), extra=sampled_tokens(), evict=st.integers(0, 40))
    @counted
    def abort_restore(
        self, ns: int, tokens: tuple[int, ...], extra: tuple[int, ...], evict: int
    ) -> None:
        """A prompt runs and saves; a longer one with its prefix is admitted (its restore
        pins the checkpoint); eviction runs while the restore is pending (the node is held,
        so it cannot go stale); then the owner aborts: the checkpoint is Ready again."""
        tokens = self._prompt(tokens)
        if evict >= 30 and self.caps.evict:  # from an empty cache: the pin is the oldest
            self.oracle.op("evict", lambda c: c.evict(evict))
        first = Request(self._new_id(), tokens, self._ns(ns))
        adm = self._admit(first, None, only_if_possible=True)
        if adm is not None:
            self._commit_prefill(first.seq_id, adm, extra)
            self._remember([first.seq_id])
            self._free([first.seq_id])
        req = Request(self._new_id(), tokens + extra, self._ns(ns))
        adm = self._admit(req, None, only_if_possible=True)
        if adm is None:
            return
        probe = attrs.evolve(req, seq_id="probe")
        if adm.restore_slot is not None:
            type(self).coverage.variants["evict_while_pinned"] += 1
            # while pinned: the same prompt must not restore it (it is not Ready), and a
            # newcomer's runtime slot must not be taken from it (slot pressure skips pins)
            self.oracle.op("match", lambda c: c.match(probe), pure=True)
            others = []
            for i in range(3):
                other = Request(self._new_id(), (*tokens, *extra, i), self._ns(ns + 1))
                got = self._admit(other, None, only_if_possible=False)
                if got is not None:  # its prefill saves a checkpoint newer than the pinned
                    self._commit_prefill(other.seq_id, got, extra)
                    others.append(other.seq_id)
            if others:
                self._free(others)
        if self.caps.evict:
            self.oracle.op("evict", lambda c: c.evict(evict))
        self._free([req.seq_id])
        self.oracle.op("match", lambda c: c.match(probe), pure=True)

    @precondition(bad_inputs_due)
    @rule(kind=st.sampled_from(BAD_HYBRID_KINDS), seq=DifferentialMachine.seqs)
    @counted
    def bad_hybrid_input(self, kind: str, seq: SeqId) -> None:
        """Unknown ids, a restore with none pending, malformed routed-expert data."""
        self._since_bad = 0
        self.oracle.raised_in_rule = True
        type(self).coverage.variants[f"bad_hybrid_input:{kind}"] += 1
        ghost = self._ghost()
        if kind == "restore_not_pending":
            pending = self.oracle.op("pending_restore", lambda c: c.pending_restore(seq), pure=True)
            if pending.raised or pending.value is not None:
                return
            self.oracle.op(
                "restore_issued", lambda c: c.restore_issued(seq), must_raise=InvalidOperation
            )
            return
        if kind.startswith("keep_") and kind != "keep_unknown":
            self._bad_keep(kind, seq)
            return
        if kind.startswith("experts"):
            if not self.caps.routed_experts:
                return
            # three entries for a commit that completes no block, or not a list at all
            bad: Any = [b"x"] * 3 if kind == "experts_count" else "not a list"
            self.oracle.op(
                "commit",
                lambda c: c.commit(seq, 0, (), routed_experts=bad),
                must_raise=InvalidRequest,
            )
            return
        name = {
            "restore_unknown": "restore_issued",
            "state_slot_unknown": "state_slot",
            "pending_restore_unknown": "pending_restore",
            "reservation_unknown": "checkpoint_reservation",
            "runtime_state_unknown": "runtime_state",
            "keep_unknown": "keep_state",
        }[kind]
        args = (ghost, 0) if name == "keep_state" else (ghost,)
        self.oracle.op(
            name,
            lambda c: getattr(c, name)(*args),
            pure=name not in ("restore_issued", "keep_state"),
            must_raise=UnknownSequence,
        )

    def _bad_keep(self, kind: str, seq: SeqId) -> None:
        """keep_state at a position no consistent engine keeps: past the committed tokens
        (a rejected or unverified draft's state), before them (stale), negative, or with
        the restore still to issue."""
        view = self.oracle.view(seq)
        held = self.oracle.op("runtime_state", _calling("runtime_state", seq), pure=True)
        if view is None or held.raised:
            return
        pending = held.value is None
        c = view.num_computed
        if kind == "keep_while_restoring":
            if pending:
                self.oracle.op(
                    "keep_state", _calling("keep_state", seq, c), must_raise=InvalidOperation
                )
            return
        if kind == "keep_negative":
            self.oracle.op("keep_state", _calling("keep_state", seq, -1), must_raise=InvalidRequest)
            return
        position = c + 1 + (view.num_reserved - c) // 2 if kind.endswith("committed") else c - 1
        if position < 0:
            return
        self.oracle.op(
            "keep_state", _calling("keep_state", seq, position), must_raise=InvalidOperation
        )


def build_hybrid_machine(
    name: str,
    make_pair: PairFactory,
    *,
    num_blocks: tuple[int, int] = (4, 24),
    block_sizes: tuple[int, int] = (1, 4),
    max_num_seqs: tuple[int, int] = (1, 4),
    state_budgets: tuple[int, int] = (0, 3),
    caps: Capabilities | None = None,
    block_size_choices: tuple[int, ...] | None = None,
    skip_rules: Collection[str] = (),
    ignored_checks: Collection[str] = (),
) -> type[HybridMachine]:
    """A runnable hybrid machine class (``cls.TestCase``) with its own coverage counters.

    Each run draws the pool, ``max_num_seqs``, ``state_budget`` and a decode interval of
    0 to 3 blocks. ``caps`` (default: prefixkv's hybrid caches, with checkpoints and routed
    experts), ``block_size_choices``, ``skip_rules`` and ``ignored_checks`` are those of
    :func:`~.differential.build_machine`; this is the machine the conformance kit runs
    under the ``checkpoints`` capability.
    """
    hybrid_caps = Capabilities(checkpoints=True, routed_experts=True) if caps is None else caps
    sizes = st.sampled_from(block_size_choices) if block_size_choices else st.integers(*block_sizes)

    @initialize(
        num_blocks=st.integers(*num_blocks),
        block_size=sizes,
        record_events=st.booleans() if hybrid_caps.events else st.just(False),
        seqs_max=st.integers(*max_num_seqs),
        # a budget of 0 (checkpoints only in borrowed runtime slots) twice as often
        budget=st.integers(state_budgets[0] - 1, state_budgets[1]).map(
            lambda b: max(b, state_budgets[0])
        ),
        interval=st.integers(0, 3),
        experts=st.booleans() if hybrid_caps.routed_experts else st.just(False),
        keeps=st.booleans(),
    )
    @counted
    def init(
        self: HybridMachine,
        num_blocks: int,
        block_size: int,
        record_events: bool,
        seqs_max: int,
        budget: int,
        interval: int,
        experts: bool,
        keeps: bool,
    ) -> None:
        """Build the pair on a freshly drawn pool and state-slot pool."""
        cfg = HybridPoolConfig(
            num_blocks, block_size, record_events, seqs_max, budget, interval * block_size
        )
        self._experts_on, self._keeps_states = experts, keeps
        self._start(cfg)
        type(self).last_calls[1] = (
            f"cache = make(num_blocks={num_blocks}, block_size={block_size}, "
            f"record_events={record_events}, max_num_seqs={seqs_max}, "
            f"state_budget={budget}, decode_state_interval={interval * block_size})"
        )
        variants = type(self).coverage.variants
        variants[f"state_budget={budget}"] += 1
        variants[f"decode_state_interval={'on' if interval else 'off'}"] += 1

    description = MachineDescription(
        name,
        make_pair,
        init,
        caps=hybrid_caps,
        ignored_checks=frozenset(ignored_checks),
        skip_rules=frozenset(skip_rules),
    )
    return machine_class(HybridMachine, description)


def _calling(name: str, *args: object) -> Callable[[object], object]:
    """``cache.<name>(*args)`` as an operation for the oracle."""
    return lambda cache: getattr(cache, name)(*args)
