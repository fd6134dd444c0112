"""What a conformance run found: every distinct failure, by root cause, with its shortest
replay.

A run does not stop at the first failure. Each failure found is shrunk to a minimal replay,
then the search starts again with that failure class set aside (its fingerprint: the check,
the operation and the message's shape; :func:`~.failures.fingerprint`), so another failure
of the same check is still found, until the run passes or ``max_failures`` distinct
failures have been found. Every failure class is a root cause of its own, reported once.
A failure whose minimal run first went past an earlier one (the earlier one's class fired
there, set aside), or that fails the same check in the same words after another
operation, may follow from it: it is also named under that one as *possibly related*,
never folded into it (several bugs of one engine stay several root causes). For each, the
report keeps
when it was first seen (time to the first failure: the search) apart from the time spent
shrinking it, since on a real engine finding takes well under a second and shrinking most
of a minute.

:meth:`ConformanceReport.to_json` is the ``--prefixkv-report=FILE`` format, for dashboards.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["ConformanceFailure", "ConformanceReport", "Coverage", "FailedCheck"]

#: The version of the JSON report's layout (3: ``related`` names failure classes reported
#: on their own; 2 folded them into the earlier failure).
REPORT_FORMAT = 3


@attrs.frozen
class FailedCheck:
    """One distinct check that failed.

    ``calls`` is the shortest replay found, as calls of the adapter (the first two lines
    import and build it); ``steps`` its rule steps. ``first_seen_s`` is the time from the
    start of the run to the first failure of this check, ``find_s`` the search time of the
    pass that found it, and ``shrink_s`` the time spent shrinking it.
    """

    check: str
    message: str
    calls: tuple[str, ...]
    steps: int
    first_seen_s: float
    find_s: float
    shrink_s: float
    #: The shrink hit ``max_shrink_s``: ``calls`` is the shortest replay found by then.
    shrink_capped: bool = False
    #: The failure class (``CHECK#xxxxxxxx``), stable across runs; ``ignore`` takes it.
    fingerprint: str = ""
    #: The operation the check failed at (``""`` when it was not one).
    operation: str = ""
    #: The failure classes found later whose minimal runs went past this one first (or
    #: that fail the same check in the same words after another operation): possibly the
    #: same bug seen again, each also reported as a root cause of its own.
    related: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """``INV-PUBLISH#1a2b3c4d after commit``."""
        at = f" after {self.operation}" if self.operation else ""
        return f"{self.fingerprint or self.check}{at}"

    def format(self) -> str:
        replay = "\n".join(f"    {line}" for line in self.calls)
        what = "shortest replay so far" if self.shrink_capped else "minimal replay"
        capped = ", the cap" if self.shrink_capped else ""
        text = (
            f"{self.message}\n\n{what} ({self.steps} steps, "
            f"{max(0, len(self.calls) - 2)} adapter calls; found in {self.find_s:.2f} s, "
            f"shrunk in {self.shrink_s:.2f} s{capped}):\n{replay}"
        )
        if self.related:
            text += "\n\npossibly related (reported on their own): " + ", ".join(self.related)
        return text

    def to_json(self) -> dict[str, Any]:
        """The failure as plain JSON data."""
        return {
            "check": self.check,
            "fingerprint": self.fingerprint,
            "operation": self.operation,
            "message": self.message,
            "steps": self.steps,
            "replay": list(self.calls),
            "first_seen_s": round(self.first_seen_s, 3),
            "find_s": round(self.find_s, 3),
            "shrink_s": round(self.shrink_s, 3),
            "shrink_capped": self.shrink_capped,
            "related": list(self.related),
        }


#: A rule refused in more than this fraction of its firings is named in every summary.
REFUSAL_WARNING = 0.10


@attrs.frozen
class Coverage:
    """What a run exercised, so that a pass says what it tested.

    ``fired``: rule -> firings; ``refused``: rule -> firings in which the candidate refused
    an operation (raised a ``PrefixCacheError`` other than ``OutOfBlocks`` or ``CacheBusy``,
    which answer about the state; the bad-input rules, which must be refused, are not
    counted);
    ``skipped``: rule -> why it never fired (``-speculative``: the capability that excludes
    it; ``skip_rules``; ``never drawn``); ``ops`` and ``op_errors``: operations issued and
    refused (any error), by kind.
    """

    fired: dict[str, int] = attrs.field(factory=dict)
    refused: dict[str, int] = attrs.field(factory=dict)
    skipped: dict[str, str] = attrs.field(factory=dict)
    ops: dict[str, int] = attrs.field(factory=dict)
    op_errors: dict[str, int] = attrs.field(factory=dict)

    def refusal_rate(self, rule: str) -> float:
        """The fraction of ``rule``'s firings that were refused."""
        return self.refused.get(rule, 0) / max(1, self.fired.get(rule, 0))

    def mostly_refused(self, limit: float = REFUSAL_WARNING) -> list[str]:
        """The rules refused in more than ``limit`` of their firings, worst first."""
        over = [r for r in self.fired if self.refusal_rate(r) > limit]
        return sorted(over, key=lambda r: -self.refusal_rate(r))

    def format(self) -> str:
        """The coverage section of a summary: one line per rule, then the operations."""
        lines = ["coverage (rule: fired, refused):"]
        for rule in sorted(self.fired, key=lambda r: -self.fired[r]):
            rate = self.refusal_rate(rule)
            flag = "  <- mostly refused" if rate > REFUSAL_WARNING else ""
            lines.append(
                f"  {rule:<22} {self.fired[rule]:>7} {self.refused.get(rule, 0):>7}"
                f" ({rate:.0%}){flag}"
            )
        for rule, why in sorted(self.skipped.items()):
            lines.append(f"  {rule:<22} skipped: {why}")
        ops = ", ".join(
            f"{name} {n}"
            + (f" ({self.op_errors[name]} refused)" if self.op_errors.get(name) else "")
            for name, n in sorted(self.ops.items(), key=lambda kv: -kv[1])
        )
        lines.append(f"operations: {ops}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The coverage as plain JSON data."""
        return {
            "rules": {
                r: {"fired": n, "refused": self.refused.get(r, 0)}
                for r, n in sorted(self.fired.items())
            },
            "skipped": dict(sorted(self.skipped.items())),
            "operations": dict(sorted(self.ops.items())),
            "operations_refused": dict(sorted(self.op_errors.items())),
        }


@attrs.frozen
class ConformanceReport:
    """What a run did: ``failures`` is empty when it passed."""

    target: str
    capabilities: str
    rules: int
    operations: int
    seconds: float
    failures: tuple[FailedCheck, ...] = ()
    ignored: tuple[str, ...] = ()
    skipped_rules: tuple[str, ...] = ()
    max_failures: int = 1
    coverage: Coverage = attrs.field(factory=Coverage)

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def checks(self) -> list[str]:
        """The failed checks of the root causes, in the order they were found."""
        return [f.check for f in self.failures]

    @property
    def fingerprints(self) -> list[str]:
        """Every failure class found, in the order found."""
        return [f.fingerprint for f in self.failures]

    def summary(self) -> str:
        """One paragraph: the root causes that failed (with the later ones possibly related
        to each) and what was looked past."""
        if self.passed:
            head = f"passed: {self.rules} rule steps, {self.operations} operations"
        else:
            more = " (the search stopped there)" if len(self.failures) >= self.max_failures else ""
            label = {f.fingerprint: f.label for f in self.failures}
            causes = [
                f.label
                + (
                    f" (possibly related: {', '.join(label.get(r, r) for r in f.related)})"
                    if f.related
                    else ""
                )
                for f in self.failures
            ]
            head = f"{len(self.failures)} root cause(s) failed{more}:\n" + "\n".join(
                f"  {c}" for c in causes
            )
        notes = [f"capabilities: {self.capabilities}"]
        if self.ignored:
            notes.append(f"ignored checks: {', '.join(self.ignored)}")
        if self.skipped_rules:
            notes.append(f"skipped rules: {', '.join(self.skipped_rules)}")
        refused = self.coverage.mostly_refused()
        if refused:
            # NOTE: a manager that refuses most of what the kit asks is barely tested; a
            # pass must not hide it.
            notes.append(
                "WARNING, mostly refused (the checks barely ran there): "
                + ", ".join(f"{r} {self.coverage.refusal_rate(r):.0%}" for r in refused)
            )
        if self.coverage.fired:
            notes.append(self.coverage.format())
        return head + "\n" + "\n".join(notes)

    def to_json(self) -> dict[str, Any]:
        """The report as plain JSON data."""
        return {
            "format": REPORT_FORMAT,
            "target": self.target,
            "passed": self.passed,
            "capabilities": self.capabilities,
            "ignored": list(self.ignored),
            "skipped_rules": list(self.skipped_rules),
            "rules": self.rules,
            "operations": self.operations,
            "seconds": round(self.seconds, 3),
            "failures": [f.to_json() for f in self.failures],
            "coverage": self.coverage.to_json(),
        }


class ConformanceFailure(AssertionError):
    """A conformance run failed. ``report`` holds every root cause; ``check``,
    ``calls`` and ``steps`` are those of the first one (its check name, its minimal
    replay as calls of the adapter, its number of rule steps)."""

    def __init__(self, report: ConformanceReport) -> None:
        assert report.failures
        self.report = report
        first = report.failures[0]
        self.check, self.calls, self.steps = first.check, list(first.calls), first.steps
        parts = [report.summary()]
        for i, failure in enumerate(report.failures, 1):
            parts.append(f"--- {i}/{len(report.failures)}: {failure.check} ---\n{failure.format()}")
        super().__init__("\n\n".join(parts))
