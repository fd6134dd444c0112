"""Rules for the engine-shaped calls: ``advance`` (one fused call per sequence per decode
step), ``advance_batch`` (a whole scheduler step) and ``advance_columns`` (the same step as
parallel columns), bad inputs included.

A mixin over :class:`~.differential.DifferentialMachine`, so the fused calls
interleave with every per-call rule in the same runs and the usual checks apply after each
of them: equal results and errors, equal snapshots, every invariant, and INV-TXN when a call
raises (an ``advance`` whose reservation fails must also undo its commit and rollback).

``advance_batch`` returns a :class:`~prefixkv.spec.BatchOutcome` that carries an exception
object; the rules compare its applied prefix, the error's type and the failing sequence.

Build a machine with :func:`build_step_machine` (same arguments as ``build_machine``).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from prefixkv.spec import (
    BatchOutcome,
    DecodeStep,
    DuplicateSequence,
    InvalidOperation,
    InvalidRequest,
    PrefixCacheError,
    SeqId,
    SeqView,
    UnknownSequence,
)
from prefixkv.spec.invariant_ids import InvariantId

from ..lockstep import Outcome
from .checks import CheckFailed, bad_inputs_due, counted
from .differential import DifferentialMachine, build_machine
from .factories import PairFactory
from .strategies import sampled_tokens

if TYPE_CHECKING:
    _Base = DifferentialMachine
else:
    _Base = object

__all__ = [
    "BAD_COLUMN_KINDS",
    "BAD_STEP_KINDS",
    "StepCallRules",
    "build_step_machine",
    "decode_step",
]

#: Malformed engine-shaped calls driven by ``bad_step_call``, and the error each must raise
#: whatever the state (``None``: any PrefixCacheError).
BAD_STEP_KINDS: dict[str, type[PrefixCacheError] | None] = {
    "advance:unknown": UnknownSequence,
    "advance:negative_rejected": InvalidRequest,
    "advance:bool_reserve": InvalidRequest,
    "advance:float_computed": InvalidRequest,
    "advance:bad_tokens": InvalidRequest,
    "advance:commit_past_reserved": InvalidOperation,
    "advance:reject_past_computed": InvalidOperation,
    "advance:reserve_past_pool": None,  # OutOfBlocks, or a chunk rule while prefilling
    "batch:duplicate": DuplicateSequence,
    "batch:not_steps": InvalidRequest,
    "batch:not_iterable": InvalidRequest,
    "batch:one_step": InvalidRequest,
    "batch:bad_id": InvalidRequest,
}

#: Malformed ``advance_columns`` calls driven by ``bad_columns_call``, and the error each
#: must raise whatever the state.
BAD_COLUMN_KINDS: dict[str, type[PrefixCacheError]] = {
    "columns:ragged": InvalidRequest,
    "columns:ragged_counts": InvalidRequest,
    "columns:not_column": InvalidRequest,
    "columns:bool_count": InvalidRequest,
    "columns:duplicate": DuplicateSequence,
    "columns:bad_id": InvalidRequest,
    "columns:bad_id_alone": InvalidRequest,
}


def decode_step(view: SeqView, k: int, a: int, sampled: tuple[int, ...]) -> DecodeStep | None:
    """The engine's next decode step for a sequence past its prompt, or None.

    The forward wrote the pending token (if any) and the drafts in the unwritten slots;
    ``a`` drafts are accepted plus a bonus token, the rest are rolled back, and ``k + 1``
    slots are reserved for the next forward (the new pending token and ``k`` drafts).
    """
    c, r, known = view.num_computed, view.num_reserved, len(view.token_ids)
    if r < view.num_prompt_tokens or known - c >= 2:
        return None  # still prefilling
    pending = known - c
    unwritten = r - c
    if unwritten < pending:  # nothing reserved for the pending token yet
        return DecodeStep(view.seq_id, 0, (), 0, pending + k)
    drafts = unwritten - pending
    accepted = min(a, drafts)
    tokens = (sampled * (accepted + 1))[: accepted + 1]
    return DecodeStep(view.seq_id, pending + accepted, tokens, drafts - accepted, k + 1)


def _summary(outcome: BatchOutcome) -> tuple[object, ...]:
    """What two caches' outcomes must agree on (an exception object compares by id)."""
    return (
        outcome.new_blocks,
        type(outcome.error).__name__ if outcome.error is not None else None,
        outcome.failed_seq_id,
    )


class StepCallRules(_Base):
    """``advance`` and ``advance_batch`` rules (see the module doc)."""

    def _advance_call(self, step: DecodeStep) -> bool:
        out = self._op(
            "advance",
            lambda c: c.advance(
                step.seq_id,
                step.num_computed,
                step.accepted_tokens,
                num_rejected=step.num_rejected,
                num_reserve=step.num_reserve,
            ),
        )
        return not out.raised

    @rule(
        seq=DifferentialMachine.seqs,
        k=st.integers(0, 3),
        a=st.integers(0, 3),
        sampled=sampled_tokens(),
    )
    @counted
    def fused_decode(self, seq: SeqId, k: int, a: int, sampled: tuple[int, ...]) -> None:
        """One decode step of a live sequence as a single ``advance`` (speculative when
        ``k`` > 0); a sequence still prefilling takes the per-call step instead. When the
        pool is full, the newest other sequence is preempted and the step retried."""
        view = self._view(seq)
        if view is None:
            return
        step = decode_step(view, k, a, sampled)
        if step is None:
            self._advance(seq, k, a, sampled)
            return
        if self._advance_call(step):
            return
        victims = [s for s in self._views if s != seq]
        if victims and self._free([victims[-1]]):
            self._advance_call(step)

    @rule(
        plan=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=4),
        sampled=sampled_tokens(),
        fail_at=st.sampled_from([None, None, 0, 1, 2]),
    )
    @counted
    def batched_step(
        self, plan: list[tuple[int, int]], sampled: tuple[int, ...], fail_at: int | None
    ) -> None:
        """A scheduler step over up to four decoding sequences in one ``advance_batch``;
        ``fail_at`` puts an over-committing step there, so a prefix applies."""
        steps = self._planned_steps(plan, sampled, fail_at)
        if not steps:
            return
        out = self._op("advance_batch", lambda c: _summary(c.advance_batch(steps)))
        self._check_batch("advance_batch", out, steps, fail_at)

    @rule(
        plan=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=4),
        sampled=sampled_tokens(),
        fail_at=st.sampled_from([None, None, 0, 1, 2]),
        form=st.sampled_from(["lists", "tuples", "int_counts", "arrays"]),
    )
    @counted
    def columnar_step(
        self,
        plan: list[tuple[int, int]],
        sampled: tuple[int, ...],
        fail_at: int | None,
        form: str,
    ) -> None:
        """``batched_step`` through ``advance_columns``: the same steps as parallel columns
        (lists, tuples, an int for every step's counts where they agree, or arrays); the
        outcome must be the one ``advance_batch`` of those steps gives."""
        steps = self._planned_steps(plan, sampled, fail_at)
        if not steps:
            return
        cols: list[Any] = [list(c) for c in zip(*steps, strict=True)]
        if form == "tuples":
            cols = [tuple(c) for c in cols]
        elif form == "int_counts":
            cols[3:] = [c[0] if len(set(c)) == 1 else c for c in cols[3:]]
        elif form == "arrays":
            cols[1], cols[3], cols[4] = (array("q", cols[i]) for i in (1, 3, 4))
        type(self).coverage.variants[f"columnar_step:{form}"] += 1
        out = self._op("advance_columns", lambda c: _summary(c.advance_columns(*cols)))
        self._check_batch("advance_columns", out, steps, fail_at)

    def _planned_steps(
        self, plan: list[tuple[int, int]], sampled: tuple[int, ...], fail_at: int | None
    ) -> list[DecodeStep]:
        """One decode step per live sequence in ``plan``'s order (those ``plan`` leaves a
        step for); at ``fail_at``, a step that commits past its reservation instead."""
        steps: list[DecodeStep] = []
        for view, (k, a) in zip(list(self._views.values()), plan, strict=False):
            step = decode_step(view, k, a, sampled)
            if step is not None:
                steps.append(step)
        if fail_at is not None and fail_at < len(steps):
            bad = steps[fail_at]
            view = self._views[bad.seq_id]
            over = view.num_reserved - view.num_computed + 1
            steps[fail_at] = DecodeStep(bad.seq_id, over, (1,) * over, 0, 1)
        return steps

    def _check_batch(
        self, name: str, out: Outcome, steps: list[DecodeStep], fail_at: int | None
    ) -> None:
        """A batch call reports, never raises, and applies a prefix: never a step past the
        failing one, which fails alone with ``InvalidOperation`` when it is reached."""
        if out.raised:
            raise CheckFailed("BATCH", f"{name} raised instead of reporting: {out!r}")
        applied, error, failed = out.value
        if fail_at is not None and fail_at < len(steps):
            # An earlier step may run out of blocks first; the bad one never applies.
            if len(applied) > fail_at:
                raise CheckFailed("BATCH", f"steps past the failure applied: {out.value!r}")
            reached = len(applied) == fail_at
            if reached and (error != "InvalidOperation" or failed != steps[fail_at].seq_id):
                raise CheckFailed("BATCH", f"step {fail_at} must fail alone, got {out.value!r}")
        if error is not None:
            self._rule_raised = True

    @precondition(bad_inputs_due)
    @rule(
        kind=st.sampled_from(sorted(BAD_STEP_KINDS)),
        seq=DifferentialMachine.seqs,
        n=st.integers(0, 3),
    )
    @counted
    def bad_step_call(self, kind: str, seq: SeqId, n: int) -> None:
        """Malformed fused and batched calls raise a typed error and change nothing."""
        self._since_bad = 0
        self._rule_raised = True
        view = self._view(seq)
        assert view is not None and self.cfg is not None
        c, r, known = view.num_computed, view.num_reserved, len(view.token_ids)
        commit = max(0, min(n, r - c, known - c))  # a valid commit, undone by the failure
        ghost = self._ghost()
        pool = self.cfg.num_blocks * self.cfg.block_size
        ops: dict[str, Callable[[Any], object]] = {  # bad inputs on purpose: an untyped cache
            "advance:unknown": lambda x: x.advance(ghost, 0),
            "advance:negative_rejected": lambda x: x.advance(seq, commit, num_rejected=-1),
            "advance:bool_reserve": lambda x: x.advance(seq, commit, num_reserve=True),
            "advance:float_computed": lambda x: x.advance(seq, 1.0),
            "advance:bad_tokens": lambda x: x.advance(seq, 0, (1, -2)),
            "advance:commit_past_reserved": lambda x: x.advance(
                seq, r - c + 1, (1,) * max(1, r - known + 1)
            ),
            "advance:reject_past_computed": lambda x: x.advance(
                seq, commit, num_rejected=r - c - commit + 1
            ),
            "advance:reserve_past_pool": lambda x: x.advance(seq, commit, num_reserve=pool + 1),
            "batch:duplicate": lambda x: x.advance_batch(
                [DecodeStep(seq, 0, (), 0, 0), DecodeStep(seq, 0, (), 0, 0)]
            ),
            "batch:not_steps": lambda x: x.advance_batch([(seq, 0)]),
            "batch:not_iterable": lambda x: x.advance_batch(12345),
            "batch:one_step": lambda x: x.advance_batch(DecodeStep(seq, 0)),
            # a bad id after a valid step: refused whole, before the valid step applies
            "batch:bad_id": lambda x: x.advance_batch(
                [DecodeStep(seq, 0, (), 0, 0), DecodeStep(True, 0, (), 0, 0)]
            ),
        }
        type(self).coverage.variants[f"bad_step_call:{kind}"] += 1
        must = BAD_STEP_KINDS[kind]
        self._op(kind.split(":")[0], ops[kind], must_raise=must or PrefixCacheError)
        if kind == "advance:reserve_past_pool" and not r < view.num_prompt_tokens:
            view = self._view(seq)
            if view is None or (view.num_computed, view.num_reserved) != (c, r):
                raise CheckFailed(InvariantId.TXN, "a failed advance changed its sequence")

    @precondition(bad_inputs_due)
    @rule(kind=st.sampled_from(sorted(BAD_COLUMN_KINDS)), seq=DifferentialMachine.seqs)
    @counted
    def bad_columns_call(self, kind: str, seq: SeqId) -> None:
        """Malformed columns raise a typed error before any step applies (the valid steps
        listed before a bad id or a duplicate included), and change nothing."""
        self._since_bad = 0
        self._rule_raised = True
        cols: dict[str, tuple[Any, ...]] = {
            "columns:ragged": ([seq], [0, 0], [()]),
            "columns:ragged_counts": ([seq], [0], [()], 0, [0, 0]),
            "columns:not_column": (seq, [0], [()]),
            "columns:bool_count": ([seq], [0], [()], 0, True),
            "columns:duplicate": ([seq, seq], [0, 0], [(), ()], 0, 0),
            "columns:bad_id": ([seq, True], [0, 0], [(), ()], 0, 0),
            "columns:bad_id_alone": ([True], [0], [()], 0, 0),
        }
        type(self).coverage.variants[f"bad_columns_call:{kind}"] += 1
        args = cols[kind]
        self._op(
            "advance_columns", lambda x: x.advance_columns(*args), must_raise=BAD_COLUMN_KINDS[kind]
        )


def build_step_machine(
    name: str, make_pair: PairFactory, **kwargs: Any
) -> type[DifferentialMachine]:
    """``build_machine`` with the engine-shaped call rules mixed in."""
    base = build_machine(name, make_pair, **kwargs)
    namespace = {"__module__": base.__module__, "__qualname__": name}
    machine: type[DifferentialMachine] = type(name, (StepCallRules, base), namespace)
    return machine
