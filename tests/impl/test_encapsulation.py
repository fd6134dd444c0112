"""No module of ``impl/`` reaches into another object's private attributes.

Each part of the manager (the pool, the index, the leaf heap, the manager itself) owns its
fields: the others go through its public names. Read off the source with :mod:`ast`: an
attribute access ``x._name`` is allowed only on ``self``, ``cls`` or ``super()`` (a class's
own fields, and those it inherits). Dunder names (``__dict__``, ``__slots__``) are not
private.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

IMPL = Path(__file__).resolve().parents[2] / "impl"


def _is_own(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def private_reaches(source: str) -> list[str]:
    """``line: expression`` for every private attribute reached on something not its own."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        name = node.attr
        if not name.startswith("_") or (name.startswith("__") and name.endswith("__")):
            continue
        if not _is_own(node.value):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", sorted(IMPL.glob("*.py")), ids=lambda p: p.name)
def test_no_private_reach(path: Path) -> None:
    assert private_reaches(path.read_text(encoding="utf-8")) == []


def test_the_check_sees_a_reach() -> None:
    # The check must be able to fail: each of these reaches into another object.
    assert private_reaches("pool._grow(3)") == ["1: pool._grow"]
    assert private_reaches("self._pool._free") == ["1: self._pool._free"]
    assert private_reaches("twin._buckets[k] = 1") == ["1: twin._buckets"]
    assert private_reaches("self._pool.ref\ncls._make()\nsuper()._match(r)\nx.__dict__") == []
