"""The invariant ids are listed once (``prefixkv.spec.invariant_ids``), and every layer that
checks invariants covers that list: the runtime checker, the Z3 proofs and the kit.

An id a layer leaves out must be listed as left out, with a reason; an id outside the
registry cannot be written at all.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from prefixkv.spec import invariants as inv
from prefixkv.spec.invariant_ids import KIND, MEANING, NOT_PROVED, InvariantId, Kind
from prefixkv.spec.invariants import InvariantViolation, Violation

from prefixkv.errors import InvalidConfig

ROOT = Path(__file__).resolve().parents[2]
ALL = set(InvariantId)


def test_registry_lists_each_design_id_once_with_a_meaning() -> None:
    values = [m.value for m in InvariantId]
    assert len(values) == len(set(values)) == 13
    assert all(re.fullmatch(r"INV-[A-Z]+", v) for v in values)
    assert set(MEANING) == set(KIND) == ALL
    assert all(m.meaning and "\n" not in m.meaning for m in InvariantId)
    # a member is its id: reports, JSON and command-line options keep plain strings
    assert InvariantId.REF == "INV-REF" and f"{InvariantId.EVENTS}" == "INV-EVENTS"


def test_registry_matches_the_design_brief() -> None:
    # docs/invariants.md is the project's own statement of the invariants: same ids
    text = (ROOT / "docs" / "invariants.md").read_text(encoding="utf-8")
    assert set(re.findall(r"INV-[A-Z]+", text)) == {m.value for m in InvariantId}


def test_the_checker_covers_the_registry() -> None:
    groups = {
        Kind.STATE: inv.INVARIANTS,
        Kind.HYBRID_STATE: inv.HYBRID_INVARIANTS,
        Kind.TRANSITION: inv.TRANSITION_INVARIANTS,
        Kind.STREAM: inv.STREAM_INVARIANTS,
    }
    listed = [i for ids in groups.values() for i in ids]
    assert len(listed) == len(set(listed)), "an id sits in two groups"
    assert set(listed) == ALL
    for kind, ids in groups.items():
        for i in ids:
            # INV-MATCH has its own entry point and a snapshot part that check() evaluates
            assert KIND[i] == kind or (KIND[i] == Kind.MATCH and kind == Kind.STATE), i
    # what check() evaluates is exactly the snapshot groups, in their order
    assert tuple(inv._STATE_CHECKS) == (*inv.INVARIANTS, *inv.HYBRID_INVARIANTS)


def test_an_id_outside_the_registry_is_refused() -> None:
    assert Violation("INV-REF", "x").invariant is InvariantId.REF
    with pytest.raises(InvalidConfig, match="'INV-NOPE' is not an invariant id"):
        Violation("INV-NOPE", "x")
    assert issubclass(InvalidConfig, ValueError)
    err = InvariantViolation(Violation(InvariantId.TXN, "changed"))
    assert err.invariant == "INV-TXN"


def test_the_proofs_cover_the_registry() -> None:
    pytest.importorskip("z3")
    from prefixkv.proofs import run
    from prefixkv.proofs.kv import broken, obligations

    proved = {i for i in run.PROVED if i in ALL}
    assert proved | set(NOT_PROVED) == ALL
    assert not proved & set(NOT_PROVED), "an id is proved and listed as not proved"
    assert all(reason.strip() for reason in NOT_PROVED.values())
    # the other names the proofs use are their own strengthenings, never a stray INV-*
    others = {i for i in obligations.PROPERTY_IDS if i not in ALL}
    assert all(not str(i).startswith("INV-") for i in others), others
    for variant in broken.VARIANTS:
        assert variant.invariant in ALL or variant.invariant in obligations.STRENGTHENINGS, variant


def test_the_kit_covers_the_registry() -> None:
    pytest.importorskip("hypothesis")
    from prefixkv.conformance import events_check, lockstep, safety

    # every snapshot invariant has its place in the kit's root-cause order...
    order = safety.ROOT_CAUSE_ORDER
    assert len(order) == len(set(order))
    assert set(order) == {*inv.INVARIANTS, *inv.HYBRID_INVARIANTS}
    # ...and the lockstep checks the two that no snapshot shows (a refused call changed
    # nothing; the event stream mirrors the published blocks)
    named = _enum_members(Path(lockstep.__file__)) | _enum_members(Path(events_check.__file__))
    assert {*inv.TRANSITION_INVARIANTS, *inv.STREAM_INVARIANTS} <= named


def _enum_members(path: Path) -> set[InvariantId]:
    """The ``InvariantId.X`` members a module's code names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        InvariantId[node.attr]
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "InvariantId"
    }


def _package_sources() -> list[Path]:
    dirs = ["spec", "impl", "kernels", "proofs", "src/prefixkv"]
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py") if "__pycache__" not in p.parts)


def test_every_id_the_package_writes_is_registered() -> None:
    """A string constant that looks like an id (``"INV-REF"``, ``"SPEC:INV-REF"``) names a
    registry member; the registry module is the only one that spells them all out."""
    pattern = re.compile(r"(?:[A-Z]+:)?(INV-[A-Z_-]+)")
    bad = []
    for path in _package_sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                found = pattern.fullmatch(node.value)
                if found and found.group(1) not in {m.value for m in InvariantId}:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert bad == []


def test_the_listing_modules_use_members_not_strings() -> None:
    """The places that list the ids (checker, obligations, encoding, kit) name members."""
    listing = [
        "spec/invariants.py",
        "spec/checked.py",
        "proofs/kv/obligations.py",
        "proofs/kv/model.py",
        "proofs/run.py",
        "proofs/kv/broken.py",
        "src/prefixkv/conformance/safety.py",
        "src/prefixkv/conformance/lockstep.py",
        "src/prefixkv/conformance/events_check.py",
    ]
    for rel in listing:
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        literals = [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"INV-[A-Z]+", node.value)
        ]
        assert literals == [], f"{rel} spells out ids at lines {literals}"
