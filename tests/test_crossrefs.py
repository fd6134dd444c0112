"""Every Sphinx cross-reference in a docstring or a docs page names something that exists.

A reference is a role and a target (``:class:`SpecCache```, ``:mod:`.kv```,
``:meth:`~.model.SpecDecisions.evict```): the target is imported, so a module that moved or
a class that was renamed fails here, naming the file, the line and the reference.

How a target resolves (the names are tried in this order; the first that imports wins):

* ``.name``: in the current module, in the enclosing class, then relative to the current
  package as a Python relative import would (one more leading dot per level up);
* ``name``: in the enclosing class, in the current module's namespace (what it defines or
  imports), then as an absolute dotted path (``prefixkv.spec.SpecCache``,
  ``random.Random``), then as a builtin.

``~`` and ``!`` prefixes, a trailing ``()`` and an explicit title (``title <target>``) are
stripped first. A ``:mod:`` target must resolve to a module. In docs pages the context is
the module named in the first cell of the table row a reference sits in (the module index
of docs/architecture.md), and none elsewhere.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import importlib.util
import inspect
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import attrs
import pytest

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("mod", "class", "func", "meth", "exc", "data", "attr")
_REF = re.compile(r":(?:py:)?(?P<role>" + "|".join(ROLES) + r"):`(?P<target>[^`]+)`")
_ROW_MODULE = re.compile(r"^\|\s*`(?P<module>prefixkv(?:\.\w+)*)`\s*\|")


def _architecture() -> ModuleType:
    spec = importlib.util.spec_from_file_location("architecture", ROOT / "scripts/architecture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@attrs.frozen
class Reference:
    where: str  # path:line
    role: str
    target: str
    module: str | None  # the module the reference is written in (None: no context)
    is_package: bool = False
    cls: str | None = None  # the enclosing class's qualified name


def _docstrings(tree: ast.Module) -> Iterator[tuple[str, int, str | None]]:
    """(docstring, first line, enclosing class) of the module and every class and function."""

    def visit(node: ast.AST, cls: str | None) -> Iterator[tuple[str, int, str | None]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                inner = cls
                if isinstance(child, ast.ClassDef):
                    inner = f"{cls}.{child.name}" if cls else child.name
                doc = ast.get_docstring(child, clean=False)
                if doc is not None:
                    yield doc, child.body[0].lineno, inner
                yield from visit(child, inner)

    doc = ast.get_docstring(tree, clean=False)
    if doc is not None:
        yield doc, tree.body[0].lineno, None
    yield from visit(tree, None)


def _refs_in(text: str, first_line: int) -> Iterator[tuple[int, str, str]]:
    for m in _REF.finditer(text):
        yield first_line + text.count("\n", 0, m.start()), m["role"], m["target"]


def docstring_references() -> list[Reference]:
    """Every reference in a docstring of the distribution's modules."""
    found: list[Reference] = []
    for module, path in _architecture().modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        shown = path.relative_to(ROOT)
        for doc, line, cls in _docstrings(tree):
            for at, role, target in _refs_in(doc, line):
                is_pkg = path.name == "__init__.py"
                found.append(Reference(f"{shown}:{at}", role, target, module, is_pkg, cls))
    return found


def page_references() -> list[Reference]:
    """Every reference in docs/*.md; a table row that names a module gives the context."""
    found: list[Reference] = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            row = _ROW_MODULE.match(line)
            module = row["module"] if row else None
            for _, role, target in _refs_in(line, n):
                found.append(Reference(f"{path.relative_to(ROOT)}:{n}", role, target, module))
    return found


def _instance_attributes(cls: type) -> set[str]:
    """The names a class (or a base) declares by annotation or assigns as ``self.name``."""
    names: set[str] = set()
    for klass in cls.__mro__:
        names |= set(getattr(klass, "__annotations__", {}))
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue  # a builtin or a class without source
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return names


def _lookup(dotted: str) -> object:
    """The object at ``dotted``: the longest importable module prefix, then attributes.
    Raises LookupError when nothing of that name exists."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            obj: object = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name is not None and (name == e.name or name.startswith(e.name + ".")):
                continue  # no module of that name: try a shorter prefix
            raise
        for attr in parts[cut:]:
            if hasattr(obj, attr):
                obj = getattr(obj, attr)
            elif isinstance(obj, type) and attr in _instance_attributes(obj):
                obj = None  # a field declared by annotation, or set on ``self``
            else:
                raise LookupError(dotted)
        return obj
    raise LookupError(dotted)


def _candidates(ref: Reference, target: str) -> Iterator[str]:
    module, cls = ref.module, ref.cls
    if target.startswith("."):
        name = target.lstrip(".")
        if module is None:
            return
        yield f"{module}.{name}"
        if cls:
            yield f"{module}.{cls}.{name}"
        base = module if ref.is_package else module.rpartition(".")[0]
        for _ in range(len(target) - len(name) - 1):
            base = base.rpartition(".")[0]
        if base:
            yield f"{base}.{name}"
        return
    if module is not None:
        if cls:
            yield f"{module}.{cls}.{target}"
        yield f"{module}.{target}"
    yield target
    yield f"{builtins.__name__}.{target}"


def _target(raw: str) -> str:
    target = raw.strip()
    if target.endswith(">") and "<" in target:
        target = target[target.rindex("<") + 1 : -1]
    target = target.lstrip("~!")
    return target.removesuffix("()")


def resolves(ref: Reference) -> bool:
    """Whether ``ref`` names something that imports (a module, for ``:mod:``)."""
    for dotted in _candidates(ref, _target(ref.target)):
        try:
            obj = _lookup(dotted)
        except LookupError:
            continue
        if ref.role != "mod" or isinstance(obj, ModuleType):
            return True
    return False


def _unresolved(refs: list[Reference]) -> list[str]:
    return [f"{r.where}: :{r.role}:`{r.target}`" for r in refs if not resolves(r)]


def test_docstring_references_resolve() -> None:
    refs = docstring_references()
    assert len(refs) > 300, "the scan found too few references: is the role pattern right?"
    bad = _unresolved(refs)
    assert not bad, "references that do not resolve:\n" + "\n".join(bad)


def test_docs_page_references_resolve() -> None:
    refs = page_references()
    assert refs, "the scan found no reference in docs/*.md"
    bad = _unresolved(refs)
    assert not bad, "references that do not resolve:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("target", "module", "is_package", "ok"),
    [
        ("prefixkv.spec.SpecCache", None, False, True),
        ("~prefixkv.spec.SpecCache.admit", None, False, True),
        ("prefixkv.spec.NoSuchCache", None, False, False),
        (".kv", "prefixkv.proofs", True, True),
        (".model.Bounds", "prefixkv.proofs.kv.transitions", False, True),
        (".nope", "prefixkv.proofs.kv.transitions", False, False),
        ("..driver", "prefixkv.proofs.kv.transitions", False, True),
        ("SpecCache", "prefixkv.spec.cache", False, True),
        ("ValueError", "prefixkv.spec.cache", False, True),
    ],
)
def test_resolver(target: str, module: str | None, is_package: bool, ok: bool) -> None:
    # The check must be able to fail: a moved module or a renamed class does not resolve.
    assert resolves(Reference("here", "class", target, module, is_package)) is ok


def test_a_module_role_needs_a_module() -> None:
    assert not resolves(Reference("here", "mod", "prefixkv.spec.SpecCache", None))
    assert resolves(Reference("here", "mod", "prefixkv.spec.cache", None))
