"""The engine's injected bugs (tests/mutation/engine_bugs.py): they apply, they are caught,
and the harness never touches the checkout.

The whole set takes about 15 minutes (``python -m tests.mutation.engine_bugs``, see
docs/engine.md); CI runs three representative bugs through the same harness
(``test_representative_engine_bugs_are_caught``), checks that every patch still applies,
and kills the harness mid-run to show the checkout keeps its bytes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mutation.engine_bugs import CONTROL, ENGINE_BUGS, ROOT, PatchError, apply, ok, run_bug
from mutation.sandbox import checkout_digest, module_of, process_gone, stage_sources

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


@pytest.mark.mutation
def test_representative_engine_bugs_are_caught(tmp_path: Path) -> None:
    """Three bugs through the real harness: each is caught by a failing engine test."""
    known = {bug.name: bug for bug in ENGINE_BUGS}
    for i, name in enumerate(REPRESENTATIVE):
        row = run_bug(known[name], tmp_path / str(i), jobs=1, timeout=900)
        assert row["verdict"] == "caught", row
        assert row["check"].startswith("tests/engine/"), row
        assert ok(row)


def test_verdicts() -> None:
    """A control must pass; a bug must be caught (a crash at import also kills it)."""
    base = {"error": None, "check": None}
    assert ok({**base, "bug": CONTROL, "verdict": "passed"})
    assert not ok({**base, "bug": CONTROL, "verdict": "caught"})
    assert ok({**base, "bug": "b", "verdict": "caught"})
    assert ok({**base, "bug": "b", "verdict": "crash"})
    for verdict in ("missed", "error", "timeout", "passed"):
        assert not ok({**base, "bug": "b", "verdict": verdict})
