"""The minimal example engine (chained hashes, no parents, a last-wins index, free-list
eviction): its own API first, then the conformance kit on its adapter."""

from __future__ import annotations

import pytest
from kit_runs import every_root_cause, first_failure, passes
from prefixkv.spec import Namespace, Request

from examples.minimal_engine import BUGS, MinimalEngine, Sequence
from examples.minimal_engine_adapter import BUG_FACTORIES, CAPABILITIES, factory_for, make_manager
from prefixkv.conformance import Lockstep

BS = 2


def _run(e: MinimalEngine, seq_id: str, tokens: list[int]) -> Sequence:
    """Admit a whole prompt and compute it, sampling token 0."""
    s = Sequence(seq_id, tokens, b"m")
    e.allocate(s)
    e.postprocess(s, len(tokens) - s.num_computed_tokens, [0])
    return s


# -- the engine's own API ---------------------------------------------------------------------


def test_a_block_is_published_once_written_and_hit_on_its_tokens() -> None:
    e = MinimalEngine(8, BS)
    s = Sequence("a", [1, 2, 3, 4, 5], b"m")
    e.allocate(s)
    assert e.cached_prefix(Sequence("b", [1, 2, 3], b"m")) == []  # nothing written yet
    e.postprocess(s, 5, [0])
    assert e.cached_prefix(Sequence("b", [1, 2, 3, 4, 9], b"m")) == s.block_table[:2]
    assert e.cached_prefix(Sequence("b", [1, 2, 3, 4], b"m")) == s.block_table[:1]
    assert e.cached_prefix(Sequence("b", [1, 2, 3, 4, 9], b"x")) == []  # namespaces apart


def test_the_index_keeps_the_newest_copy_and_reuse_evicts() -> None:
    e = MinimalEngine(4, BS)
    a, b = Sequence("a", [7, 7, 7], b"m"), Sequence("b", [7, 7, 7], b"m")
    e.allocate(a)
    e.allocate(b)  # computed concurrently: two copies of [7, 7]
    e.postprocess(a, 3, [0])
    e.postprocess(b, 3, [0])
    assert e.hash_to_block_id == {e.blocks[b.block_table[0]].hash: b.block_table[0]}
    assert e.blocks[a.block_table[0]].hash != -1  # the older copy stays cached
    e.deallocate(a)
    e.deallocate(b)
    c = Sequence("c", [5, 5, 5, 5, 5, 5, 5], b"m")  # 4 blocks: every cached one is reused
    e.allocate(c)
    assert e.hash_to_block_id == {} and all(e.blocks[i].hash == -1 for i in c.block_table)


def test_decode_reserves_one_slot_a_step() -> None:
    e = MinimalEngine(3, BS)
    s = _run(e, "a", [1, 2, 3])
    assert (s.num_slots, len(s.block_table), e.can_append(s, 1)) == (3, 2, True)
    e.may_append(s)  # slot 4 fits the second block
    assert (s.num_slots, len(s.block_table)) == (4, 2)
    e.may_append(s)
    assert (s.num_slots, len(s.block_table), e.can_append(s, 2)) == (5, 3, False)


# -- the conformance kit ----------------------------------------------------------------------


def test_two_identical_prompts_computed_concurrently_pass() -> None:
    """The false alarm of a last-wins index without parents, at block size 1."""
    oracle = Lockstep(None, make_manager(4, 1, record_events=False), caps=CAPABILITIES)
    oracle.start()
    ns = Namespace("m")
    oracle.op("admit", lambda c: c.admit(Request(0, (7, 7), ns)))
    oracle.op("admit", lambda c: c.admit(Request(1, (7, 7), ns)))
    oracle.op("commit", lambda c: c.commit(0, 2, (1,)))
    oracle.op("commit", lambda c: c.commit(1, 2, (1,)))
    req = Request(2, (7, 7, 1), ns)
    out = oracle.op("match", lambda c: c.match(req), pure=True)
    assert len(out.value.block_ids) == 2
    oracle.check_match(req, out.value, "match")


def test_the_correct_engine_passes_the_kit() -> None:
    report = passes(make_manager, examples=60)
    assert not report.coverage.mostly_refused(), report.summary()


#: bug -> the check that catches it first. Hits counted as free promise more blocks than
#: the free list holds: CAN-ADMIT, before the engine's own deque runs dry halfway through
#: the admission.
EXPECTED = {
    "publish_at_allocate": {"INV-PUBLISH"},
    "stale_index_on_reuse": {"INV-INDEX", "INV-MATCH"},
    "hits_counted_free": {"CAN-ADMIT"},
    "decode_off_by_one": {"INV-LIMIT", "INV-SEQ"},
}


def test_every_bug_has_an_expected_check() -> None:
    assert set(EXPECTED) == set(BUGS) == set(BUG_FACTORIES)


@pytest.mark.parametrize("bug", sorted(EXPECTED))
def test_each_bug_is_caught(bug: str) -> None:
    failure = first_failure(BUG_FACTORIES[bug])
    assert failure.check in EXPECTED[bug], str(failure)


def test_every_bug_is_its_own_root_cause_in_one_report() -> None:
    """All four bugs in one engine: one report lists each as a root cause of its own (a
    bug that fires in nearly every run is in every other bug's run too; folding a failure
    into the one its run went past made them all one root cause)."""
    checks = [c for expected in EXPECTED.values() for c in expected]
    assert len(checks) == len(set(checks))  # a failed check names the bug behind it
    report = every_root_cause(BUGS, factory_for, max_failures=16)
    for bug, expected in EXPECTED.items():
        assert any(f.check in expected for f in report.failures), (bug, report.summary())
