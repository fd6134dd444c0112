"""Cache on == cache off: the end-to-end check that the prefix cache never changes results.

The same workload runs twice through the same engine configuration: once with the cache on,
once with every admission in a namespace of its own (nothing can be reused, everything is
computed). With greedy decoding the generated tokens must be identical, and the logits of
every generated token must agree within the kernels' tolerance: the cached prefix's KV was
computed by another request, in another batch, possibly in chunks, and may differ from a
fresh computation only by floating-point reassociation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from .config import EngineConfig
from .engine import Engine, RunResult, Turn
from .errors import EqualityMismatch
from .step import StepPlan

__all__ = ["TOLERANCE", "EqualityReport", "check_equality", "compare_runs"]

#: Largest allowed ``abs(logit(on) - logit(off))`` per dtype. Logits are of order 1..10; fp32
#: reassociation noise is ~1e-6 relative, half precision ~1e-3.
TOLERANCE = {"float32": 1e-3, "float16": 5e-2, "bfloat16": 2e-1}


@attrs.frozen
class EqualityReport:
    on: RunResult
    off: RunResult
    max_logit_diff: float
    tokens_compared: int


def compare_runs(on: RunResult, off: RunResult, atol: float) -> tuple[float, int]:
    """Raise :class:`EqualityMismatch` unless tokens are equal and logits within ``atol``.

    Returns the largest logit difference and the number of generated tokens compared.
    """
    if on.requests.keys() != off.requests.keys():
        raise EqualityMismatch("the two runs served different requests")
    worst = 0.0
    compared = 0
    for rid, a in on.requests.items():
        b = off.requests[rid]
        if a.output != b.output:
            at = next(
                (i for i, (x, y) in enumerate(zip(a.output, b.output, strict=False)) if x != y),
                min(len(a.output), len(b.output)),
            )
            raise EqualityMismatch(
                f"request {rid!r}: tokens differ at output position {at}: cache on "
                f"{list(a.output[at : at + 4])}..., cache off {list(b.output[at : at + 4])}..."
            )
        compared += len(a.output)
        la, lb = on.logits.get(rid), off.logits.get(rid)
        if la is None or lb is None:
            continue
        if len(la) != len(lb):
            raise EqualityMismatch(f"request {rid!r}: {len(la)} vs {len(lb)} logit rows")
        for i, (x, y) in enumerate(zip(la, lb, strict=True)):
            diff = float((x - y).abs().max())
            worst = max(worst, diff)
            if not diff <= atol:  # also catches NaN
                raise EqualityMismatch(
                    f"request {rid!r}: logits of output token {i} differ by {diff:.3g} "
                    f"> tolerance {atol:.3g}"
                )
    return worst, compared


def check_equality(
    workload: Sequence[Turn],
    config: EngineConfig,
    *,
    atol: float | None = None,
    on_step: Callable[[Engine, StepPlan], None] | None = None,
) -> EqualityReport:
    """Run ``workload`` with the cache on and off; raise :class:`EqualityMismatch` if they
    disagree. ``on_step`` runs after each step of the cache-on run only (tests use it to
    break the cache on purpose)."""
    tol = TOLERANCE[config.model.dtype] if atol is None else atol
    on = Engine(attrs.evolve(config, cache_enabled=True, record_logits=True)).run(
        workload, on_step=on_step
    )
    off = Engine(attrs.evolve(config, cache_enabled=False, record_logits=True)).run(workload)
    worst, compared = compare_runs(on, off, tol)
    return EqualityReport(on=on, off=off, max_logit_diff=worst, tokens_compared=compared)
