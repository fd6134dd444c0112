"""Obligations of the small, self-contained models (:mod:`.spans`, :mod:`.joint`).

Each such model is a handful of Z3 terms: no quantifiers, bounded slots, unbounded
integers. What they share is how an obligation is stated, proved, shown, and broken on
purpose, so the command line and the tests treat every model alike:

* an :class:`Obligation` is ``hypothesis ==> conclusion``; it is proved when
  ``hypothesis & not conclusion`` is unsatisfiable, under a fixed ``rlimit`` and seed, so
  "proved" does not depend on the machine's speed;
* a :class:`Witness` is a satisfiable ``hypothesis & scenario`` (non-vacuity): the step is
  possible, in a case that exercises the property;
* a :class:`Variant` is the same model with one deliberate bug; its named obligation must
  yield a counterexample.

NOTE: this module sits beside the model packages, not in one: the span and joint models
share it, and the KV and checkpoint models (quantified, with provers of their own) do not
use it, so a change here touches the two small models and nothing else. Their suites are
built by :func:`prefixkv.proofs.suite.small_suite`.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import z3

from .terms import Evaluator, Term

__all__ = [
    "DEFAULT_RLIMIT",
    "Obligation",
    "ScenarioWitnesses",
    "SmallModel",
    "SmallRow",
    "Variant",
    "VariantResult",
    "Witness",
    "all_of",
    "any_of",
    "check_variant",
    "prove_all",
    "prove_one",
    "witness_one",
]

DEFAULT_RLIMIT = 20_000_000


def all_of(xs: Sequence[Term]) -> Term:
    """The conjunction of ``xs``; true when there are none."""
    return z3.And(*xs) if xs else z3.BoolVal(True)


def any_of(xs: Sequence[Term]) -> Term:
    """The disjunction of ``xs``; false when there are none."""
    return z3.Or(*xs) if xs else z3.BoolVal(False)


Show = Callable[[Evaluator], str]
"""Renders a counterexample or a witness, given the model's evaluation function."""


@dataclass(frozen=True)
class Obligation:
    """``hyp ==> concl`` for property ``prop`` over ``operation``."""

    prop: str
    operation: str
    kind: str  # "state" (an invariant of the successor), "step" (a fact of the step), ...
    hyp: Term
    concl: Term
    show: Show


@dataclass(frozen=True)
class Witness:
    """``formula`` is the operation's hypotheses plus a scenario that exercises them."""

    operation: str
    scenario: str
    formula: Term
    show: Show


class SmallModel(Protocol):
    """What the command line needs of a small model."""

    name: str

    def describe(self) -> str: ...

    def obligations(self, ops: Sequence[str] | None = None) -> list[Obligation]: ...

    def witnesses(self, ops: Sequence[str] | None = None) -> list[Witness]: ...


class ScenarioWitnesses(abc.ABC):
    """Non-vacuity by scenario: for every operation but ``init``, a satisfiable formula of a
    state that satisfies the invariant, the step's guard, and what the operation's scenario
    exercises. A small model supplies its states, arguments, steps and scenarios."""

    @abc.abstractmethod
    def _ops(self, ops: Sequence[str] | None) -> list[str]:
        """The model's operations among ``ops`` (all of them when None), in its order."""

    @abc.abstractmethod
    def fresh(self, p: str) -> Term:
        """A state of fresh variables named ``p...``."""

    @abc.abstractmethod
    def fresh_args(self, op: str, p: str = "a.") -> Term:
        """Fresh arguments of ``op``."""

    @abc.abstractmethod
    def step(self, op: str, x: Term, a: Term) -> Term:
        """The transition of ``op`` from ``x``: its ``guard`` and ``post``-state."""

    @abc.abstractmethod
    def inv(self, x: Term) -> Term:
        """The model's invariant of state ``x``."""

    @abc.abstractmethod
    def scenario(self, op: str, x: Term, a: Term, stp: Term) -> tuple[str, Term]:
        """The name and formula of the case of ``op`` that the witness must exercise."""

    @abc.abstractmethod
    def shower(self, x: Term, op: str | None, a: Term, post: Term) -> Show:
        """Renders a pre-state, a step and its post-state in a solver model."""

    def witnesses(self, ops: Sequence[str] | None = None) -> list[Witness]:
        out: list[Witness] = []
        for op in self._ops(ops):
            if op == "init":
                continue
            pre = self.fresh("w.")
            a = self.fresh_args(op, "wa.")
            stp = self.step(op, pre, a)
            name, extra = self.scenario(op, pre, a, stp)
            formula = z3.And(self.inv(pre), stp.guard, extra)
            out.append(Witness(op, name, formula, self.shower(pre, op, a, stp.post)))
        return out


@dataclass
class SmallRow:
    model: str
    invariant: str
    operation: str
    kind: str
    status: str  # proved | counterexample | unknown
    seconds: float
    non_vacuous: bool | None = None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "invariant": self.invariant,
            "operation": self.operation,
            "kind": self.kind,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "non_vacuous": self.non_vacuous,
            **({"detail": self.detail} if self.detail else {}),
        }


def _solver(rlimit: int, seed: int) -> z3.Solver:
    # Equalities first: the successors are chains of If over small integers (as in
    # checkpoints._solver), so solving their definitions away before SMT is cheap.
    s = z3.Then("simplify", "propagate-values", "solve-eqs", "smt").solver()
    s.set("rlimit", rlimit, "random_seed", seed)
    return s


def prove_one(
    model_name: str, ob: Obligation, rlimit: int = DEFAULT_RLIMIT, seed: int = 0
) -> SmallRow:
    t0 = time.perf_counter()
    s = _solver(rlimit, seed)
    s.add(ob.hyp, z3.Not(ob.concl))
    r = s.check()
    status, detail = "proved", ""
    if r == z3.sat:
        mdl = s.model()
        status = "counterexample"
        detail = ob.show(lambda x: mdl.eval(x, model_completion=True))
    elif r != z3.unsat:
        status, detail = "unknown", s.reason_unknown()
    return SmallRow(
        model_name, ob.prop, ob.operation, ob.kind, status, time.perf_counter() - t0, detail=detail
    )


def witness_one(w: Witness, rlimit: int = DEFAULT_RLIMIT, seed: int = 0) -> tuple[str, str]:
    """(sat/unsat/unknown, the witness when sat)."""
    s = _solver(rlimit, seed)
    s.add(w.formula)
    r = s.check()
    if r == z3.sat:
        mdl = s.model()
        return "sat", w.show(lambda x: mdl.eval(x, model_completion=True))
    return str(r), ""


@dataclass
class ModelRun:
    rows: list[SmallRow] = field(default_factory=list)
    witnesses: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(r.status == "proved" and r.non_vacuous is not False for r in self.rows) and all(
            w[1] == "sat" for w in self.witnesses.values()
        )


def prove_all(
    model: SmallModel,
    ops: Sequence[str] | None = None,
    *,
    rlimit: int = DEFAULT_RLIMIT,
    seed: int = 0,
    witnesses: bool = True,
    progress: Callable[[SmallRow], None] | None = None,
) -> ModelRun:
    """Every obligation of ``model`` (over ``ops``), each row marked non-vacuous when its
    operation's witness is satisfiable."""
    run = ModelRun()
    if witnesses:
        for w in model.witnesses(ops):
            status, text = witness_one(w, rlimit, seed)
            run.witnesses[w.operation] = (w.scenario, status, text)
    for ob in model.obligations(ops):
        row = prove_one(model.name, ob, rlimit, seed)
        if ob.operation in run.witnesses:
            row.non_vacuous = run.witnesses[ob.operation][1] == "sat"
        run.rows.append(row)
        if progress:
            progress(row)
    return run


@dataclass(frozen=True)
class Variant:
    """A deliberately broken ``model`` whose obligation ``(prop, operation)`` must fail."""

    name: str
    prop: str
    operation: str
    kind: str  # broken transition | dropped conjunct | off-by-one
    description: str
    model: Callable[[], SmallModel]


@dataclass
class VariantResult:
    variant: Variant
    row: SmallRow

    @property
    def caught(self) -> bool:
        return self.row.status == "counterexample"


def check_variant(v: Variant, rlimit: int = DEFAULT_RLIMIT, seed: int = 0) -> VariantResult:
    model = v.model()
    picked = [
        ob
        for ob in model.obligations([v.operation])
        if (ob.prop, ob.operation) == (v.prop, v.operation)
    ]
    if not picked:
        raise ValueError(f"variant {v.name}: no obligation {v.prop} / {v.operation}")
    rows = [prove_one(model.name, ob, rlimit, seed) for ob in picked]
    bad = [r for r in rows if r.status == "counterexample"]
    return VariantResult(v, bad[0] if bad else rows[0])
