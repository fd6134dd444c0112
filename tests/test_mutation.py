"""The bug-injection harness: every known bug in tests/mutation/bugs.py must be caught.

Runs ``python -m tests.mutation.run --json`` (a subprocess per bug, two at a time), which
re-inserts each bug into a temporary copy of impl/ and runs the differential machines on it.
It also fails when a patch no longer applies to the impl, or when the unpatched control run
fails. The faster tests pin the harness itself: a mutant that crashes at import is killed by
a crash (never a survivor or an error), and killing the harness leaves the checkout as it
was. See docs/testing.md.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
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


#: ruff's undefined-name rule alone, whatever the project's configuration.
_UNDEFINED_NAMES = (
    *(sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache"),
    *("--select", "F821", "--output-format", "concise"),
)


def test_no_patch_leaves_an_undefined_name(tmp_path: Path) -> None:
    """A patched impl names only what it defines. A patch that names a variable the code
    does not have makes the mutant raise ``NameError`` where the bug should act, so the
    machines catch a crash (seen as a different raise than the spec's), not the bug class
    the patch stands for. Checked with ruff's undefined-name rule (F821) on each patched
    file."""
    from mutation.run import BUGS, apply_bug, copy_impl

    for bug in BUGS:
        directory = copy_impl(tmp_path / bug.name)
        apply_bug(bug, directory)
        files = sorted({str(directory / file) for file, _, _ in bug.patches})
        proc = subprocess.run(
            [*_UNDEFINED_NAMES, *files],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, f"{bug.name}: {proc.stdout}{proc.stderr}"


def _defined_attributes(directory: Path) -> set[str]:
    """Every attribute name the impl copy in ``directory`` defines (its classes' methods,
    class-level names and ``__slots__``, and every attribute it assigns anywhere), and
    whatever the spec's protocols, the managers' bases, define."""
    from prefixkv.spec import protocol

    names = {name for cls in vars(protocol).values() if isinstance(cls, type) for name in dir(cls)}
    for path in directory.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names |= {t.id for t in item.targets if isinstance(t, ast.Name)}
                        if any(
                            isinstance(t, ast.Name) and t.id == "__slots__" for t in item.targets
                        ):
                            names |= {
                                c.value
                                for c in ast.walk(item.value)
                                if isinstance(c, ast.Constant) and isinstance(c.value, str)
                            }
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return names


def test_no_patch_names_a_missing_attribute(tmp_path: Path) -> None:
    """Every ``self.<name>`` a patch writes is something the patched impl defines. A patch
    written against a method that has since moved (``self._publish`` after publication
    became its own part) makes the mutant raise ``AttributeError`` where the bug should
    act: a crash, not the bug class the patch stands for."""
    from mutation.run import BUGS, apply_bug, copy_impl

    for bug in BUGS:
        directory = copy_impl(tmp_path / bug.name)
        apply_bug(bug, directory)
        defined = _defined_attributes(directory)
        named = {name for _, _, new in bug.patches for name in re.findall(r"self\.(\w+)", new)}
        assert named <= defined, f"{bug.name}: {sorted(named - defined)}"


def test_the_missing_attribute_check_can_fail(tmp_path: Path) -> None:
    """The check above sees an attribute that the impl does not define."""
    from mutation.run import copy_impl

    defined = _defined_attributes(copy_impl(tmp_path))
    assert {"_pool", "_publisher", "publish", "pool", "admit", "block_size"} <= defined
    assert "_publish" not in defined


def test_the_undefined_name_check_can_fail(tmp_path: Path) -> None:
    """The check above sees an undefined name in a patched file."""
    path = tmp_path / "mutant.py"
    path.write_text("def f() -> int:\n    return scheduled\n")
    proc = subprocess.run(
        [*_UNDEFINED_NAMES, str(path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "scheduled" in proc.stdout


def test_every_stage_builds() -> None:
    """Every configuration of the schedule builds, and a focus names only real rules and
    keeps the machine's checks (it only skips rules: ``skip`` refuses an unknown name)."""
    from mutation.worker import (
        CONFIGS,
        FOCUS,
        HYBRID_CONFIGS,
        MACHINES,
        STEP_CONFIGS,
        build_stage_machine,
    )

    from prefixkv.conformance.machines.differential import all_rule_names

    assert set(FOCUS) <= set(CONFIGS) | set(HYBRID_CONFIGS)
    for config in [*CONFIGS, *HYBRID_CONFIGS, *STEP_CONFIGS]:
        machine, steps = build_stage_machine(config)
        assert steps > 0
        rules = set(all_rule_names(machine))
        if config in FOCUS:
            assert rules == {"init", *FOCUS[config]}, config
    used = {stage.config for stages in MACHINES.values() for stage in stages}
    assert used == set(CONFIGS) | set(HYBRID_CONFIGS) | set(STEP_CONFIGS)


def test_a_stale_patch_fails_loudly(tmp_path: Path) -> None:
    """A patch whose text is not in the impl (or occurs twice) is an error, not a pass."""
    from mutation.run import Bug, PatchError, apply_bug, copy_impl

    directory = copy_impl(tmp_path)
    with pytest.raises(PatchError, match="occurs 0 times"):
        apply_bug(Bug("gone", "-", (("cache.py", "no such text\n", ""),)), directory)
    with pytest.raises(PatchError, match=r"occurs [2-9]\d* times"):
        apply_bug(Bug("twice", "-", (("cache.py", "def ", "def "),)), directory)


def _import_crash(directory: Path, error: str) -> tuple[str, str, str]:
    """A patch that makes the impl package raise at import (whatever its code looks like)."""
    text = (directory / "__init__.py").read_text()
    return ("__init__.py", text, text + f"\nraise {error}('this mutant cannot be imported')\n")


@pytest.mark.parametrize("error", ["RuntimeError", "ImportError", "SystemExit"])
def test_an_import_crashing_mutant_is_killed_by_a_crash(tmp_path: Path, error: str) -> None:
    """A mutant that raises at import is a kill by a crash: never a survivor, never an error."""
    from mutation.run import Bug, copy_impl, format_table, ok, run_one

    bug = Bug("import_crash", "raises at import", (_import_crash(copy_impl(tmp_path), error),))
    row = run_one(bug, tmp_path / "run", shrink=False, timeout=300)
    assert row["error"] is None, row
    assert row["caught"] is True and row["killed_by"] == "crash", row
    assert row["check"] == f"CRASH(import: {error})" and row["stage"] == "import", row
    assert "this mutant cannot be imported" in row["message"]
    assert row["startup"] is not None and row["startup"] >= 0
    assert ok(row)
    assert "crash" in format_table([row]).splitlines()[-1]


def test_an_import_crashing_control_fails(tmp_path: Path) -> None:
    """The same crash in a control run is a failure of the run, not a pass."""
    from mutation.run import CONTROL, ok

    row = {"bug": CONTROL, "applies": True, "error": None, "caught": True, "killed_by": "crash"}
    assert not ok(row)


def _interruptible() -> None:
    """In the harness's process: take SIGINT as Ctrl-C would, even under a pytest-xdist
    worker, which ignores SIGINT (and children inherit an ignored signal)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_harness(args: list[str], tmp: Path) -> tuple[subprocess.Popen[str], int]:
    """Start a harness with its temporary files under ``tmp``; wait until a worker runs.

    Returns the harness and its worker's pid.
    """
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interruptible,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("start "):
            return proc, int(line.split("(pid ")[1].split(")")[0])
    proc.wait()
    raise AssertionError(f"the harness ended before it started a worker ({proc.returncode})")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_killing_the_cache_harness_leaves_the_checkout_untouched(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """Kill ``tests.mutation.run`` while a mutant runs: the checkout keeps its bytes."""
    from mutation.sandbox import checkout_digest, process_gone

    before = checkout_digest(ROOT)
    args = ["tests.mutation.run", "--bug", "free_queue_lifo", "--jobs", "1"]
    proc, worker = start_harness(args, tmp_path)
    proc.send_signal(sig)
    proc.wait(timeout=120)
    assert proc.returncode != 0
    assert checkout_digest(ROOT) == before
    assert process_gone(worker), "the worker outlived its harness"
    if sig != signal.SIGKILL:  # an orderly stop also removes its temporary copies
        assert not [p for p in tmp_path.iterdir() if p.name.startswith("prefixkv-")]
