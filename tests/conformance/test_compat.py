"""The Hypothesis and HypoFuzz internals the kit reaches are all still there.

:mod:`prefixkv.conformance._compat` is the one module that reaches them, and its
``REACHED`` lists each name. An upgrade that drops one fails here, naming the release, the
name and what the kit reaches it for, instead of a fallback going quiet in a campaign.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from prefixkv.conformance import _compat
from prefixkv.conformance._compat import REACHED, Reached, mends_due, missing

KIT = Path(_compat.__file__).resolve().parent


def _needed(reached: Reached) -> bool:
    """HypoFuzz's names are needed only where the mends install (up to AFFECTED_UP_TO)."""
    return reached.package == "hypothesis" or mends_due()


@pytest.mark.parametrize("reached", REACHED, ids=lambda r: f"{r.module}.{r.name}")
def test_every_reached_internal_is_there(reached: Reached) -> None:
    if not _needed(reached):
        pytest.skip(f"{reached.package} is not installed, or newer than the mends need")
    problem = missing(reached)
    assert problem is None, problem


def test_a_removed_name_is_reported_with_what_it_was_for() -> None:
    """The check itself: a name that is not there is named, with the release and its use."""
    gone = Reached(
        "hypothesis", "hypothesis.stateful", "RuleBasedStateMachine.no_such_name", "attribute", "x"
    )
    problem = missing(gone)
    assert problem is not None
    assert "hypothesis.stateful.RuleBasedStateMachine.no_such_name" in problem
    assert "for x" in problem
    unset = Reached("hypothesis", "hypothesis.stateful", "Rule.no_field", "instance", "y")
    assert missing(unset) is not None
    no_param = Reached("hypothesis", "hypothesis.internal.conjecture.data",
                       "ConjectureResult.no_param", "parameter", "z")  # fmt: skip
    assert missing(no_param) is not None


#: A module of these (or ``hypofuzz`` itself) is internal to the kit's view.
_INTERNAL = ("hypothesis.internal", "hypofuzz.")


def _internal_imports(path: Path) -> list[str]:
    """``hypothesis.internal`` and ``hypofuzz`` modules a kit module imports, or names as
    a string (``importlib.import_module``, ``sys.modules``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # a module named as a string; "hypofuzz" alone is the package's name (a version)
            names = [node.value] if node.value.startswith(_INTERNAL) else []
        found += [n for n in names if n.startswith(_INTERNAL) or n == "hypofuzz"]
    return found


def test_no_other_kit_module_reaches_an_internal() -> None:
    """Only _compat imports Hypothesis's internal modules or HypoFuzz, and each module it
    imports from has its names in REACHED."""
    outside = {
        str(p.relative_to(KIT)): _internal_imports(p)
        for p in KIT.rglob("*.py")
        if p.name != "_compat.py" and _internal_imports(p)
    }
    assert not outside, outside
    listed = {r.module for r in REACHED}
    assert set(_internal_imports(KIT / "_compat.py")) <= listed
