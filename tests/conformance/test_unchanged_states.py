"""The oracle re-checks no state twice, and cross-checks that shortcut in full.

An operation that leaves the candidate's state (and the ledger) as the last state every
invariant held on is not re-checked; every ``FULL_CHECK_EVERY``-th one is, and so is the
end of a run. A snapshot that shares a mutable part with its cache defeats the shortcut (the
old state changes with the new one), so the full checks must still catch the bug behind it.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from prefixkv.spec import CacheState, Namespace, Request, SpecCache

from prefixkv.conformance import Capabilities, Lockstep, lockstep
from prefixkv.conformance.compare import normal_events, same_state
from prefixkv.conformance.failures import CheckFailed

NS = Namespace("m")


class AliasingCache:
    """A SpecCache whose snapshots all share one list, the first sequence's block table,
    and whose ``match`` appends a free block to it: a read that corrupts a block table
    (INV-REF), which the previous snapshot shows too."""

    def __init__(self) -> None:
        self.inner = SpecCache(8, 2)
        self.table: list[int] = []
        self.extra: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def match(self, req: Request) -> Any:
        self.extra.append(7)
        return self.inner.match(req)

    def snapshot(self) -> CacheState:
        s: CacheState = self.inner.snapshot()
        if not s.sequences:
            return s
        first = s.sequences[0]
        self.table[:] = [*first.block_ids, *self.extra]
        # the list itself, on purpose: the snapshot aliases the adapter's own table
        aliased = attrs.evolve(first, block_ids=self.table)  # type: ignore[arg-type]
        return attrs.evolve(s, sequences=(aliased, *s.sequences[1:]))


def _admitted() -> Lockstep:
    oracle = Lockstep(None, AliasingCache(), caps=Capabilities(exact=False))
    oracle.start()
    oracle.op("admit", lambda c: c.admit(Request("a", (1, 2, 3), NS)))
    return oracle


def _match(oracle: Lockstep) -> None:
    oracle.op("match", lambda c: c.match(Request("b", (1, 2, 9), NS)), pure=True)


def test_an_unchanged_state_is_not_rechecked_but_every_nth_is() -> None:
    oracle = _admitted()
    with pytest.raises(CheckFailed) as info:
        for _ in range(64):
            _match(oracle)
    assert info.value.check == "INV-REF", str(info.value)
    assert oracle.checks_skipped == lockstep.FULL_CHECK_EVERY - 1 < 64


def test_the_end_of_a_run_is_checked_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lockstep, "FULL_CHECK_EVERY", 10**9)  # the periodic check off
    oracle = _admitted()
    for _ in range(20):
        _match(oracle)
    assert oracle.checks_skipped == 20  # the shortcut alone misses the corrupted table
    with pytest.raises(CheckFailed) as info:
        oracle.final_check()
    assert info.value.check == "INV-REF"


def test_a_changed_state_is_checked_at_once() -> None:
    oracle = Lockstep(None, SpecCache(8, 2), caps=Capabilities(exact=False))
    oracle.start()
    run = oracle.checks_run
    oracle.op("admit", lambda c: c.admit(Request("a", (1, 2, 3), NS)))
    oracle.op("match", lambda c: c.match(Request("b", (1, 2), NS)), pure=True)
    oracle.op("commit", lambda c: c.commit("a", 3, (5,)))
    assert oracle.checks_run == run + 2 and oracle.checks_skipped == 1


def test_events_of_another_kind_with_the_same_fields_are_another_state() -> None:
    from typing import NamedTuple

    from prefixkv.spec.events import BlockRemoved

    class Other(NamedTuple):
        block_hashes: tuple[int, ...]

    base = SpecCache(4, 2).snapshot()
    a = attrs.evolve(base, pending_events=(BlockRemoved((1,)),))
    b = attrs.evolve(base, pending_events=(Other((1,)),))  # type: ignore[arg-type]
    assert a == b  # as tuples
    assert not same_state(a, b) and same_state(a, attrs.evolve(a))
    assert normal_events(a.pending_events) == (("BlockRemoved", (1,)),)


def test_in_the_exact_mode_the_reference_is_not_rechecked_on_an_equal_state() -> None:
    oracle = Lockstep(SpecCache(8, 2), SpecCache(8, 2))
    oracle.start()
    run, skipped = oracle.checks_run, oracle.checks_skipped
    oracle.op("admit", lambda c: c.admit(Request("a", (1, 2, 3), NS)))
    # the candidate's state changed and is checked; the reference's equals it
    assert (oracle.checks_run, oracle.checks_skipped) == (run + 1, skipped + 1)


def test_a_reference_state_unlike_the_candidates_is_checked() -> None:
    ref = SpecCache(8, 2)
    oracle = Lockstep(ref, SpecCache(8, 2))
    oracle.start()
    run = oracle.checks_run
    with pytest.raises(CheckFailed):  # only the reference admits: the results differ
        oracle.op("admit", lambda c: c.admit(Request("a", (1, 2, 3), NS)) if c is ref else None)
    assert oracle.checks_run == run + 2  # the reference's too: its state is not the candidate's
