"""One driver for the drift checks: random runs against the spec, and seeded drifts.

Each model's drift module (:mod:`.kv.drift`, :mod:`.spans.drift`, :mod:`.ckpt.drift`,
:mod:`.joint.drift`) says how to start one random run and how to take one step of it. This
module runs such steps until a budget of checks is spent (:func:`drive`), and turns a run
against a deliberately drifted model or spec into a :class:`SeededResult` (:func:`seeded`):
a seeded drift is caught when the run raises :class:`DriftError`.

NOTE: it sits beside the model packages because all four drift checks use it; what is one
model's (how to abstract its spec, which calls to draw) stays in that model's package.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import z3
import z3.z3core as z3core

__all__ = ["DriftError", "SeededResult", "Substituter", "drive", "seeded"]


class DriftError(AssertionError):
    """The model and the spec disagree on one step (or on whether a state is valid)."""


class Stepper(Protocol):
    """One random run: each :meth:`step` drives the spec once and checks the model."""

    def step(self) -> None: ...


class Report(Protocol):
    """A drift report: how many checks so far, and how long the run took."""

    seconds: float


R = TypeVar("R", bound=Report)


def drive(
    report: R,
    budget: int,
    count: Callable[[R], int],
    start: Callable[[random.Random], Stepper],
    *,
    seed: int = 0,
    steps_per_run: int = 40,
) -> R:
    """Start random runs (``start``) and step them, ``steps_per_run`` steps at most each,
    until ``count(report)`` reaches ``budget``; ``report`` is updated in place, so a caller
    sees how far a run got when it raises :class:`DriftError`."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    while count(report) < budget:
        run = start(rng)
        for _ in range(steps_per_run):
            run.step()
            if count(report) >= budget:
                break
    report.seconds = time.perf_counter() - t0
    return report


@dataclass
class SeededResult:
    """A seeded drift's outcome: ``checks`` is how many checks it took to catch it (or the
    whole budget, when it was not caught)."""

    name: str
    description: str
    caught: bool
    checks: int
    message: str = ""


def seeded(
    name: str,
    description: str,
    report: R,
    count: Callable[[R], int],
    run: Callable[[R], object],
    *,
    counts_the_catch: bool = False,
) -> SeededResult:
    """Run ``run(report)``; the drift is caught when it raises :class:`DriftError`.

    ``counts_the_catch``: the failing check is not yet in ``count(report)`` when the run
    raises, so one is added for it.
    """
    try:
        run(report)
    except DriftError as e:
        first = str(e).splitlines()[0] if str(e) else ""
        return SeededResult(name, description, True, count(report) + counts_the_catch, first)
    return SeededResult(name, description, False, count(report), "not caught")


class Substituter:
    """``simplify(substitute(expr, vars -> values))`` through the C API.

    The Python wrapper checks every pair's sorts and builds a fresh numeral per value,
    which costs more than Z3's own work here. The variables are fixed, so their array is
    built once; numerals are cached.
    """

    def __init__(self, variables: Sequence[Any]) -> None:
        self.vars = list(variables)
        self.n = len(self.vars)
        self.ctx = z3.main_ctx()
        self._from = (z3core.Ast * self.n)(*[v.as_ast() for v in self.vars])
        self.is_bool = [z3.is_bool(v) for v in self.vars]
        self._keep: list[Any] = []  # numerals stay alive while their pointers are cached
        self._ptr: dict[tuple[bool, int], Any] = {}

    def ptr(self, is_bool: bool, value: int | bool) -> Any:
        key = (is_bool, int(value))
        p = self._ptr.get(key)
        if p is None:
            c = z3.BoolVal(bool(value)) if is_bool else z3.IntVal(int(value))
            self._keep.append(c)
            p = self._ptr[key] = c.as_ast()
        return p

    def __call__(self, expr: Any, values: Sequence[int | bool]) -> Any:
        ptrs = self._ptr
        to = (z3core.Ast * self.n)(
            *[
                ptrs.get((b, int(v))) or self.ptr(b, v)
                for b, v in zip(self.is_bool, values, strict=True)
            ]
        )
        ref = self.ctx.ref()
        r = z3.z3._to_expr_ref(
            z3core.Z3_substitute(ref, expr.as_ast(), self.n, self._from, to), self.ctx
        )
        return z3.z3._to_expr_ref(z3core.Z3_simplify(ref, r.as_ast()), self.ctx)
