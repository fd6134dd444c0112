"""The engine's injected bugs (tests/mutation/engine_bugs.py): they apply, they are caught,
and the harness never touches the checkout.

The whole set takes a few minutes (``python -m tests.mutation.engine_bugs``, see
docs/engine.md); CI runs three representative bugs through the same harness and its warm
server (``test_representative_engine_bugs_are_caught``), checks that every patch still
applies, that a stale patch and a broken control fail loudly, that the harness's record
names every bug, and kills the harness mid-run to show the checkout keeps its bytes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mutation.engine_bugs import (
    CONTROL,
    ENGINE_BUGS,
    ROOT,
    EngineBug,
    PatchError,
    apply,
    load_catches,
    ok,
    run_bug,
    run_order,
)
from mutation.sandbox import checkout_digest, module_of, process_gone, stage_sources
from mutation.warm import WarmPytest

#: One bug in the torch-free scheduler, one in the torch engine and one on the hybrid path;
#: each is caught within seconds of the engine tests' start.
REPRESENTATIVE = (
    "cancel_step does not roll back appends",
    "kv write skipped for the last token of a step",
    "hybrid: restore never reported to the cache",
)


def test_every_engine_patch_applies(tmp_path: Path) -> None:
    assert len(ENGINE_BUGS) >= 15
    assert len({b.name for b in ENGINE_BUGS}) == len(ENGINE_BUGS)
    for bug in ENGINE_BUGS:
        text = (ROOT / bug.path).read_text(encoding="utf-8")
        assert text.count(bug.old) == 1, bug.name
        assert bug.old != bug.new
        module_of(bug.path)  # every patched file belongs to a package the copy maps


def test_patches_go_to_copies_only(tmp_path: Path) -> None:
    """``apply`` refuses the checkout; on a copy it changes that copy's file only."""
    bug = ENGINE_BUGS[0]
    with pytest.raises(ValueError, match="never the checkout"):
        apply(bug, ROOT)
    copy = tmp_path / "copy"
    stage_sources(copy)
    patched = apply(bug, copy)
    assert patched == copy / bug.path
    assert bug.new in patched.read_text(encoding="utf-8")
    assert bug.old in (ROOT / bug.path).read_text(encoding="utf-8")
    with pytest.raises(PatchError, match="occurs 0 times"):
        apply(bug, copy)  # already applied: the old text is gone


def test_the_copy_is_what_gets_imported(tmp_path: Path) -> None:
    """With the copy's ``PYTHONPATH``, every package resolves to the copy, not the checkout."""
    src = stage_sources(tmp_path)
    modules = sorted({module_of(bug.path) for bug in ENGINE_BUGS})
    code = (
        "import importlib, sys\nfor m in sys.argv[1:]: print(importlib.import_module(m).__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(src), "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", code, *modules],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    files = [Path(line) for line in proc.stdout.splitlines()]
    assert len(files) == len(modules)
    for file in files:
        assert file.is_relative_to(src), file
        assert not file.resolve().is_relative_to(ROOT), file


def _interruptible() -> None:
    """In the harness's process: take SIGINT as Ctrl-C would, even under a pytest-xdist
    worker, which ignores SIGINT (and children inherit an ignored signal)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_killing_the_harness_leaves_the_checkout_untouched(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Kill the harness while a patched copy is under test: the checkout keeps its bytes,
    and the child pytest dies with the harness."""
    before = checkout_digest(ROOT)
    index = next(i for i, b in enumerate(ENGINE_BUGS) if b.path.endswith("/scheduler.py"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.mutation.engine_bugs",
            "--no-control",
            "--jobs=1",
            str(index),
        ],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interruptible,
    )
    assert proc.stderr is not None
    line = next((line for line in proc.stderr if line.startswith("start ")), "")
    assert line, f"the harness ended before it started pytest ({proc.wait()})"
    child = int(line.split("(pid ")[1].split(")")[0])
    # the patch is in place in the copy while its pytest runs
    copy = Path(line.rsplit(" in ", 1)[1].strip())
    assert ENGINE_BUGS[index].new in (copy / ENGINE_BUGS[index].path).read_text()
    proc.send_signal(sig)
    proc.wait(timeout=120)
    proc.stderr.close()
    assert proc.returncode != 0
    assert checkout_digest(ROOT) == before
    assert process_gone(child), "the child pytest outlived the harness"
    if sig != signal.SIGKILL:  # an orderly stop also removes the copies
        assert not any(tmp_path.iterdir())
    else:  # the copy stays; a child that ran on to its end would have written its report
        assert not (copy.parent / "report.json").exists(), "the child ran on after the kill"


@pytest.mark.mutation
def test_representative_engine_bugs_are_caught(tmp_path: Path) -> None:
    """Three bugs through the real harness and its warm server: each is caught by a failing
    engine test, and each row splits its time into start-up and search."""
    known = {bug.name: bug for bug in ENGINE_BUGS}
    with WarmPytest({**os.environ, "CI": "true"}) as server:
        for i, name in enumerate(REPRESENTATIVE):
            row = run_bug(known[name], tmp_path / str(i), server=server, timeout=900)
            assert row["verdict"] == "caught", row
            assert row["check"].startswith("tests/engine/"), row
            assert ok(row)
            assert row["first_failure"] == pytest.approx(row["startup"] + row["search"], abs=0.02)


@pytest.mark.mutation
def test_a_wrong_record_still_finds_the_bug(tmp_path: Path) -> None:
    """The record only orders the suite: with a record whose listed test passes on the
    mutant, the rest of the suite still runs and catches the bug."""
    name = "cancel_step does not roll back appends"
    bug = next(b for b in ENGINE_BUGS if b.name == name)
    passing = "tests/engine/test_scheduler.py::test_verify_greedy"
    catches = {"durations": load_catches()["durations"], "catches": {name: [[passing, 0]]}}
    with WarmPytest({**os.environ, "CI": "true"}) as server:
        row = run_bug(bug, tmp_path, server=server, timeout=900, catches=catches)
    assert row["verdict"] == "caught", row
    assert row["check"] == "tests/engine/test_scheduler.py::test_cancel_step_gives_everything_back"


def test_a_stale_engine_patch_fails_loudly(tmp_path: Path) -> None:
    """A bug whose old text is gone is an error row (not caught, not missed): no test runs."""
    gone = EngineBug("gone", "src/prefixkv/engine/scheduler.py", "no such text\n", "")
    row = run_bug(gone, tmp_path, server=None, timeout=60)
    assert row["verdict"] == "error" and "occurs 0 times" in row["error"], row
    assert not ok(row)


@pytest.mark.mutation
def test_a_control_that_fails_is_an_error(tmp_path: Path) -> None:
    """The control must pass: a copy broken in a file no bug touches makes the control's
    row fail, so a harness that "catches" everything cannot look green."""
    broken = EngineBug(
        CONTROL,
        "tests/engine/test_scheduler.py",
        "from __future__ import annotations\n",
        "from __future__ import annotations\n\n\ndef test_broken_on_purpose() -> None:\n"
        "    raise AssertionError('the control copy is broken')\n",
    )
    # the broken test runs first (as a bug's past catcher would), so this stays short
    first = [[f"{broken.path}::test_broken_on_purpose", 0]]
    catches = {"durations": {}, "catches": {CONTROL: first}}
    with WarmPytest({**os.environ, "CI": "true"}) as server:
        row = run_bug(broken, tmp_path, server=server, timeout=900, catches=catches)
    assert row["verdict"] == "caught" and "broken_on_purpose" in row["check"], row
    assert not ok(row)


def test_the_record_names_every_bug() -> None:
    """``engine_catches.json`` (``--survey --write``) lists catchers for each bug, and the
    durations of the control run; each bug's own catchers run first."""
    catches = load_catches()
    assert set(catches["catches"]) == {bug.name for bug in ENGINE_BUGS}
    files = {nodeid.split("::")[0] for nodeid in catches["durations"]}
    assert all((ROOT / f).is_file() for f in files), files
    for bug in ENGINE_BUGS:
        assert catches["catches"][bug.name], bug.name
        order = run_order(bug, catches)
        cheapest = min(catches["catches"][bug.name], key=lambda pair: pair[1])
        assert order["first"][0] == cheapest[0]
    assert run_order(None, catches)["first"] == []


def test_the_child_runs_the_recorded_order(tmp_path: Path) -> None:
    """The first-failure plugin runs the listed tests first, then the rest by duration,
    then the unrecorded ones; it reports when the first test started."""
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_a.py").write_text(
        "def test_1(): pass\ndef test_2(): pass\ndef test_3(): assert False\n"
    )
    (tests / "test_b.py").write_text("def test_4(): pass\n")
    order = {
        "first": ["t/test_b.py::test_4", "t/test_a.py::test_3"],
        "durations": {"t/test_a.py::test_2": 0.1, "t/test_a.py::test_1": 0.5},
    }
    (tmp_path / "order.json").write_text(json.dumps(order))
    report = tmp_path / "report.json"
    env = {**os.environ, "PREFIXKV_MUTANT_ORDER": str(tmp_path / "order.json")}
    env.update(PREFIXKV_MUTANT_REPORT=str(report), PYTHONPATH=str(ROOT))
    env.pop("PREFIXKV_MUTANT_SRC", None)
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "tests.mutation.first_failure", "t"]
    cmd += ["-p", "no:cacheprovider", "-p", "no:xdist", "--rootdir", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    ran = [
        line.split(" ")[0]
        for line in proc.stdout.splitlines()
        if line.startswith("t/") and "::" in line
    ]
    assert ran == [
        "t/test_b.py::test_4",
        "t/test_a.py::test_3",
        "t/test_a.py::test_2",
        "t/test_a.py::test_1",
    ], proc.stdout
    result = json.loads(report.read_text())
    assert result["first"]["nodeid"] == "t/test_a.py::test_3"
    assert 0 <= result["first_test"] <= result["first"]["seconds"]
    assert [f["nodeid"] for f in result["failures"]] == ["t/test_a.py::test_3"]


def test_verdicts() -> None:
    """A control must pass; a bug must be caught (a crash at import also kills it)."""
    base = {"error": None, "check": None}
    assert ok({**base, "bug": CONTROL, "verdict": "passed"})
    assert not ok({**base, "bug": CONTROL, "verdict": "caught"})
    assert ok({**base, "bug": "b", "verdict": "caught"})
    assert ok({**base, "bug": "b", "verdict": "crash"})
    for verdict in ("missed", "error", "timeout", "passed"):
        assert not ok({**base, "bug": "b", "verdict": verdict})
