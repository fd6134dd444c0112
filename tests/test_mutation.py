"""The bug-injection harness: every known bug in tests/mutation/bugs.py must be caught.

Runs ``python -m tests.mutation.run --json`` (a subprocess per bug, two at a time), which
re-inserts each bug into a temporary copy of impl/ and runs the differential machines on it.
It also fails when a patch no longer applies to the impl, or when the unpatched control run
fails. See docs/testing.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.mutation
def test_every_injected_bug_is_caught() -> None:
    """Each bug is caught, each patch still applies, and the unpatched impl passes."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.mutation.run", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert proc.stdout, proc.stderr
    report = json.loads(proc.stdout)
    rows = {row["bug"]: row for row in report["rows"]}
    problems = [
        f"{name}: {row.get('error') or ('caught' if row['caught'] else 'not caught')}"
        for name, row in rows.items()
        if name in report["failed"]
    ]
    assert not problems, "\n".join(problems)
    assert proc.returncode == 0, proc.stderr
    assert len(rows) >= 11  # the control run and at least ten bugs


def test_every_patch_applies(tmp_path: Path) -> None:
    """Each bug's patches still apply to the current impl (fast; no machines run)."""
    from mutation.run import BUGS, apply_bug, copy_impl

    assert len(BUGS) >= 10
    assert len({bug.name for bug in BUGS}) == len(BUGS)
    for bug in BUGS:
        apply_bug(bug, copy_impl(tmp_path / bug.name))


def test_a_stale_patch_fails_loudly(tmp_path: Path) -> None:
    """A patch whose text is not in the impl (or occurs twice) is an error, not a pass."""
    from mutation.run import Bug, PatchError, apply_bug, copy_impl

    directory = copy_impl(tmp_path)
    with pytest.raises(PatchError, match="occurs 0 times"):
        apply_bug(Bug("gone", "-", (("cache.py", "no such text\n", ""),)), directory)
    with pytest.raises(PatchError, match=r"occurs [2-9]\d* times"):
        apply_bug(Bug("twice", "-", (("cache.py", "def ", "def "),)), directory)
