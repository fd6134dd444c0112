"""No function in ``spec/``, ``impl/`` or ``proofs/`` is longer than :data:`MAX_LINES` lines.

A function that grows past a screen is split where it has parts: one method per clause of
an invariant or a proof, one per phase of a run or an operation (``run`` is a loop over the
models' suites). The Triton kernels (``kernels/``) are not held to it: a kernel is one
function by construction.
The count is the function's whole extent in the source (decorators excluded, its docstring
and nested functions included), read with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 80


def long_functions(source: str, name: str, limit: int = MAX_LINES) -> list[str]:
    """``name:line function (n lines)`` for every function of ``source`` over ``limit``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f"{name}:{node.lineno} {node.name} ({n} lines)")
    return out


@pytest.mark.parametrize(("tree", "modules"), [("spec", 20), ("impl", 10), ("proofs", 30)])
def test_no_function_is_over_80_lines(tree: str, modules: int) -> None:
    paths = sorted((ROOT / tree).rglob("*.py"))
    assert len(paths) > modules, f"the scan found too few modules in {tree}/"
    found = [
        f
        for p in paths
        for f in long_functions(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))
    ]
    assert found == [], "split these functions:\n" + "\n".join(found)


def test_a_long_function_is_found() -> None:
    # The check must be able to fail: nested and method bodies count, lines are inclusive.
    body = "\n".join(f"        x{i} = {i}" for i in range(79))
    source = f"class C:\n    def long(self) -> None:\n{body}\n\n    def short(self) -> None: ...\n"
    assert long_functions(source, "m.py", limit=79) == ["m.py:2 long (80 lines)"]
    assert long_functions(source, "m.py", limit=80) == []
