# ruff: noqa: E501  (each patch is the exact source line it replaces)
"""Bugs injected into the reference scheduler and engine, to show the engine tests catch them.

Each bug is one exact source replacement; the old text must occur exactly once, so a bug
whose code moved fails loudly (``tests/engine/test_engine_bugs.py`` checks that in CI).

Each bug is applied to a temporary copy of the sources (:mod:`tests.mutation.sandbox`), never
to the checkout. The engine tests then run on that copy in a fresh fork of a warm server
(:mod:`tests.mutation.warm`: torch, pytest and hypothesis imported once per harness run),
with ``-x``, so it stops at the first failure: first the tests that caught this bug before,
cheapest first (the record ``engine_catches.json``), then the rest of the suite by duration,
so a bug the record misses is still found. A crash, a timeout, Ctrl-C or SIGKILL leaves the
checkout byte for byte as it was. Each row splits the time to the first failure into
start-up (the fork to the first test) and search (the first test to the failure)::

    python -m tests.mutation.engine_bugs                 # every bug and the control, a table
    python -m tests.mutation.engine_bugs --json
    python -m tests.mutation.engine_bugs 3 7             # by index (see --list)
    python -m tests.mutation.engine_bugs --bug "chunk samples at every chunk"
    python -m tests.mutation.engine_bugs --survey --write   # every test on every mutant:
                                                             # refresh the record
    python -m tests.mutation.engine_bugs --cold 3        # a fresh pytest -n 2, to compare

A control run on an unpatched copy must pass the engine tests (otherwise every bug would
look caught). A bug marked ``equivalent`` cannot change behaviour: it is listed to say why
it is not caught, not counted as a miss. A mutant whose code crashes at import fails the
collection: it is reported as killed by a crash (verdict ``crash``), not as caught by a check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # when run as a script: python tests/mutation/engine_bugs.py
    sys.path.insert(0, str(ROOT))

from tests.mutation.sandbox import (  # noqa: E402
    module_of,
    run_isolated,
    stage_sources,
    terminate_on_sigterm,
)
from tests.mutation.warm import WarmPytest  # noqa: E402

__all__ = [
    "CATCHES",
    "CONTROL",
    "ENGINE_BUGS",
    "EngineBug",
    "apply",
    "load_catches",
    "main",
    "run_bug",
    "run_order",
]

CONTROL = "(control: no bug)"
#: The harness's record (``--survey --write``): each engine test's duration in the control
#: run, and for each bug every test that failed with it in, with that test's duration.
CATCHES = Path(__file__).with_name("engine_catches.json")


@dataclass(frozen=True)
class EngineBug:
    name: str
    path: str  # relative to the repository root
    old: str
    new: str
    equivalent: str = ""  # why the bug cannot change behaviour, if it cannot


ENGINE_BUGS: tuple[EngineBug, ...] = (
    EngineBug(
        "no rollback of rejected drafts",
        "src/prefixkv/engine/scheduler.py",
        "                if rejected:\n                    cache.rollback(g.request_id, rejected)\n",
        "",
    ),
    EngineBug(
        "drafts accepted without verification",
        "src/prefixkv/engine/policy.py",
        "    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:",
        "    while accepted < len(drafts):",
    ),
    EngineBug(
        "bonus token's unwritten KV committed",
        "src/prefixkv/engine/scheduler.py",
        "                cache.commit(g.request_id, len(new), new)\n                rejected = entry.num_tokens - len(new)",
        "                cache.commit(g.request_id, min(len(new) + 1, entry.num_tokens), new)\n                rejected = entry.num_tokens - min(len(new) + 1, entry.num_tokens)",
    ),
    EngineBug(
        "cache-off namespace shared",
        "src/prefixkv/engine/scheduler.py",
        "        if not self.cache_enabled:\n            ns = _off_namespace",
        "        if False:\n            ns = _off_namespace",
    ),
    EngineBug(
        "multimodal spans not passed to the cache",
        "src/prefixkv/engine/scheduler.py",
        "        return req.cache_request(ns, gen.tokens)",
        "        return req.cache_request(ns, gen.tokens, spans=False)",
    ),
    EngineBug(
        "re-admission forgets the output (prompt only)",
        "src/prefixkv/engine/scheduler.py",
        "        gen.num_prompt = gen.num_computed = 0\n        gen.preemptions += 1",
        "        gen.num_prompt = gen.num_computed = 0\n        del gen.tokens[len(gen.request.prompt):]\n        gen.preemptions += 1",
    ),
    EngineBug(
        "cached prefix recomputed into shared blocks",
        "src/prefixkv/engine/scheduler.py",
        "            g.num_computed = adm.num_cached_tokens\n",
        "            g.num_computed = 0\n",
    ),
    EngineBug(
        "chunk samples at every chunk",
        "src/prefixkv/engine/scheduler.py",
        "            sample=end == g.num_prompt,",
        "            sample=True,",
    ),
    EngineBug(
        "cancel_step does not roll back appends",
        "src/prefixkv/engine/scheduler.py",
        "            elif r.num_tokens:\n                self.cache.rollback(g.request_id, r.num_tokens)",
        "            elif False:\n                pass",
    ),
    EngineBug(
        "decode position off by one (RoPE)",
        "src/prefixkv/engine/batch.py",
        "        positions.extend(range(s.start, s.end))",
        "        positions.extend(range(s.start + (s.num_tokens == 1), s.end + (s.num_tokens == 1)))",
    ),
    EngineBug(
        "sampled row is the chunk's first, not last",
        "src/prefixkv/engine/batch.py",
        "        rows.extend(range(base + s.num_tokens - n, base + s.num_tokens))",
        "        rows.extend(range(base, base + n))",
    ),
    EngineBug(
        "multimodal override offset ignored",
        "src/prefixkv/engine/runner.py",
        "            rows = self.encoder.encode(o.item)[o.offset : o.offset + o.length]",
        "            rows = self.encoder.encode(o.item)[: o.length]",
        # NOTE: the reference scheduler never starts a step inside a span (choices 5 and 8),
        # so only tests/engine/test_runner_chunks.py, which drives the runner directly, sees it
    ),
    EngineBug(
        "torch backend: causal mask lets a multi-token step see one key ahead",
        "src/prefixkv/engine/backend.py",
        "            visible = pos.unsqueeze(0) <= (torch.arange(new, device=q.device) + cached)[:, None]",
        "            visible = pos.unsqueeze(0) <= (torch.arange(new, device=q.device) + total - new + (new > 1))[:, None]",
    ),
    EngineBug(
        "preemption victim is the oldest",
        "src/prefixkv/engine/policy.py",
        "    for candidate in reversed(running):",
        "    for candidate in running:",
    ),
    EngineBug(
        "decode budget starves prefill (no reserve)",
        "src/prefixkv/engine/policy.py",
        "    reserve = min(min_prefill, prefill_demand)",
        "    reserve = 0",
    ),
    EngineBug(
        "kv write skipped for the last token of a step",
        "src/prefixkv/engine/backend.py",
        "        slots = meta.slot_mapping[: meta.num_tokens]\n",
        "        slots = meta.slot_mapping[: meta.num_tokens].clone()\n        slots[-1:] = slots[:1]\n",
    ),
    EngineBug(
        "hybrid: checkpoint saved with the state after the step's last token",
        "src/prefixkv/engine/state_io.py",
        "            self.pool.write(slot, position, out.states[row][position])",
        "            self.pool.write(slot, position, out.states[row][max(out.states[row])])",
    ),
    EngineBug(
        "hybrid: restore copies the runtime slot onto itself (wrong source slot)",
        "src/prefixkv/engine/state_io.py",
        "                copied = pool.copy(restore.slot, cache.state_slot(s.seq_id))",
        "                copied = pool.copy(cache.state_slot(s.seq_id), cache.state_slot(s.seq_id))",
    ),
    EngineBug(
        "hybrid: runtime state kept after rejected drafts",
        "src/prefixkv/engine/state_io.py",
        "            pool.write(cache.state_slot(s.seq_id), position, out.states[row][position])",
        "            pool.write(cache.state_slot(s.seq_id), position, out.states[row][s.end])",
    ),
    EngineBug(
        "hybrid: restore never reported to the cache",
        "src/prefixkv/engine/state_io.py",
        "                cache.restore_issued(s.seq_id)\n",
        "",
    ),
)


class PatchError(ValueError):
    """A bug's old text does not occur exactly once in its file (the code moved)."""


def apply(bug: EngineBug, root: Path) -> Path:
    """Insert ``bug`` into the copy of the sources under ``root``; returns the patched file.

    Refuses the checkout itself: the harness patches copies only.
    """
    if root.resolve() == ROOT.resolve():
        raise ValueError("engine bugs are applied to a copy of the sources, never the checkout")
    path = root / bug.path
    text = path.read_text(encoding="utf-8")
    count = text.count(bug.old)
    if count != 1:
        raise PatchError(f"{bug.name}: the patched text occurs {count} times in {bug.path}")
    path.write_text(text.replace(bug.old, bug.new), encoding="utf-8")
    return path


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def load_catches(path: Path = CATCHES) -> dict[str, Any]:
    """The harness's record: each engine test's duration, and which tests caught each bug."""
    if not path.is_file():
        return {"durations": {}, "catches": {}}
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def run_order(bug: EngineBug | None, catches: dict[str, Any]) -> dict[str, Any]:
    """The order the child runs the tests in: the bug's past catchers, cheapest first, then
    the rest of the suite by recorded duration (``first_failure``'s ``PREFIXKV_MUTANT_ORDER``).
    """
    durations: dict[str, float] = catches.get("durations", {})
    caught_by = catches.get("catches", {}).get(bug.name if bug else CONTROL, [])
    first = [nodeid for nodeid, _ in sorted(caught_by, key=lambda pair: (pair[1], pair[0]))]
    return {"first": first, "durations": durations}


def run_bug(
    bug: EngineBug | None,
    workdir: Path,
    *,
    server: WarmPytest | None = None,
    tests: str = "tests/engine",
    jobs: int = 2,
    timeout: float | None = None,
    catches: dict[str, Any] | None = None,
    survey: bool = False,
) -> dict[str, Any]:
    """Run the engine tests on a copy of the sources with ``bug`` in it (None: the control).

    With a ``server`` (:class:`~tests.mutation.warm.WarmPytest`) the tests run in a fork of
    the warm server, in one process, in the order of :func:`run_order` (``catches``: the
    harness's record; None reads it); without one, in a fresh ``python -m pytest`` with
    ``jobs`` pytest-xdist workers, in collection order (the cold way, kept to compare).
    ``survey`` runs every test (no ``-x``) and lists each failing one.

    Returns a row: ``verdict`` is ``caught`` (a test failed), ``crash`` (the collection
    failed: the mutant crashed at import), ``missed``, ``equivalent`` (missed, but the bug
    cannot change behaviour), ``passed`` (the control), ``error`` or ``timeout``; ``check``
    is the first failing test. Times, in seconds: ``stage`` copies and patches the sources;
    then, from the start of the process that checks the copy (the fork, or the cold
    interpreter's launch), ``startup`` runs to the start of the first test (interpreter and
    imports if cold, pytest's configuration and collection, which imports the patched
    ``prefixkv``), ``search`` from there to the first failing report, ``first_failure`` is
    their sum, and ``wall`` is the whole child run, teardown included.
    """
    name = bug.name if bug else CONTROL
    row: dict[str, Any] = {"bug": name, "verdict": "error", "check": None, "message": ""}
    row.update(stage=None, startup=None, search=None, first_failure=None, wall=None)
    row.update(error=None, mode="warm" if server is not None else "cold")
    begin = time.monotonic()
    copy = workdir / "src"
    src = stage_sources(copy)
    env = {"CI": "true", "PREFIXKV_MUTANT_SRC": str(src)}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(src), str(copy), os.environ.get("PYTHONPATH", "")) if p
    )
    env["PREFIXKV_MUTANT_REPORT"] = report = str(workdir / "report.json")
    if bug is not None:
        try:
            patched = apply(bug, copy)
        except PatchError as exc:
            return {**row, "error": str(exc)}
        if not bug.path.startswith("tests/"):  # a patched test file is no module to check
            env["PREFIXKV_MUTANT_MODULE"] = module_of(bug.path)
            env["PREFIXKV_MUTANT_FILE"] = str(patched)
    args = ["-q", *([] if survey else ["-x"]), "-p", "no:cacheprovider"]
    args += ["-p", "tests.mutation.first_failure"]
    # NOTE: that file checks each patch's text is present, which an applied patch removes:
    # with it every bug would count as caught.
    args += [tests, "--ignore=tests/engine/test_engine_bugs.py"]
    row["stage"] = round(time.monotonic() - begin, 2)
    announce = lambda pid: _progress(f"start {name} (pid {pid}) in {copy}")  # noqa: E731
    start = time.monotonic()
    if server is not None:
        order = workdir / "order.json"
        order.write_text(json.dumps(run_order(bug, load_catches() if catches is None else catches)))
        env["PREFIXKV_MUTANT_ORDER"] = str(order)
        log = workdir / "pytest.log"
        code = server.run(
            cwd=copy,
            path=[str(src), str(copy)],
            env=env,
            args=[*args, "-p", "no:xdist"],
            log=log,
            timeout=timeout,
            on_start=announce,
        )
        output = log.read_text(errors="replace") if log.is_file() else ""
    else:
        env["PREFIXKV_MUTANT_T0"] = repr(time.monotonic())
        cmd = [sys.executable, "-m", "pytest", *args, *(["-n", str(jobs)] if jobs > 1 else [])]
        done = run_isolated(
            cmd, cwd=copy, env={**os.environ, **env}, timeout=timeout, on_start=announce
        )
        code, output = done.returncode, done.stdout + done.stderr
    row["wall"] = round(time.monotonic() - start, 2)
    tail = " | ".join(output.strip().splitlines()[-3:])
    if code is None:
        return {**row, "verdict": "timeout", "error": f"timeout after {timeout:.0f} s: {tail}"}
    try:
        result = json.loads(Path(report).read_text())
    except (OSError, json.JSONDecodeError):
        return {**row, "error": f"pytest exited {code} without a report: {tail}"}
    if survey:
        durations = result["durations"]
        row["durations"] = durations
        row["failures"] = [
            [f["nodeid"], durations.get(f["nodeid"], f["seconds"])]
            for f in result["failures"]
            if f["when"] != "collect"
        ]
    first = result["first"]
    row["startup"] = result["first_test"]
    if first is not None:
        row.update(check=first["nodeid"], message=first["message"])
        row["first_failure"] = first["seconds"]
        if row["startup"] is not None:
            row["search"] = round(first["seconds"] - row["startup"], 2)
        if first["when"] == "collect":
            return {**row, "verdict": "crash"}
        return {**row, "verdict": "caught"}
    if code != 0:
        return {**row, "error": f"pytest exited {code} with no failure: {tail}"}
    if bug is None:
        return {**row, "verdict": "passed"}
    return {**row, "verdict": "equivalent" if bug.equivalent else "missed"}


def ok(row: dict[str, Any]) -> bool:
    """Whether a row is what the harness wants: the control passes, each bug is killed."""
    if row["bug"] == CONTROL:
        return bool(row["verdict"] == "passed")
    return row["verdict"] in ("caught", "crash", "equivalent")


def _secs(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def format_table(rows: list[dict[str, Any]]) -> str:
    """Times in seconds: start-up + search = first failure (see :func:`run_bug`)."""
    out = [
        f"{'verdict':<10} {'start-up':>8} {'search':>7} {'first':>7} {'wall':>7}  bug: check",
        "-" * 100,
    ]
    for row in rows:
        times = (row["startup"], row["search"], row["first_failure"], row["wall"])
        startup, search, first, wall = (_secs(t) for t in times)
        what = row["error"] or row["check"] or ""
        out.append(
            f"{row['verdict']:<10} {startup:>8} {search:>7} {first:>7} {wall:>7}  "
            f"{row['bug']}: {what}"
        )
    return "\n".join(out)


def survey_record(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The record :func:`run_order` reads, from a ``--survey`` run of the control and bugs."""
    control = next((row for row in rows if row["bug"] == CONTROL), None)
    if control is None or control["verdict"] != "passed":
        raise ValueError("a survey needs a passing control run: it gives the tests' durations")
    catches = {row["bug"]: row["failures"] for row in rows if row["bug"] != CONTROL}
    return {"durations": control["durations"], "catches": catches}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Inject each engine bug; the tests must catch it.")
    parser.add_argument("index", nargs="*", type=int, help="run only these bugs (see --list)")
    parser.add_argument("--bug", action="append", default=[], help="run only this bug, by name")
    parser.add_argument("--list", action="store_true", help="list the bugs and exit")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--no-control", action="store_true", help="skip the unpatched run")
    parser.add_argument(
        "--cold", action="store_true", help="a fresh pytest per bug, in collection order"
    )
    parser.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers (--cold only)")
    parser.add_argument("--tests", default="tests/engine", help="the tests to run (in the copy)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per bug")
    parser.add_argument(
        "--survey", action="store_true", help="run every test (no -x) and list what fails"
    )
    parser.add_argument("--write", action="store_true", help=f"with --survey: write {CATCHES.name}")
    args = parser.parse_args(argv)
    if args.list:
        for i, listed in enumerate(ENGINE_BUGS):
            print(f"{i:>3}  {listed.name}" + ("  (equivalent)" if listed.equivalent else ""))
        return 0
    known = {bug.name: bug for bug in ENGINE_BUGS}
    unknown = [name for name in args.bug if name not in known]
    if unknown or any(not 0 <= i < len(ENGINE_BUGS) for i in args.index):
        parser.error(f"unknown bug(s): {unknown or args.index}; see --list")
    if args.write and not args.survey:
        parser.error("--write needs --survey")
    chosen: list[EngineBug | None] = [ENGINE_BUGS[i] for i in args.index]
    chosen += [known[name] for name in args.bug]
    if not chosen:
        chosen = [None, *ENGINE_BUGS] if not args.no_control else list(ENGINE_BUGS)
    elif args.survey:
        chosen.insert(0, None)  # the control gives the durations
    terminate_on_sigterm()
    load_start = os.getloadavg()[0]
    start = time.monotonic()
    rows = []
    catches = load_catches()
    with (
        tempfile.TemporaryDirectory(prefix="prefixkv-engine-mutants-") as tmp,
        WarmPytest({**os.environ, "CI": "true"}) as server,
    ):
        warm = None if args.cold else server
        startup = None if warm is None else warm.start()
        for i, bug in enumerate(chosen):
            row = run_bug(
                bug,
                Path(tmp) / str(i),
                server=warm,
                tests=args.tests,
                jobs=args.jobs,
                timeout=args.timeout,
                catches=catches,
                survey=args.survey,
            )
            rows.append(row)
            _progress(f"{row['verdict']:<10} {row['bug']}: {row['error'] or row['check'] or ''}")
    wall = time.monotonic() - start
    load = {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)}
    failed = [row["bug"] for row in rows if not ok(row)]
    if args.write and not failed:
        CATCHES.write_text(json.dumps(survey_record(rows), indent=1, sort_keys=True) + "\n")
    if args.json:
        summary = {"rows": rows, "wall": round(wall, 1), "failed": failed}
        summary.update(server_startup=startup, load_average=load, cpus=os.cpu_count())
        print(json.dumps(summary, indent=2))
    else:
        print(format_table(rows))
        killed = sum(row["verdict"] in ("caught", "crash") for row in rows)
        bugs = sum(row["bug"] != CONTROL for row in rows)
        how = f"cold, {args.jobs} jobs" if args.cold else f"warm server, start-up {startup} s"
        print(f"\n{killed}/{bugs} bugs caught in {wall:.0f} s ({how}); load average {load}")
        if failed:
            print("FAILED: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
