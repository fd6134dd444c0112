"""The searches of one kit run: short runs first, then the full one, which is unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from hypothesis import settings
from hypothesis.database import InMemoryExampleDatabase

from prefixkv.conformance.profiles import SHORT_RUNS, register_profiles, searches

register_profiles()


def test_short_runs_come_first_and_the_full_run_is_unchanged() -> None:
    full = settings(settings.get_profile("ci"), stateful_step_count=30, max_examples=500)
    runs = searches(full)
    assert runs[-1] is full
    assert [(r.stateful_step_count, r.max_examples) for r in runs[:-1]] == [
        (steps, round(500 * share)) for steps, share in SHORT_RUNS
    ]
    assert [r.stateful_step_count for r in runs] == sorted(r.stateful_step_count for r in runs)
    for short in runs[:-1]:
        assert short.database is None
        assert short.derandomize == full.derandomize and short.phases == full.phases


def test_no_short_run_is_as_long_as_the_full_one() -> None:
    longest = max(steps for steps, _ in SHORT_RUNS)
    full = settings(settings.get_profile("ci"), stateful_step_count=longest, max_examples=3)
    runs = searches(full)
    assert [r.stateful_step_count for r in runs[:-1]] == [s for s, _ in SHORT_RUNS[:-1]]
    assert all(r.max_examples == 1 for r in runs[:-1]) and runs[-1] is full
    assert searches(full, short_first=False) == [full]


def test_short_runs_never_touch_a_database() -> None:
    """A saved long failure replayed under fewer steps would not fail again, and Hypothesis
    would delete it: the short runs run without the database."""
    db = InMemoryExampleDatabase()
    full = settings(settings.get_profile("dev"), stateful_step_count=30, database=db)
    assert [r.database for r in searches(full)] == [None] * len(SHORT_RUNS) + [db]


#: Run in a fresh process: the kit's run on the double free in a batch, its first failure as
#: JSON (check, steps, the last call of its replay).
_FRESH_RUN = """
import json
from examples.engine_style import make_double_free_in_batch
from prefixkv.conformance import ConformanceFailure, run_conformance
try:
    run_conformance(
        make_double_free_in_batch, max_examples=500, steps=30, profile="ci", max_failures=1
    )
except ConformanceFailure as exc:
    f = exc.report.failures[0]
    print(json.dumps({"check": f.check, "steps": f.steps, "last": f.calls[-1],
                      "text": f.format()}))
"""


def test_a_bug_a_short_run_finds_shrinks_to_a_short_replay() -> None:
    """The full run's first failure of this bug shrinks to 8 steps (44 calls) in half a
    minute; a short run finds it, and its replay is the 3 steps that matter: two
    sequences share a block, then one batch frees both (``free`` or ``reset``).

    NOTE: in a fresh process, as ``python -m prefixkv.benchmarks.kit --bugs-only`` measures
    it. Hypothesis draws some values from the constants of the project's modules loaded in
    the process (its local constants), so a derandomized search draws other runs once a
    test session has imported more of the project (``prefixkv.workloads`` is enough here:
    the short runs then miss this bug, and the full run's 8-step replay is reported).
    """
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_RUN],
        capture_output=True, text=True, cwd=root, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
    failure = json.loads(done.stdout.strip().splitlines()[-1])
    assert failure["check"] == "INV-REF" and failure["steps"] <= 3, failure["text"]
    assert failure["last"].startswith(("cache.free([", "cache.reset(")), failure["text"]
