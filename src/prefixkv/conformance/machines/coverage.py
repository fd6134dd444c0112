"""Rule-coverage instrumentation for the differential machines.

Every machine class built by :func:`~.differential.build_machine` owns one
:class:`RuleCoverage`. Rules report each firing and whether any operation in it raised; the
machine reports every cache operation it ran. A test then asserts that every rule fired, that
invalid steps stay rare, and prints the rule executions per second.
"""

from __future__ import annotations

import time
from collections import Counter

import attrs

__all__ = ["CoverageReport", "RuleCoverage"]


@attrs.frozen
class CoverageReport:
    rules: dict[str, int]
    invalid_rules: dict[str, int]
    #: Firings in which an operation was refused for another reason than the state
    #: (``OutOfBlocks`` and ``CacheBusy`` answer about the pool, not the workload).
    refused_rules: dict[str, int]
    ops: dict[str, int]
    op_errors: dict[str, int]
    variants: dict[str, int]
    seconds: float

    @property
    def total_rules(self) -> int:
        return sum(self.rules.values())

    @property
    def invalid_fraction(self) -> float:
        """Fraction of rule firings in which at least one cache operation raised."""
        return sum(self.invalid_rules.values()) / max(1, self.total_rules)

    @property
    def rules_per_second(self) -> float:
        return self.total_rules / self.seconds if self.seconds else 0.0

    def never_fired(self, expected: list[str]) -> list[str]:
        return [name for name in expected if not self.rules.get(name)]

    def format(self) -> str:
        lines = [
            f"{self.total_rules} rule executions in {self.seconds:.1f} s "
            f"({self.rules_per_second:.0f}/s), {sum(self.ops.values())} cache operations, "
            f"invalid steps {self.invalid_fraction:.1%}",
        ]
        for name, n in sorted(self.rules.items(), key=lambda kv: -kv[1]):
            bad = self.invalid_rules.get(name, 0)
            lines.append(f"  {name:<24} {n:>7}  raised in {bad:>6}")
        lines.append("  operations (calls / raised):")
        for name, n in sorted(self.ops.items(), key=lambda kv: -kv[1]):
            lines.append(f"    {name:<22} {n:>7} / {self.op_errors.get(name, 0)}")
        if self.variants:
            lines.append(
                "  variants: " + ", ".join(f"{k}={v}" for k, v in sorted(self.variants.items()))
            )
        return "\n".join(lines)


class RuleCoverage:
    """Counters shared by every run of one machine class."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.rules: Counter[str] = Counter()
        self.invalid_rules: Counter[str] = Counter()
        self.refused_rules: Counter[str] = Counter()
        self.ops: Counter[str] = Counter()
        self.op_errors: Counter[str] = Counter()
        self.variants: Counter[str] = Counter()
        self.started = time.perf_counter()

    def report(self) -> CoverageReport:
        return CoverageReport(
            rules=dict(self.rules),
            invalid_rules=dict(self.invalid_rules),
            refused_rules=dict(self.refused_rules),
            ops=dict(self.ops),
            op_errors=dict(self.op_errors),
            variants=dict(self.variants),
            seconds=time.perf_counter() - self.started,
        )
