"""The kit runs that the example managers' tests share: a correct manager passes, a bug is
found (without shrinking), and one bug shrinks to a short replay.

The ``ci`` profile is derandomized, so these runs are the same on every machine.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import Phase, settings

from prefixkv.conformance import ConformanceFailure, run_conformance
from prefixkv.conformance.profiles import register_profiles
from prefixkv.conformance.report import ConformanceReport, FailedCheck

STEPS = 30
#: The ``ci`` profile without the shrink phase: a failing run is mostly shrinking.
FIND_ONLY = "ci-find-only"
register_profiles()
settings.register_profile(
    FIND_ONLY,
    settings.get_profile("ci"),
    phases=[p for p in settings.get_profile("ci").phases if p is not Phase.shrink],
)


def passes(factory: Any, examples: int = 500) -> ConformanceReport:
    """Run the kit on a correct manager; it must exercise a real workload."""
    report = run_conformance(factory, max_examples=examples, steps=STEPS, profile="ci")
    assert report.rules > 1000 and report.operations > report.rules
    return report


def first_failure(factory: Any) -> ConformanceFailure:
    """The first failure the kit finds on a buggy manager, unshrunk."""
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(factory, max_examples=500, steps=STEPS, profile=FIND_ONLY, max_failures=1)
    return info.value


def every_root_cause(bugs: dict[str, type], factory_for: Any, max_failures: int) -> Any:
    """The report of one run, unshrunk, on one engine with every bug of ``bugs`` in it (each
    bug overrides its own method, so the subclasses combine), up to ``max_failures``
    failure classes."""
    factory = factory_for(type("AllBugs", tuple(bugs.values()), {}))
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(
            factory, max_examples=50, steps=STEPS, profile=FIND_ONLY, max_failures=max_failures
        )
    return info.value.report


def shortest_failure(factory: Any) -> FailedCheck:
    """The first failed check of a buggy manager, shrunk to its shortest replay."""
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(factory, max_examples=500, steps=STEPS, profile="ci", max_failures=1)
    failure = info.value.report.failures[0]
    assert failure.calls[1].startswith("cache = make(num_blocks=")
    return failure
