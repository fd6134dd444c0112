"""Time to the first failure of injected bugs under a pytest profile, as CI would see it.

The harness (:mod:`tests.mutation.run`) runs its own seeded stages. This script answers a
different question: with a bug re-inserted, how long does the differential suite itself,
``pytest tests/impl/test_state_machines.py`` under the ``ci`` profile, run before the first
check fails? ::

    python -m tests.mutation.ci_first_failure --bug hit_by_hash_only --bug extras_not_verified
    python -m tests.mutation.ci_first_failure --collisions --json
    python -m tests.mutation.ci_first_failure --collisions -k Weak   # one machine only

Each bug runs in a fresh subprocess: a temporary copy of ``impl/`` gets the bug's patches and
is installed as ``prefixkv.impl`` before pytest imports anything (the same loader as the
harness's worker). pytest then runs with ``-x``, the profile's example database off (a
failure saved by an earlier run would replay first and hide the search time), and the time
from the start of the session to the first failing check is reported. Shrinking is off: the
time is the search, not the minimisation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.mutation.bugs import BUGS  # noqa: E402
from tests.mutation.run import apply_bug, copy_impl  # noqa: E402

#: The bugs that only show when two different identities share a hash bucket.
COLLISION_BUGS = (
    "collision_bucket_remove_last",
    "hit_by_hash_only",
    "hit_ignores_parent",
    "extras_not_verified",
    "text_hits_multimodal_block",
)

TARGET = "tests/impl/test_state_machines.py"


class _Timer:
    """A pytest plugin: the ci profile without its database, and the first failure's time."""

    def __init__(self, profile: str) -> None:
        self.profile = profile
        self.start = 0.0
        self.cpu_start = 0.0
        self.first: tuple[float, float, str] | None = None

    def pytest_sessionstart(self, session: Any) -> None:
        from hypothesis import settings

        from prefixkv.conformance.machines import failure_listeners

        settings.register_profile(
            self.profile, settings.get_profile(self.profile), database=None, phases=_no_shrink()
        )
        settings.load_profile(self.profile)
        failure_listeners.append(self._record)
        self.start = time.perf_counter()
        self.cpu_start = time.process_time()

    def _record(self, exc: Any) -> None:
        if self.first is None:
            cpu = time.process_time() - self.cpu_start
            self.first = (time.perf_counter() - self.start, cpu, exc.check)


def _no_shrink() -> list[Any]:
    from hypothesis import Phase

    return [Phase.explicit, Phase.reuse, Phase.generate]


def _worker(impl: Path, profile: str, select: str | None) -> dict[str, Any]:
    from tests.mutation.worker import install_impl

    install_impl(impl)
    import pytest

    timer = _Timer(profile)
    args = ["-x", "-q", "-p", "no:cacheprovider", "--no-header", TARGET]
    if select:
        args += ["-k", select]
    start = time.perf_counter()
    code = pytest.main(args, plugins=[timer])
    wall = time.perf_counter() - start
    return {
        "caught": timer.first is not None,
        "seconds": None if timer.first is None else round(timer.first[0], 2),
        "cpu_seconds": None if timer.first is None else round(timer.first[1], 2),
        "check": None if timer.first is None else timer.first[2],
        "wall": round(wall, 1),
        "exit": int(code),
    }


def run_bug(name: str, profile: str, select: str | None, workdir: Path) -> dict[str, Any]:
    bug = {b.name: b for b in BUGS}[name]
    directory = copy_impl(workdir / name)
    apply_bug(bug, directory)
    cmd = [sys.executable, "-m", "tests.mutation.ci_first_failure", "--worker", str(directory)]
    cmd += ["--profile", profile] + (["-k", select] if select else [])
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "CI": "true"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    try:
        result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"bug": name, "caught": False, "error": " | ".join(tail)}
    return {"bug": name, **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bug", action="append", default=[], help="a bug name (repeatable)")
    parser.add_argument("--collisions", action="store_true", help="every collision-class bug")
    parser.add_argument("--profile", default="ci", help="the Hypothesis profile (ci)")
    parser.add_argument("-k", dest="select", default=None, help="pytest -k expression")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(_worker(args.worker, args.profile, args.select)))
        return 0
    names = list(args.bug) + (list(COLLISION_BUGS) if args.collisions else [])
    if not names:
        parser.error("name at least one --bug, or --collisions")
    with tempfile.TemporaryDirectory(prefix="prefixkv-first-failure-") as tmp:
        rows = [run_bug(name, args.profile, args.select, Path(tmp)) for name in names]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows:
            wall = "-" if row.get("seconds") is None else f"{row['seconds']:.2f} s"
            cpu = "-" if row.get("cpu_seconds") is None else f"{row['cpu_seconds']:.2f} s"
            what = row.get("check") or row.get("error", "")
            print(f"{row['bug']:<32} {wall:>9} wall {cpu:>9} CPU  {what}")
    return 0 if all(row.get("caught") for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
