"""``prefixkv prove`` (:mod:`prefixkv.commands.prove` over :mod:`prefixkv.proofs.run`): the
JSON rows of each model, the exit status, and bad usage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("z3")

from prefixkv.proofs import ckpt as ck
from prefixkv.proofs import joint as jt
from prefixkv.proofs import run as proofs_run
from prefixkv.proofs import spans
from prefixkv.proofs.kv import broken
from prefixkv.proofs.kv import suite as kv_suite
from prefixkv.spec.invariant_ids import InvariantId

from prefixkv import cli

ProveJson = Callable[..., dict[str, Any]]


def test_json_subset(prove_json: ProveJson) -> None:
    doc = prove_json(
        "--invariants", "INV-REF,INV-INDEX", "--operations", "evict,free", "--no-kernels"
    )
    assert doc["ok"] is True
    assert [(o["invariant"], o["operation"]) for o in doc["obligations"]] == [
        ("INV-REF", "evict"),
        ("INV-INDEX", "evict"),
        ("INV-REF", "free"),
        ("INV-INDEX", "free"),
    ]
    assert all(o["status"] == "proved" and o["non_vacuous"] for o in doc["obligations"])
    assert "at most 3 live sequences" in doc["bounds"]


def test_json_lists_txn_and_lookup_rows(prove_json: ProveJson) -> None:
    rows = prove_json(
        "--invariants", "INV-MATCH,INV-TXN", "--operations", "free,reset_full", "--no-kernels"
    )["obligations"]
    assert [(o["invariant"], o["operation"], o["kind"]) for o in rows] == [
        ("INV-MATCH", "free", "lookup"),
        ("INV-TXN", "free", "txn"),
        ("INV-MATCH", "reset_full", "lookup"),
        ("INV-TXN", "reset_full", "txn"),
    ]
    assert rows[3]["steps"] == ["CacheBusy"]
    assert all(o["status"] == "proved" and o["non_vacuous"] for o in rows)


def test_checkpoint_obligations_alone(prove_json: ProveJson) -> None:
    doc = prove_json(
        "--invariants",
        "INV-CKPT",
        "--operations",
        "free,restore_issued",
        "--no-kernels",
        "--broken",
        timeout=300,
    )
    assert doc["ok"] is True and doc["obligations"] == []
    rows = doc["checkpoints"]["obligations"]
    assert {r["operation"] for r in rows} == {"free", "restore_issued"}
    assert all(r["status"] == "proved" and r["non_vacuous"] for r in rows)
    assert "3 state slots" in doc["checkpoints"]["bounds"]
    ckpt_broken = [b for b in doc["broken"] if b["invariant"].startswith(f"{InvariantId.CKPT}:")]
    assert len(ckpt_broken) == len(ck.CKPT_VARIANTS) and all(b["caught"] for b in ckpt_broken)


def test_json_has_span_and_joint_rows(prove_json: ProveJson) -> None:
    doc = prove_json("--invariants", "SPANS,JOINT", "--no-kernels", "--broken")
    assert doc["ok"] is True and doc["obligations"] == []
    for key, n_variants in (("spans", len(spans.SPAN_VARIANTS)), ("joint", len(jt.JOINT_VARIANTS))):
        rows = doc[key]["obligations"]
        assert rows and all(r["status"] == "proved" for r in rows)
        assert all(r["non_vacuous"] for r in rows if r["operation"] != "init")
        group = key.upper()
        caught = [b for b in doc["broken"] if b["invariant"].startswith(f"{group}:")]
        assert len(caught) == n_variants and all(b["caught"] for b in caught)
    assert {r["invariant"] for r in doc["joint"]["obligations"]} >= {"RESTORE-SAFE", "EXPERTS"}
    assert {r["invariant"] for r in doc["spans"]["obligations"]} >= {
        "SPAN-LIMIT",
        "SPAN-MATCH",
        "SPLIT-REFUSED",
    }


def test_exits_non_zero_when_an_obligation_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(kv_suite, "Encoding", broken.EvictKeepsIndexEntry)
    code = cli.main(
        [
            "prove",
            "--invariants",
            "INV-INDEX",
            "--operations",
            "evict",
            "--no-kernels",
            "--no-witnesses",
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "counterexample" in out and "FAILED" in out


def test_bad_selections_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["prove", "--invariants", "INV-NOPE"]) == cli.EXIT_USAGE
    assert "unknown invariant: INV-NOPE" in capsys.readouterr().err
    assert cli.main(["prove", "--seqs", "1"]) == cli.EXIT_USAGE
    with pytest.raises(proofs_run.InvalidSelection, match="unknown operation"):
        proofs_run.run(proofs_run.ProveOptions(operations="nope"))
    assert issubclass(proofs_run.InvalidSelection, ValueError)
