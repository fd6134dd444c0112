"""The fused steps (``impl/_fused.py``): the copies of the argument-check predicate agree.

``commit``'s fast path, ``advance`` and the batch loop (``_apply_steps``, which
``advance_batch`` and ``advance_columns`` run) each check their arguments inline, in a few
predicates, rather than in one helper: a call per decode step measured +3.4% to +7.1% of
the life-cycle replay's instructions (the NOTE in ``FusedSteps.advance``). These tests read
the three copies off the source and prove them one predicate: the same conjuncts, modulo
local names, in the same two stages (the types first, then the values), and the same check
of each token.
``commit``'s copy is the step's predicate at ``num_rejected = num_reserve = 0``: it leaves
out exactly the conjuncts on those two, each of which holds there.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from types import SimpleNamespace

import attrs
import pytest
from prefixkv.impl import PrefixCacheManager
from prefixkv.impl._fused import FusedSteps
from prefixkv.impl.hybrid import HybridPrefixCacheManager

#: The three copies: the method that holds each.
COPIES = ("commit", "advance", "_apply_steps")
#: A gate that is not an argument check: off with a checkpoint store, whose hooks the fused
#: paths would skip (the manager's advance then runs its public calls in turn).
GATE = "self._fused_inline"
#: The step's arguments that a commit does not take (both 0 for a commit).
STEP_ONLY = frozenset({"num_rejected", "num_reserve"})


@attrs.frozen
class Predicate:
    """One copy, normalized: locals replaced by what they stand for."""

    #: The type checks (the outer ``if``), then the value checks (the inner one), each as
    #: ``ast.dump`` of a conjunct.
    types: frozenset[str]
    values: frozenset[str]
    #: The check of one token (the loop's ``if``; a token that fails it ends the fast path).
    token: str
    #: Every conjunct's source, by its dump (for messages and evaluation).
    source: dict[str, str]


class _Substitute(ast.NodeTransformer):
    """Replace each local name by the expression it was assigned (already substituted)."""

    def __init__(self, values: dict[str, ast.expr]) -> None:
        self.values = values

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if isinstance(node.ctx, ast.Load) and node.id in self.values:
            return self.values[node.id]
        return node


def _conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [c for v in test.values for c in _conjuncts(v)]
    return [test]


def _is_guard(node: ast.AST) -> bool:
    """The outer ``if`` of a copy: it checks ``type(num_computed) is int``."""
    return isinstance(node, ast.If) and any(
        ast.unparse(c) == "type(num_computed) is int" for c in _conjuncts(node.test)
    )


def read_predicate(source: str) -> Predicate:
    """The predicate of the copy in ``source`` (one function's source)."""
    tree = ast.parse(textwrap.dedent(source))
    guard = next(node for node in ast.walk(tree) if _is_guard(node))
    assert isinstance(guard, ast.If)
    values: dict[str, ast.expr] = {}
    inner: ast.If | None = None
    for stmt in guard.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            values[stmt.targets[0].id] = _Substitute(values).visit(stmt.value)
        elif isinstance(stmt, ast.If):
            inner = stmt
            break
    assert inner is not None, "no value checks after the type checks"
    loop = inner.body[0]
    assert isinstance(loop, ast.For) and ast.unparse(loop.iter) == "accepted_tokens"
    assert isinstance(loop.body[0], ast.If) and isinstance(loop.body[0].body[0], ast.Break)
    sub = _Substitute(values)
    source_of: dict[str, str] = {}

    def normal(parts: list[ast.expr]) -> frozenset[str]:
        out = set()
        for part in parts:
            part = sub.visit(part)
            key = ast.dump(part)
            source_of[key] = ast.unparse(part)
            out.add(key)
        return frozenset(out)

    types = normal([c for c in _conjuncts(guard.test) if ast.unparse(c) != GATE])
    return Predicate(types, normal(_conjuncts(inner.test)), ast.dump(loop.body[0].test), source_of)


def _copies() -> dict[str, Predicate]:
    return {name: read_predicate(inspect.getsource(getattr(FusedSteps, name))) for name in COPIES}


def _mentions(source: str, names: frozenset[str]) -> bool:
    return any(
        isinstance(n, ast.Name) and n.id in names for n in ast.walk(ast.parse(source, mode="eval"))
    )


def _differences(step: Predicate, other: Predicate, *, commit: bool) -> list[str]:
    """How ``other`` differs from the step predicate (none when they are one predicate)."""
    out = []
    for stage in ("types", "values"):
        want: frozenset[str] = getattr(step, stage)
        have: frozenset[str] = getattr(other, stage)
        if commit:  # the conjuncts on the step-only arguments are left out, and only those
            want = frozenset(c for c in want if not _mentions(step.source[c], STEP_ONLY))
        out += [f"{stage}: missing {step.source[c]}" for c in sorted(want - have)]
        out += [f"{stage}: extra {other.source[c]}" for c in sorted(have - want)]
    if other.token != step.token:
        out.append("the token check differs")
    return out


def test_advance_and_the_batch_loop_check_the_same_predicate() -> None:
    copies = _copies()
    assert _differences(copies["advance"], copies["_apply_steps"], commit=False) == []


def test_commit_checks_the_step_predicate_without_the_step_only_arguments() -> None:
    copies = _copies()
    assert _differences(copies["advance"], copies["commit"], commit=True) == []


def test_the_conjuncts_a_commit_leaves_out_hold_for_a_commit() -> None:
    """Each conjunct on ``num_rejected`` or ``num_reserve`` is true when both are 0, for
    any counts of a sequence: leaving it out of commit's copy changes no verdict."""
    step = _copies()["advance"]
    left_out = [
        step.source[c]
        for c in sorted(step.types | step.values)
        if _mentions(step.source[c], STEP_ONLY)
    ]
    assert len(left_out) == 5  # two types, not num_rejected, two on the reservation
    for computed, reserved, prompt_len, num_computed in itertools.product(range(4), repeat=4):
        env = {
            "seq": SimpleNamespace(
                num_computed=computed, num_reserved=reserved, prompt_len=prompt_len
            ),
            "num_computed": num_computed,
            "num_rejected": 0,
            "num_reserve": 0,
        }
        for source in left_out:
            assert eval(source, {}, env), source  # the project's own source


@pytest.mark.parametrize(
    ("copy", "old", "new"),
    [
        ("_apply_steps", "and reserved <= grown", "and reserved < grown"),
        ("advance", "type(num_reserve) is int", "type(num_reserve) is not bool"),
        ("_apply_steps", "not 0 <= t <= 4294967295", "not 0 <= t"),
        ("commit", "now <= len(seq.tokens) + len(accepted_tokens)", "now <= len(seq.tokens)"),
        ("commit", "and now <= len(seq.tokens)", "and now < len(seq.tokens)"),
    ],
)
def test_a_changed_copy_is_told_apart(copy: str, old: str, new: str) -> None:
    """The comparison sees a conjunct changed in one copy (the check can fail)."""
    sources = {name: inspect.getsource(getattr(FusedSteps, name)) for name in COPIES}
    assert sources[copy].count(old) == 1, old
    sources[copy] = sources[copy].replace(old, new)
    copies = {name: read_predicate(src) for name, src in sources.items()}
    against = "_apply_steps" if copy == "advance" else "advance"
    step, other = (
        (copies[against], copies[copy]) if copy != "advance" else (copies[copy], copies[against])
    )
    assert _differences(step, other, commit=copy == "commit") != []


def test_the_fused_steps_come_before_the_core() -> None:
    """``advance``, the batch calls and ``commit`` resolve to the fused layer; ``commit``'s
    fast path falls back to the core's checked commit, next in the method order."""
    mro = PrefixCacheManager.__mro__
    assert mro[1] is FusedSteps
    for name in ("advance", "advance_batch", "advance_columns", "commit"):
        assert getattr(PrefixCacheManager, name) is getattr(FusedSteps, name), name
    assert "commit" in vars(mro[2]) and "advance" not in vars(mro[2])


def test_the_fast_paths_switch_is_an_instance_attribute() -> None:
    """Every fast-path gate reads ``self._fused_inline``, set per manager: on for the
    manager, off for the hybrid one (whose commit, rollback and append do more)."""
    assert "_fused_inline" not in vars(PrefixCacheManager)
    assert "_fused_inline" not in vars(HybridPrefixCacheManager)
    assert PrefixCacheManager(8, 2)._fused_inline is True
    hybrid = HybridPrefixCacheManager(8, 2, max_num_seqs=1, state_budget=1)
    assert hybrid._fused_inline is False
