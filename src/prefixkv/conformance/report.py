"""What a conformance run found: every distinct failed check, with its shortest replay.

A run does not stop at the first failure. Each failure found is shrunk to a minimal replay,
then the search starts again with that check set aside, until the run passes or
``max_failures`` distinct checks have failed. For each, the report keeps when it was first
seen (time to the first failure: the search) apart from the time spent shrinking it, since
on a real engine finding takes well under a second and shrinking most of a minute.

:meth:`ConformanceReport.to_json` is the ``--prefixkv-report=FILE`` format, for dashboards.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["ConformanceFailure", "ConformanceReport", "FailedCheck"]

#: The version of the JSON report's layout.
REPORT_FORMAT = 1


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

    def format(self) -> str:
        replay = "\n".join(f"    {line}" for line in self.calls)
        return (
            f"{self.message}\n\nminimal replay ({self.steps} steps, "
            f"{max(0, len(self.calls) - 2)} adapter calls; found in {self.find_s:.2f} s, "
            f"shrunk in {self.shrink_s:.2f} s):\n{replay}"
        )


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

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def checks(self) -> list[str]:
        """The failed checks, in the order they were found."""
        return [f.check for f in self.failures]

    def summary(self) -> str:
        """One paragraph: the checks that failed and what was looked past."""
        if self.passed:
            head = f"passed: {self.rules} rule steps, {self.operations} operations"
        else:
            more = " (the search stopped there)" if len(self.failures) >= self.max_failures else ""
            head = f"{len(self.failures)} distinct check(s) failed{more}: " + ", ".join(self.checks)
        notes = [f"capabilities: {self.capabilities}"]
        if self.ignored:
            notes.append(f"ignored checks: {', '.join(self.ignored)}")
        if self.skipped_rules:
            notes.append(f"skipped rules: {', '.join(self.skipped_rules)}")
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
            "failures": [
                {
                    "check": f.check,
                    "message": f.message,
                    "steps": f.steps,
                    "replay": list(f.calls),
                    "first_seen_s": round(f.first_seen_s, 3),
                    "find_s": round(f.find_s, 3),
                    "shrink_s": round(f.shrink_s, 3),
                }
                for f in self.failures
            ],
        }


class ConformanceFailure(AssertionError):
    """A conformance run failed. ``report`` holds every distinct failed check; ``check``,
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
