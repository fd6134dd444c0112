"""HypoFuzz's re-executions of state machine inputs replay the recorded choices exactly.

HypoFuzz records coverage only from inputs whose re-execution covers the same branches.
As released (25.11.1) it re-runs a state machine input with its choices shifted by every
forced draw, so prefixkv's machines recorded 0 behaviours (docs/campaigns.md).
:mod:`prefixkv.conformance.fuzz_replay` aligns them; these tests drive HypoFuzz's own fuzz
target (``fuzz_replay_worker.py``, a fresh process per mode) and compare.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("hypofuzz")

from prefixkv.conformance import fuzz_replay

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _fuzz(mode: str, inputs: int, machine: str) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "PREFIXKV_DATABASE"}
    out = subprocess.run(
        [sys.executable, str(HERE / "fuzz_replay_worker.py"), mode, str(inputs), machine],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=True,
    )
    counts: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    return counts


def test_plain_hypofuzz_replays_a_state_machine_input_shifted() -> None:
    """The defect itself, on a toy machine: no re-execution replays its recorded choices."""
    plain = _fuzz("plain", 60, "toy")
    assert plain["reexecuted"] > 0
    assert plain.get("replayed_exactly", 0) == 0, plain


def test_aligned_replays_are_exact_and_stable() -> None:
    aligned = _fuzz("aligned", 60, "toy")
    assert aligned["reexecuted"] > 0
    assert aligned["replayed_exactly"] == aligned["reexecuted"], aligned
    assert aligned["stable"] == aligned["reexecuted"], aligned  # the toy has no memo to warm
    assert aligned["behaviors"] > 0


def test_the_conformance_machine_records_behaviours_only_when_aligned() -> None:
    """prefixkv's conformance machine against ``prefixkv.impl``: 0 behaviours as released,
    and behaviours once the re-executions replay the same input."""
    plain = _fuzz("plain", 15, "impl")
    assert plain["reexecuted"] > 0 and plain.get("replayed_exactly", 0) == 0, plain
    assert plain["behaviors"] == 0, plain
    aligned = _fuzz("aligned", 15, "impl")
    assert aligned["replayed_exactly"] == aligned["reexecuted"] > 0, aligned
    assert aligned["stable"] > 0 and aligned["behaviors"] > 0, aligned


def test_the_plugin_aligns_hypofuzz_workers_only() -> None:
    """HypoFuzz collects through pytest: the plugin installs the alignment there, and
    nowhere else (this session is not a HypoFuzz run)."""
    assert not fuzz_replay.installed()
    code = (
        "from hypofuzz import detection\n"
        "detection._in_hypofuzz_run = True\n"
        "from hypofuzz.collection import collect_tests\n"
        "found = collect_tests(['tests/conformance/test_campaign_targets.py'])\n"
        "from prefixkv.conformance.fuzz_replay import installed\n"
        "print(installed())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PREFIXKV_DATABASE", "CI")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True
    )
    assert out.stdout.strip().splitlines()[-1] == "True", out.stdout + out.stderr


def test_a_release_newer_than_the_known_ones_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prefixkv.conformance import _compat, fuzz_hub, fuzz_shrink

    monkeypatch.setattr(_compat, "hypofuzz_version", lambda: (99, 1, 1))
    assert fuzz_shrink.keep_shrunk_failures() is False
    assert fuzz_replay.align_forced_choices() is False
    assert not fuzz_replay.installed()
    assert fuzz_hub.report_targets_early() is False
    monkeypatch.setattr(_compat, "hypofuzz_version", lambda: None)
    assert fuzz_replay.align_forced_choices(force=True) is False  # not installed at all


_WORKER_REPORT = """
import json, sys
from hypofuzz import detection
from hypofuzz.collection import collect_tests
from hypofuzz.hypofuzz import FuzzWorker

detection._in_hypofuzz_run = sys.argv[1] == "plugin"  # the plugin mends only HypoFuzz runs
collected = collect_tests(["tests/conformance/test_campaign_targets.py"])
nodeids = [t.nodeid for t in collected.fuzz_targets]
state = {"hub_state": {"nodeids": nodeids}, "worker_state": {"nodeids": {}, "valid_nodeids": []}}
worker = FuzzWorker(pytest_args=[], shared_state=state)
worker.collected_targets = {t.nodeid: t for t in collected.fuzz_targets}
worker._update_targets(nodeids)  # what a worker does first, before its first batch
print(json.dumps([len(nodeids), state["worker_state"]["valid_nodeids"]]))
"""


@pytest.mark.parametrize("mode", ["plugin", "plain"])
def test_a_worker_reports_its_tests_before_fuzzing_them(mode: str) -> None:
    """The hub stops when no worker reports a test it may fuzz. As released, a worker given
    its tests reports none until its first batch of 100 inputs ends; mended, at once."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFIXKV_DATABASE", "CI")}
    out = subprocess.run(
        [sys.executable, "-c", _WORKER_REPORT, mode],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=True,
    )
    collected, reported = json.loads(out.stdout.strip().splitlines()[-1])
    assert collected == 2
    assert len(reported) == (2 if mode == "plugin" else 0), out.stdout


def test_a_shrunk_failure_is_saved_only_when_mended() -> None:
    """HypoFuzz 25.11.1 reads ``slice_comments``, which newer Hypothesis calls
    ``span_comments``: unmended it raises after shrinking and saves no shrunk failure."""
    unmended = _fuzz("aligned", 200, "failing")
    assert unmended.get("crashed") == 1 and unmended["shrunk_failures"] == 0, unmended
    mended = _fuzz("mended", 200, "failing")
    assert "crashed" not in mended and mended["shrunk_failures"] == 1, mended
