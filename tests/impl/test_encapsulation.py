"""Each part of the manager owns its fields; the pool's columns are written by the pool alone.

Read off the source with :mod:`ast`, three rules:

* **No private reach.** No module of ``impl/`` reaches into another object's private
  attributes: an attribute access ``x._name`` is allowed only on ``self``, ``cls`` or
  ``super()`` (a class's own fields, and those it inherits). Dunder names (``__dict__``,
  ``__slots__``) are not private.
* **No private reach by name.** Nor through ``getattr``, ``setattr``, ``hasattr``,
  ``delattr`` or ``operator.attrgetter`` with a string: in ``impl/``, a private name on
  anything but ``self`` or ``cls``; anywhere in the package (the conformance kit, the
  engine, the benchmarks), a private attribute that ``impl/`` defines.
* **Pool columns are written by the pool.** The columns of ``BlockPool`` (its public
  ``__slots__``, the data model in its docstring) are read directly by the other modules
  of ``impl/`` (for speed), but written only by ``impl/_pool.py``: no other module of the
  package assigns one (``pool.x = ...``), stores into one (``pool.x[i] = ...``, ``+=``,
  ``del``), calls a mutating method on one (``pool.released.append(...)``) or hands one to
  ``heapq``, also through a local name bound to it (``ref = pool.ref; ref[b] = 1``) or to
  the pool (``p = self._pool``), or through ``setattr``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from prefixkv.impl._pool import BlockPool

ROOT = Path(__file__).resolve().parents[2]
IMPL = ROOT / "impl"
PACKAGE = ROOT / "src" / "prefixkv"
POOL_MODULE = IMPL / "_pool.py"

#: The pool's columns: every public slot.
COLUMNS = frozenset(name for name in BlockPool.__slots__ if not name.startswith("_"))

#: Methods that change a list, deque, dict, array or bytearray in place.
MUTATORS = frozenset(
    {
        *("append", "appendleft", "extend", "extendleft", "insert", "pop", "popleft"),
        *("popitem", "remove", "clear", "update", "setdefault", "sort", "reverse"),
        *("rotate", "byteswap", "frombytes", "fromlist", "fromunicode", "fromfile"),
        *("__setitem__", "__delitem__", "__iadd__", "__imul__"),
    }
)

#: Functions that change their first argument in place.
IN_PLACE = frozenset(
    {"heappush", "heappop", "heapify", "heapreplace", "heappushpop", "insort", "insort_left"}
)

#: Calls that name an attribute with a string (the attribute is their second argument,
#: or every argument of ``attrgetter``).
BY_NAME = frozenset({"getattr", "setattr", "hasattr", "delattr"})


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


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _named_attributes(call: ast.Call) -> Iterator[tuple[ast.expr | None, str]]:
    """(receiver, name) for each attribute ``call`` names with a string literal."""
    name = _called_name(call)
    if name in BY_NAME and len(call.args) >= 2:
        arg = call.args[1]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            yield call.args[0], arg.value
    elif name == "attrgetter":
        for arg in call.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield None, arg.value.split(".")[0]


def private_names_reached(source: str, defined: frozenset[str] | None = None) -> list[str]:
    """``line: call`` for every ``getattr``-like call that names a private attribute with a
    string: on anything but ``self``/``cls`` (``defined`` None), or one of ``defined``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        for receiver, name in _named_attributes(node):
            if not _private(name):
                continue
            if defined is None:
                if receiver is None or not _is_own(receiver):
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
            elif name in defined:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def impl_private_names() -> frozenset[str]:
    """The private attributes ``impl/`` defines: ``self._x = ...``, ``def _x`` in a class,
    and private ``__slots__`` entries."""
    names: set[str] = set()
    for path in IMPL.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "__slots__" for t in item.targets
                    ):
                        for elt in ast.walk(item.value):
                            if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                                names.add(elt.value)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and _is_own(node.value)
            ):
                names.add(node.attr)
    return frozenset(name for name in names if _private(name))


class _Scope:
    """The local names of one function bound to the pool or to one of its columns."""

    def __init__(self) -> None:
        self.pools: set[str] = set()
        self.columns: dict[str, str] = {}

    def is_pool(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id == "pool" or node.id in self.pools
        return isinstance(node, ast.Attribute) and node.attr in ("pool", "_pool")

    def column(self, node: ast.expr) -> str | None:
        """The column ``node`` is, if it is one (``pool.ref`` or a name bound to it)."""
        if isinstance(node, ast.Attribute) and node.attr in COLUMNS and self.is_pool(node.value):
            return node.attr
        if isinstance(node, ast.Name):
            return self.columns.get(node.id)
        if isinstance(node, ast.NamedExpr):
            return self.column(node.value)
        return None

    def bind(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            if len(target.elts) == len(value.elts):
                for t, v in zip(target.elts, value.elts, strict=True):
                    self.bind(t, v)
            return
        if not isinstance(target, ast.Name):
            return
        self.pools.discard(target.id)
        self.columns.pop(target.id, None)
        column = self.column(value)
        if column is not None:
            self.columns[target.id] = column
        elif self.is_pool(value):
            self.pools.add(target.id)


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def _flatten(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _flatten(elt)
    elif isinstance(target, ast.Starred):
        yield from _flatten(target.value)
    else:
        yield target


#: Scopes of their own: their bodies are checked separately.
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _shallow(node: ast.AST) -> Iterator[ast.AST]:
    """``node`` and what it contains, short of nested functions and classes."""
    yield node
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, _SCOPES):
            yield from _shallow(child)


def _bindings(node: ast.AST) -> list[tuple[ast.expr, ast.expr]]:
    """(target, value) for each name ``node`` binds to a value."""
    if isinstance(node, ast.Assign):
        return [(target, node.value) for target in node.targets]
    if isinstance(node, ast.AnnAssign) and node.value is not None:
        return [(node.target, node.value)]
    if isinstance(node, ast.NamedExpr):
        return [(node.target, node.value)]
    return []


def _writes_in(body: list[ast.stmt], scope: _Scope) -> Iterator[tuple[int, str]]:
    """(line, column) for each write to a pool column in ``body``, statements in order
    (a name's binding applies to the statements after it)."""
    for stmt in body:
        if isinstance(stmt, _SCOPES):
            continue
        for node in _shallow(stmt):
            for target in _targets(node):
                for t in _flatten(target):
                    # ``pool.x = ...`` rebinds the column; ``x += ...`` on a name bound to
                    # one changes it in place (a list, a deque, an array); ``x = ...`` only
                    # rebinds the name.
                    in_place = isinstance(node, ast.AugAssign) and isinstance(t, ast.Name)
                    column = scope.column(t) if isinstance(t, ast.Attribute) or in_place else None
                    if column is None and isinstance(t, ast.Subscript):
                        column = scope.column(t.value)
                    if column is not None:
                        yield t.lineno, column
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute) and func.attr in MUTATORS:
                    column = scope.column(func.value)
                    if column is not None:
                        yield node.lineno, column
                name = _called_name(node)
                if name in IN_PLACE and node.args:
                    column = scope.column(node.args[0])
                    if column is not None:
                        yield node.lineno, column
                if name in ("setattr", "delattr") and len(node.args) >= 2:
                    arg = node.args[1]
                    if (
                        scope.is_pool(node.args[0])
                        and isinstance(arg, ast.Constant)
                        and arg.value in COLUMNS
                    ):
                        yield node.lineno, str(arg.value)
        # Bindings take effect after the statement (walrus bindings included).
        for node in _shallow(stmt):
            for target, value in _bindings(node):
                scope.bind(target, value)


def column_writes(source: str) -> list[str]:
    """``line: column`` for every write to a pool column in ``source``, a module other than
    the pool's. Each function is its own scope; module level is one too."""
    tree = ast.parse(source)
    found: set[tuple[int, str]] = set()
    bodies: list[list[ast.stmt]] = [tree.body]
    bodies += [node.body for node in ast.walk(tree) if isinstance(node, _SCOPES)]
    for body in bodies:
        found.update(_writes_in(body, _Scope()))
    return [f"{line}: {column}" for line, column in sorted(found)]


def _package_modules() -> list[Path]:
    return sorted([*IMPL.glob("*.py"), *PACKAGE.rglob("*.py")])


def _ids(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", sorted(IMPL.glob("*.py")), ids=lambda p: p.name)
def test_no_private_reach(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert private_reaches(source) == []
    assert private_names_reached(source) == []


def test_the_package_reaches_no_impl_private_by_name() -> None:
    defined = impl_private_names()
    assert {"_pool", "_index", "_seqs"} <= defined  # the collection sees the manager's fields
    found = {
        _ids(path): hits
        for path in _package_modules()
        if (hits := private_names_reached(path.read_text(encoding="utf-8"), defined))
    }
    assert found == {}


@pytest.mark.parametrize("path", [p for p in _package_modules() if p != POOL_MODULE], ids=_ids)
def test_no_pool_column_written_outside_the_pool(path: Path) -> None:
    assert column_writes(path.read_text(encoding="utf-8")) == []


def test_the_pool_writes_its_columns() -> None:
    # The rule sees the pool's own writes when it is pointed at them (``self`` there).
    source = POOL_MODULE.read_text(encoding="utf-8").replace("self.", "pool.")
    written = {hit.split(": ")[1] for hit in column_writes(source)}
    assert written == COLUMNS


def test_the_check_sees_a_reach() -> None:
    # The check must be able to fail: each of these reaches into another object.
    assert private_reaches("pool._grow(3)") == ["1: pool._grow"]
    assert private_reaches("self._pool._free") == ["1: self._pool._free"]
    assert private_reaches("twin._buckets[k] = 1") == ["1: twin._buckets"]
    assert private_reaches("self._pool.ref\ncls._make()\nsuper()._match(r)\nx.__dict__") == []


def test_the_check_sees_a_reach_by_name() -> None:
    assert private_names_reached("getattr(cand, '_leaves', None)") == [
        "1: getattr(cand, '_leaves', None)"
    ]
    assert private_names_reached("setattr(pool, '_x', 1)\nhasattr(m, '_y')") == [
        "1: setattr(pool, '_x', 1)",
        "2: hasattr(m, '_y')",
    ]
    assert private_names_reached("attrgetter('_pool.ref')") == ["1: attrgetter('_pool.ref')"]
    assert private_names_reached("getattr(self, '_x')\ngetattr(x, 'ref')\ngetattr(x, n)") == []
    # Outside impl/: only the impl's own private names.
    defined = frozenset({"_leaves"})
    assert private_names_reached("getattr(c, '_leaves')\ngetattr(e, '_fields')", defined) == [
        "1: getattr(c, '_leaves')"
    ]


def test_the_check_sees_a_column_write() -> None:
    # Each of these writes a column from outside the pool.
    cases = {
        "pool.ref[b] = 1": "ref",
        "pool.num_children[p] -= 1": "num_children",
        "self._pool.num_used += 1": "num_used",
        "self.pool.released.append(b)": "released",
        "pool.extra.pop(b, None)": "extra",
        "pool.fresh_next = 0": "fresh_next",
        "del pool.extra[b]": "extra",
        "pool.tokens[0:4] = raw": "tokens",
        "setattr(pool, 'gen', g)": "gen",
        "heapq.heappush(pool.released, b)": "released",
        "def f(pool):\n    ref = pool.ref\n    ref[b] = 1": "ref",
        "def f(self):\n    p = self._pool\n    p.depth[b] = 0": "depth",
        "def f(pool):\n    a, c = pool.ref, pool.num_children\n    c[p] = left": "num_children",
        "def f(pool):\n    x, (y, z) = 1, (2, 3)\n    (ref := pool.ref)[b] = 2": "ref",
        "def f(pool):\n    free = pool.released\n    free += [b]": "released",
    }
    for source, column in cases.items():
        hits = column_writes(source)
        assert [hit.split(": ")[1] for hit in hits] == [column], source
    # Reads, and writes to other objects, are not writes to the pool.
    reads = [
        "x = pool.ref[b]",
        "def f(pool):\n    ref = pool.ref\n    return ref[b] + 1",
        "def f(pool):\n    ref = pool.ref\n    ref = []\n    ref.append(1)",
        "seq.namespace = ns\nreq.tokens.append(t)\nself.ref[b] = 1",
        "victims.append(b)",
    ]
    for source in reads:
        assert column_writes(source) == [], source
