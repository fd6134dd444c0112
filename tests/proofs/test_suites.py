"""One skeleton per proof model, and ``run`` as a loop over the models' suites."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

pytest.importorskip("z3")

from prefixkv.proofs import run as proofs_run
from prefixkv.proofs.suite import BrokenRow, Part, ProofSuite, ProveOptions, Selection

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("kv", "ckpt", "spans", "joint")
SKELETON = ("model", "formulas", "transitions", "obligations", "broken", "drift", "seeded", "suite")


@pytest.mark.parametrize("model", MODELS)
def test_every_model_has_the_same_parts(model: str) -> None:
    folder = ROOT / "proofs" / model
    assert folder.is_dir(), model
    for part in SKELETON:
        assert (folder / f"{part}.py").is_file(), f"proofs/{model}/{part}.py is missing"
        importlib.import_module(f"prefixkv.proofs.{model}.{part}")
    suite = importlib.import_module(f"prefixkv.proofs.{model}.suite").SUITE
    assert suite in proofs_run.SUITES
    assert suite.seeded, f"{model}: a drift check without seeded drifts cannot be shown to fail"


def test_the_registry_names_each_model_once() -> None:
    names = [s.name for s in proofs_run.SUITES]
    assert len(set(names)) == len(names)
    picks = [i for s in proofs_run.SUITES for i in s.invariants]
    assert len(set(picks)) == len(picks), "two suites answer to one --invariants id"
    assert set(proofs_run.PROVED) <= set(picks)


def _fake(name: str, calls: list[str], ok: bool = True) -> ProofSuite:
    def obligations(sel: Selection) -> Part:
        calls.append(f"{name}.obligations:{','.join(sel.operations_of(('op1', 'op2')))}")
        sel.show(name, "op1", "proved", 0.0, "fake")
        return Part(ok, {name: ["row"]}, [f"{name} summary"])

    def broken(sel: Selection) -> list[BrokenRow]:
        calls.append(f"{name}.broken")
        return [{"name": f"{name}-bug", "invariant": name, "kind": "k", "caught": ok}]

    def drift(sel: Selection) -> Part:
        calls.append(f"{name}.drift")
        return Part(True, {f"{name}_drift": 1}, [f"{name} drift"])

    return ProofSuite(name, (name,), ("op1", "op2"), obligations, broken, drift)


def test_run_is_a_loop_over_the_suites() -> None:
    calls: list[str] = []
    lines: list[str] = []
    suites = [_fake("A", calls), _fake("B", calls)]
    opts = ProveOptions(operations="op2", broken=True, drift=1)
    report = proofs_run.run(opts, lines.append, suites=suites)
    assert report.ok
    assert calls == [
        "A.obligations:op2",
        "B.obligations:op2",
        "A.broken",
        "B.broken",
        "A.drift",
        "B.drift",
    ]
    assert report.doc["A"] == ["row"] and report.doc["B_drift"] == 1
    assert [b["name"] for b in report.doc["broken"]] == ["A-bug", "B-bug"]
    # the rows stream first, then each suite's summary, the broken table, the drift lines
    assert [ln.split()[0] for ln in lines[2:6]] == ["A", "B", "A", "B"]
    assert lines[-2:] == ["A drift", "B drift"]


def test_one_failing_suite_fails_the_run() -> None:
    calls: list[str] = []
    report = proofs_run.run(ProveOptions(), suites=[_fake("A", calls), _fake("B", calls, False)])
    assert not report.ok and report.doc["ok"] is False
    assert calls == ["A.obligations:op1,op2", "B.obligations:op1,op2"]  # no --broken/--drift
    with pytest.raises(proofs_run.InvalidSelection, match="choose from A, B"):
        proofs_run.run(ProveOptions(invariants="C"), suites=[_fake("A", []), _fake("B", [])])
