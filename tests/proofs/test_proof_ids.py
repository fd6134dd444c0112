"""The proofs name invariants by the registry's members (``prefixkv.spec.invariant_ids``),
never by string literals, and cover every id the registry marks as proved."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytest.importorskip("z3")

from prefixkv.proofs import ckpt, run
from prefixkv.proofs.kv import broken, obligations
from prefixkv.spec.invariant_ids import NOT_PROVED, InvariantId

PROOFS = Path(run.__file__).resolve().parent
_ID = re.compile(r"(?:[A-Z]+:)?INV-[A-Z]+:?")  # "INV-REF", "SPEC:INV-REF", "INV-CKPT:"


def test_no_invariant_id_is_spelled_out_in_the_proofs() -> None:
    literals = [
        f"{path.relative_to(PROOFS)}:{node.lineno}: {node.value}"
        for path in sorted(PROOFS.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _ID.fullmatch(node.value)
    ]
    assert literals == []


def test_the_proofs_cover_the_registrys_proved_ids() -> None:
    proved = {i for i in run.PROVED if isinstance(i, InvariantId)}
    assert proved == set(InvariantId) - set(NOT_PROVED)


def test_every_id_the_proofs_use_is_registered() -> None:
    used = [*obligations.PROPERTY_IDS, *(v.invariant for v in broken.VARIANTS)]
    ids = [i for i in used if str(i).startswith("INV-")]
    assert ids and all(isinstance(i, InvariantId) for i in ids), ids
    # the checkpoint model's clauses are INV-CKPT's, under their own names
    assert not any(str(p).startswith("INV-") for p in ckpt.CKPT_IDS)
