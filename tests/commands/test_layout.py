"""The commands package is the only home of the command line.

Library modules (the drivers, the benchmarks, kernels/, proofs/) never import a command
module or the registry, so a script can call the library without argparse, and every
command module is registered under its name.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import prefixkv.commands
from prefixkv import cli

ROOT = Path(__file__).resolve().parents[2]
#: The command line's own modules.
COMMAND_LINE = ("prefixkv.cli", "prefixkv.__main__", "prefixkv.commands")


def _package(path: Path) -> list[str]:
    """The dotted package of a source file, as installed (``kernels/`` is prefixkv.kernels)."""
    rel = path.resolve().relative_to(ROOT).parent.parts
    if rel[:2] == ("src", "prefixkv"):
        return ["prefixkv", *rel[2:]]
    return ["prefixkv", *rel]


def _imported(path: Path, package: list[str] | None = None) -> set[str]:
    """Every module ``path`` imports, lazy imports and registered targets included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = _package(path) if package is None else package
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            anchor = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*anchor, node.module])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("prefixkv.")
            and ":" in node.value
        ):
            found.add(node.value.partition(":")[0])
    return found


def _library_files() -> list[Path]:
    folders = [ROOT / "src" / "prefixkv", ROOT / "kernels", ROOT / "proofs"]
    files = [p for folder in folders for p in folder.rglob("*.py")]
    src = ROOT / "src" / "prefixkv"
    return [
        p
        for p in files
        if p.parent != src / "commands" and p not in (src / "cli.py", src / "__main__.py")
    ]


def _is_command_line(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in COMMAND_LINE)


def test_no_library_module_imports_the_command_line() -> None:
    files = _library_files()
    assert any(p.name == "simulation.py" for p in files) and len(files) > 50
    offenders = {
        str(p.relative_to(ROOT)): sorted(m for m in _imported(p) if _is_command_line(m))
        for p in files
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_check_sees_a_library_module_that_imports_a_command(tmp_path: Path) -> None:
    # The check above must be able to fail: a driver that reaches back for emit_json.
    bad = tmp_path / "driver.py"
    bad.write_text("def report():\n    from prefixkv.cli import emit_json\n")
    assert any(_is_command_line(m) for m in _imported(bad, ["prefixkv"]))
    relative = tmp_path / "relative.py"
    relative.write_text("from ..commands.bench import setup\n")
    assert any(_is_command_line(m) for m in _imported(relative, ["prefixkv", "benchmarks"]))
    # the proofs' own cli module is not the command line
    assert not any(_is_command_line(m) for m in _imported(relative, ["prefixkv", "proofs", "x"]))


def test_every_command_module_is_registered_by_its_name() -> None:
    modules = {
        m.name
        for m in pkgutil.iter_modules(prefixkv.commands.__path__)
        if m.name != "support"  # what the commands share, not a command
    }
    targets = {c.name: c.target for c in cli.commands() if isinstance(c.target, str)}
    for name in modules:
        command = name.replace("_", "-")
        assert targets[command] == f"prefixkv.commands.{name}:setup", command
        assert callable(importlib.import_module(f"prefixkv.commands.{name}").setup)
    # prove is the one command whose module still lives with the proofs
    assert {c for c, t in targets.items() if not t.startswith("prefixkv.commands.")} <= {"prove"}
