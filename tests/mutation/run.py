"""The bug-injection ("teeth") harness: every known bug must be caught by the machines.

::

    python -m tests.mutation.run                # all bugs, a table
    python -m tests.mutation.run --json         # machine-readable
    python -m tests.mutation.run --bug free_queue_lifo --shrink   # one bug, minimal replay
    python tests/mutation/run.py --list

For each bug in :mod:`tests.mutation.bugs`, a temporary copy of ``impl/`` gets the bug's
patches, and a subprocess (:mod:`tests.mutation.worker`) loads that copy as
``prefixkv.impl`` and runs the differential machines until a check fails. A control run on
an unpatched copy must survive every stage (otherwise the harness would "catch" anything).

The checkout is only ever read: each worker runs in its own process group and dies with the
harness (:mod:`tests.mutation.sandbox`), so a crash, a timeout, Ctrl-C or SIGKILL leaves the
checkout byte for byte as it was, and nothing running.

A bug is killed by a check (``killed_by: "check"``: a check of the machines failed) or by a
crash (``"crash"``: its code raised something no check names, at import included). A row
that could not run (a stale patch, a failed worker, a timeout) has ``caught: null`` and an
``error``: it is neither a survivor nor a kill.

Exit status: 0 when every bug is caught and the control passes; 1 when a bug survives, a
patch no longer applies (the impl changed under it: update the patch), a worker fails, or
the control run fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # when run as a script: python tests/mutation/run.py
    sys.path.insert(0, str(ROOT))

from tests.mutation.bugs import BUGS, Bug  # noqa: E402
from tests.mutation.sandbox import run_isolated, terminate_on_sigterm  # noqa: E402

IMPL = ROOT / "impl"
CONTROL = "(control: no bug)"
#: The hybrid machines' control: a separate run (and time limit) from the text one.
CONTROL_HYBRID = "(control: no bug, hybrid)"
#: The step machines' control (the text machines with advance and advance_batch rules).
CONTROL_STEPS = "(control: no bug, steps)"
CONTROLS = (CONTROL, CONTROL_HYBRID, CONTROL_STEPS)
_HYBRID_CONTROL = Bug(
    CONTROL_HYBRID, "the unpatched impl must pass every hybrid stage", (), machine="hybrid"
)
_STEPS_CONTROL = Bug(
    CONTROL_STEPS, "the unpatched impl must pass every step-call stage", (), machine="steps"
)


class PatchError(Exception):
    """A bug's patch does not apply to the current impl source."""


def apply_bug(bug: Bug, directory: Path) -> None:
    """Apply every patch of ``bug`` to the impl copy in ``directory``."""
    for file, old, new in bug.patches:
        path = directory / file
        if not path.is_file():
            raise PatchError(f"{bug.name}: impl/{file} does not exist")
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            first = old.strip().splitlines()[0] if old.strip() else old
            raise PatchError(
                f"{bug.name}: the text to replace occurs {count} times in impl/{file} "
                f"(expected once): {first!r}"
            )
        path.write_text(text.replace(old, new))


def copy_impl(destination: Path) -> Path:
    target = destination / "impl"
    shutil.copytree(IMPL, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return target


#: Process groups of the workers now running (killed at once if the harness is interrupted).
_LIVE: set[int] = set()
_LIVE_LOCK = threading.Lock()


def _started(name: str, pid: int) -> None:
    with _LIVE_LOCK:
        _LIVE.add(pid)
    print(f"start {name} (pid {pid})", file=sys.stderr, flush=True)


def _kill_live() -> None:
    with _LIVE_LOCK:
        for pid in _LIVE:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def run_one(bug: Bug | None, workdir: Path, *, shrink: bool, timeout: float) -> dict[str, Any]:
    name = bug.name if bug else CONTROL
    row: dict[str, Any] = {
        "bug": name,
        "description": bug.description if bug else "the unpatched impl must pass every stage",
        "applies": True,
    }
    directory = copy_impl(workdir / name.strip("()").replace(" ", "_").replace(":", ""))
    if bug is not None:
        try:
            apply_bug(bug, directory)
        except PatchError as exc:
            return {**row, "applies": False, "caught": None, "check": None, "error": str(exc)}
    cmd = [sys.executable, "-m", "tests.mutation.worker", "--impl", str(directory)]
    # a bug is hunted by its own machines; each control must survive its machines' stages
    cmd += ["--machine", "text" if bug is None else bug.machine]
    if shrink:
        cmd.append("--shrink")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env["PREFIXKV_MUTANT_T0"] = repr(time.monotonic())
    start = time.perf_counter()
    pids: list[int] = []

    def on_start(pid: int) -> None:
        pids.append(pid)
        _started(name, pid)

    try:
        done = run_isolated(cmd, cwd=ROOT, env=env, timeout=timeout, on_start=on_start)
    finally:
        with _LIVE_LOCK:
            _LIVE.difference_update(pids)
    if done.timed_out:
        return {**row, "caught": None, "check": None, "error": f"timeout after {timeout:.0f} s"}
    wall = time.perf_counter() - start
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        return {
            **row,
            "caught": None,
            "check": None,
            "error": f"worker failed (exit {done.returncode}): " + " | ".join(tail),
        }
    row = {**row, **result, "wall": round(wall, 2), "error": None}
    return {**row, "first_failure": first_failure(row)}


def ok(row: dict[str, Any]) -> bool:
    if not row["applies"] or row.get("error"):
        return False
    return not row["caught"] if row["bug"] in CONTROLS else bool(row["caught"])


def first_failure(row: dict[str, Any]) -> float | None:
    """Seconds from the worker's launch to the first failing check: start-up plus search."""
    if not row.get("caught") or row.get("startup") is None:
        return None
    return round(row["startup"] + row["seconds"], 2)


def format_table(rows: list[dict[str, Any]]) -> str:
    """Times in seconds: start-up (launch to the first stage) + search = first failure;
    ``cpu`` is the search's CPU time, ``rules`` the rules run up to the failure (both do not
    depend on the machine's load)."""
    out = [
        f"{'bug':<32} {'caught':<7} {'start-up':>8} {'search':>7} {'first':>7} {'cpu':>6} "
        f"{'rules':>6}  {'check':<28} stage",
        "-" * 118,
    ]
    for row in rows:
        if not row["applies"] or row.get("error"):
            out.append(f"{row['bug']:<32} {'ERROR':<7} {'':>8}  {row.get('error', '')}")
            continue
        caught = ("crash" if row.get("killed_by") == "crash" else "yes") if row["caught"] else "no"
        startup = "" if row.get("startup") is None else f"{row['startup']:.2f}"
        search = f"{row['seconds']:.2f}" if row["caught"] else f"({row['seconds']:.0f} run)"
        first = first_failure(row)
        out.append(
            f"{row['bug']:<32} {caught:<7} {startup:>8} {search:>7} "
            f"{'' if first is None else f'{first:.2f}':>7} {row.get('cpu', 0):>6.2f} "
            f"{row.get('rules', 0):>6}  {row['check'] or '-':<28} "
            f"{row['stage'] or '-'}"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Re-insert known bugs; the machines must catch each."
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--bug", action="append", default=[], help="run only this bug (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the bugs and exit")
    parser.add_argument("--shrink", action="store_true", help="shrink and print minimal replays")
    parser.add_argument("--no-control", action="store_true", help="skip the unpatched run")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per bug (400; 900 with --shrink)"
    )
    args = parser.parse_args(argv)
    # NOTE: the limit is there to catch a hung run, not a slow one: the unpatched control runs
    # every stage to the end (about 75 s of CPU), and CI shares two cores with other tests.
    timeout = args.timeout or (900.0 if args.shrink else 400.0)

    if args.list:
        for bug in BUGS:
            print(f"{bug.name:<32} {bug.description}")
        return 0
    known = {bug.name: bug for bug in BUGS}
    unknown = [name for name in args.bug if name not in known]
    if unknown:
        parser.error(f"unknown bug(s): {', '.join(unknown)}; see --list")
    bugs: list[Bug | None] = [known[name] for name in args.bug] if args.bug else list(BUGS)
    if not args.no_control and not args.bug:
        bugs[:0] = [None, _HYBRID_CONTROL, _STEPS_CONTROL]

    terminate_on_sigterm()
    load_start = os.getloadavg()[0]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="prefixkv-mutants-") as tmp:
        pool = ThreadPoolExecutor(max_workers=max(1, args.jobs))
        try:
            rows = list(
                pool.map(
                    lambda b: run_one(b, Path(tmp), shrink=args.shrink, timeout=timeout),
                    bugs,
                )
            )
        except BaseException:
            # NOTE: Ctrl-C reaches this thread only; the workers' threads wait on their
            # children, so kill those, or the pool's shutdown would wait for every stage.
            pool.shutdown(wait=False, cancel_futures=True)
            _kill_live()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    wall = time.perf_counter() - start
    failed = [row["bug"] for row in rows if not ok(row)]
    load = {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)}
    if args.json:
        summary = {"rows": rows, "wall": round(wall, 1), "failed": failed}
        summary.update(load_average=load, cpus=os.cpu_count(), jobs=args.jobs)
        print(json.dumps(summary, indent=2))
    else:
        print(format_table(rows))
        caught = sum(1 for row in rows if row["bug"] not in CONTROLS and ok(row))
        crashed = sum(
            1
            for row in rows
            if row["bug"] not in CONTROLS and ok(row) and row["killed_by"] == "crash"
        )
        total = sum(1 for row in rows if row["bug"] not in CONTROLS)
        print(
            f"\n{caught}/{total} bugs caught ({crashed} by a crash) in {wall:.0f} s "
            f"({args.jobs} jobs); load average {load}"
        )
        if args.shrink:
            for row in rows:
                if row.get("replay"):
                    print(f"\n== {row['bug']}: {row['message']}\n{row['replay']}")
        if failed:
            print("FAILED: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
