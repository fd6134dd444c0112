"""Failures keyed by root cause: a failure class (fingerprint) is the check, the operation
and the message's shape; every distinct class is kept, ``ignore`` takes a class as well as
a check, and a failure whose run went past an earlier class is reported under it."""

from __future__ import annotations

import pytest
from kit_runs import FIND_ONLY, STEPS
from last_wins_engine import PublishesAhead, WrongParentHash, make
from prefixkv.spec import Namespace, Request

from prefixkv.conformance import ConformanceFailure, Lockstep, run_conformance
from prefixkv.conformance.failures import CheckFailed, fingerprint, message_shape
from prefixkv.conformance.report import ConformanceReport, FailedCheck
from prefixkv.conformance.runner import _by_root_cause

_NS = Namespace("m")


def test_a_failure_class_ignores_numbers_and_ids_but_not_the_operation() -> None:
    a = "after commit, candidate: INV-PUBLISH: block 3 (#1 of 'r2') has the wrong parent 2"
    b = "after commit, candidate: INV-PUBLISH: block 7 (#4 of 0) has the wrong parent 11"
    assert message_shape(a) == message_shape(b)
    assert fingerprint("INV-PUBLISH", "commit", a) == fingerprint("INV-PUBLISH", "commit", b)
    assert fingerprint("INV-PUBLISH", "commit", a) != fingerprint("INV-PUBLISH", "admit", a)
    other = "after commit, candidate: INV-PUBLISH: block 3 (#1 of 0) is published but only 2"
    assert fingerprint("INV-PUBLISH", "commit", a) != fingerprint("INV-PUBLISH", "commit", other)
    assert message_shape("blocks [3, 4, 5] of (1, 2)") == "blocks [N...] of (N...)"
    # one clause per block: one class, however many blocks the run happened to hit
    one = "admission (step 3) hits block 0 (#0), whose KV was never written"
    three = "; ".join(f"admission (step 3) hits block {b} (#{b}), whose KV was never written"
                      for b in range(3))  # fmt: skip
    assert message_shape(one) == message_shape(three) != message_shape(f"{one}; other {one}")
    # the machines draw ids of every kind: one bug, one class, whatever the id's kind
    for kind in ("SubclassedIntId(3)", "EnumId(5)", "SubclassedStrId(7)"):
        c = f"after commit, candidate: INV-PUBLISH: block 3 (#1 of {kind}) has the wrong parent 2"
        assert message_shape(c) == message_shape(b), c


class _TwoPublishBugs(PublishesAhead, WrongParentHash):
    """Two root causes that fail the same check: a wrong parent, and a block published
    before its KV is written."""


def _oracle(ignore: tuple[str, ...] = ()) -> Lockstep:
    factory = make(_TwoPublishBugs)
    oracle = Lockstep(
        None, factory(6, 1, record_events=False), caps=factory.capabilities, ignore=ignore
    )
    oracle.start()
    oracle.op("admit", lambda c: c.admit(Request(0, (5, 6, 7, 8), _NS)))
    return oracle


def test_ignoring_one_class_of_a_check_still_reports_the_others() -> None:
    with pytest.raises(CheckFailed) as first:
        _oracle().op("commit", lambda c: c.commit(0, 2, ()))
    assert first.value.check == "INV-PUBLISH" and first.value.operation == "commit"
    oracle = _oracle(ignore=(first.value.fingerprint,))
    with pytest.raises(CheckFailed) as second:
        oracle.op("commit", lambda c: c.commit(0, 2, ()))
    assert second.value.check == "INV-PUBLISH"
    assert second.value.fingerprint != first.value.fingerprint
    # the class looked past is carried by the next failure: its likely root cause
    assert second.value.after == (first.value.fingerprint,)
    # ignoring the whole check hides both (and shows what follows from them)
    with pytest.raises(CheckFailed) as third:
        _oracle(ignore=("INV-PUBLISH",)).op("commit", lambda c: c.commit(0, 2, ()))
    assert third.value.check == "INV-WRITE" and len(third.value.after) == 2


def test_a_run_keeps_every_class_of_one_check() -> None:
    """Both bugs fail INV-PUBLISH after a commit; the report holds both classes, each a root
    cause of its own (before, the first hid the second: the report kept one slot per
    check)."""
    with pytest.raises(CheckFailed) as unwritten:
        _oracle().op("commit", lambda c: c.commit(0, 2, ()))
    assert "is published but only 2 tokens are computed" in unwritten.value.detail.split("\n")[0]
    with pytest.raises(CheckFailed) as wrong_parent:
        _oracle(ignore=(unwritten.value.fingerprint,)).op("commit", lambda c: c.commit(0, 2, ()))
    assert "has the wrong parent" in wrong_parent.value.detail.split("\n")[0]
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(
            make(_TwoPublishBugs), max_examples=200, steps=STEPS, profile=FIND_ONLY, max_failures=4
        )
    report = info.value.report
    expected = {wrong_parent.value.fingerprint, unwritten.value.fingerprint}
    assert expected <= set(report.fingerprints), report.summary()


def test_ignore_takes_a_failure_class() -> None:
    def run(ignore: str = "") -> ConformanceReport | ConformanceFailure:
        try:
            return run_conformance(
                make(WrongParentHash), max_examples=100, steps=STEPS, profile=FIND_ONLY,
                max_failures=1, ignore=ignore,
            )  # fmt: skip
        except ConformanceFailure as exc:
            return exc

    first = run()
    assert isinstance(first, ConformanceFailure)
    fp = first.report.failures[0].fingerprint
    again = run(fp)
    assert isinstance(again, ConformanceReport) or fp not in again.report.fingerprints
    assert fp in first.report.summary()


def _failure(check: str, fp: str) -> FailedCheck:
    return FailedCheck(check, f"{check} failed", ("a", "b"), 1, 0.0, 0.0, 0.0, fingerprint=fp)


def test_every_class_is_a_root_cause_with_the_possibly_related_ones_under_it() -> None:
    found = [_failure("INV-PUBLISH", "P#1"), _failure("INV-REF", "R#1"), _failure("CANCEL", "C#1")]
    # CANCEL's run went past INV-PUBLISH's class: possibly the same bug, still its own entry
    roots = _by_root_cause(found, {2: 0})
    assert [r.check for r in roots] == ["INV-PUBLISH", "INV-REF", "CANCEL"]
    assert [r.related for r in roots] == [("C#1",), (), ()]
    report = ConformanceReport("t", "caps", 1, 1, 0.0, roots, max_failures=8)
    assert "3 root cause(s) failed" in report.summary()
    assert "P#1 (possibly related: C#1)" in report.summary()
    assert report.fingerprints == ["P#1", "R#1", "C#1"]  # each reported once
    data = report.to_json()
    assert data["format"] == 3 and data["failures"][0]["related"] == ["C#1"]
    assert [f["fingerprint"] for f in data["failures"]] == ["P#1", "R#1", "C#1"]
    assert "possibly related (reported on their own): C#1" in roots[0].format()
