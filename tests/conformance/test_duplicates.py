"""Safety under duplicates: with several published copies of one identity, a block's
parent may be any copy of its writer's parent (INV-PUBLISH at compute and at schedule time,
INV-MATCH and ``toolkit.build_snapshot`` agree on it), and a parent of another identity is
still caught under every duplicates mode."""

from __future__ import annotations

from typing import Any

import pytest
from kit_runs import first_failure
from last_wins_engine import WrongParentHash, make
from prefixkv.spec import CacheState, InvariantViolation, Match, Namespace, Request, SeqView
from prefixkv.spec import invariants as inv

from examples.minimal_engine_adapter import make_manager
from prefixkv.conformance import Capabilities, Lockstep, run_conformance
from prefixkv.conformance import toolkit as tk
from prefixkv.conformance.capabilities import Duplicates
from prefixkv.conformance.failures import CheckFailed
from prefixkv.conformance.safety import safety_violations

_NS = Namespace("m")
_MODES = ("private", "shared", "last-wins")
_PUBLISH = ("compute", "schedule")


def _oracle(factory: Any) -> Lockstep:
    oracle = Lockstep(None, factory(4, 1, record_events=False), caps=factory.capabilities)
    oracle.start()
    return oracle


def test_two_identical_prompts_computed_concurrently_pass_under_last_wins() -> None:
    """The replay of a false alarm, on the minimal example engine (no parents, a last-wins
    index, an adapter on build_snapshot): the older copy's child is rendered under the newer
    copy of its parent (the one the index keeps), which is a correct parent."""
    oracle = _oracle(make_manager)
    oracle.op("admit", lambda c: c.admit(Request(0, (7, 7), _NS)))
    oracle.op("admit", lambda c: c.admit(Request(1, (7, 7), _NS)))
    oracle.op("commit", lambda c: c.commit(0, 2, (1,)))
    oracle.op("commit", lambda c: c.commit(1, 2, (1,)))
    older = oracle.state.blocks[1]
    assert older.published and older.parent == 2  # block 0's newer copy, the indexed one
    req = Request(2, (7, 7, 1), _NS)
    out = oracle.op("match", lambda c: c.match(req), pure=True)
    assert out.value.block_ids == (2, 3)
    oracle.check_match(req, out.value, "match")


@pytest.mark.parametrize("duplicates", _MODES)
def test_a_parent_chained_to_another_block_is_caught_in_every_mode(duplicates: Duplicates) -> None:
    """A block hashed under the wrong parent (the sequence's first block, of another
    identity) is INV-PUBLISH whatever the duplicates mode."""
    oracle = _oracle(make(WrongParentHash, duplicates))
    oracle.op("admit", lambda c: c.admit(Request(0, (5, 6, 7, 8), _NS)))
    with pytest.raises(CheckFailed) as info:
        oracle.op("commit", lambda c: c.commit(0, 3, ()))
    assert info.value.check == "INV-PUBLISH", str(info.value)
    assert "has the wrong parent 0" in str(info.value)


def _state(parent_of_child: int, child_tokens: tuple[int, ...] = (7,)) -> CacheState:
    """Blocks 0 and 1 are published roots holding (7,) and (8,); sequence "s" holds blocks
    0 and 2, and block 2 names ``parent_of_child`` as its parent."""
    ns = _NS.key()
    roots = {0: 10, 1: 11}
    tokens = {0: (7,), 1: (8,)}
    blocks = [tk.Block(b, 1 if b == 0 else 0, h, None, tokens[b], ns) for b, h in roots.items()]
    parent_hash = roots[parent_of_child]
    blocks.append(tk.Block(2, 1, 12, parent_hash, child_tokens, ns))
    blocks.append(tk.Block(3, 0))
    seq = SeqView("s", ns, (7, *child_tokens, 9), (0, 2), 2, 2, 3, 0)
    index = [(10, 0), (11, 1), (12, 2)]
    return tk.build_snapshot(blocks, [seq], [3], tk.Counters(), block_size=1, index=index)


def _publish_problems(state: CacheState, duplicates: str, publish: str) -> list[str]:
    caps = Capabilities(duplicates=duplicates, publish=publish, exact=False)  # type: ignore[arg-type]
    return [v.message for v in safety_violations(state, caps) if v.invariant == "INV-PUBLISH"]


@pytest.mark.parametrize("publish", _PUBLISH)
@pytest.mark.parametrize("duplicates", _MODES)
def test_a_parent_of_another_identity_is_wrong_in_every_mode(duplicates: str, publish: str) -> None:
    """Block 2's parent is block 1, a published root holding (8,) where the sequence's
    block 0 holds (7,): INV-PUBLISH at compute and at schedule time, whatever the mode."""
    state = _state(parent_of_child=1)
    assert state.blocks[2].parent == 1
    problems = _publish_problems(state, duplicates, publish)
    assert any("has the wrong parent 1" in p for p in problems), problems


@pytest.mark.parametrize("publish", _PUBLISH)
@pytest.mark.parametrize("duplicates", _MODES)
def test_a_copy_of_the_parent_is_right_only_with_duplicates(duplicates: str, publish: str) -> None:
    """Block 2's parent is block 1, a copy of the sequence's block 0 (the same identity):
    right when duplicates are published, wrong when they must stay private."""
    problems = _publish_problems(_copy_parent_state(), duplicates, publish)
    wrong = [p for p in problems if "wrong parent" in p]
    assert bool(wrong) == (duplicates == "private"), problems


def _copy_parent_state() -> CacheState:
    ns = _NS.key()
    blocks = [
        tk.Block(0, 1, 10, None, (7,), ns),
        tk.Block(1, 0, 10, None, (7,), ns),  # a copy of block 0, under the same hash
        tk.Block(2, 1, 12, 10, (8,), ns),
        tk.Block(3, 0),
    ]
    seq = SeqView("s", ns, (7, 8, 9), (0, 2), 2, 2, 3, 0)
    # the index lists block 1 first for the hash 10: block 2 is rendered under block 1
    index = [(10, 1), (10, 0), (12, 2)]
    return tk.build_snapshot(blocks, [seq], [3], tk.Counters(), block_size=1, index=index)


@pytest.mark.parametrize("by_identity", [False, True])
def test_match_through_a_copy_of_the_parent(by_identity: bool) -> None:
    """INV-MATCH agrees with INV-PUBLISH: a match of blocks 0 then 2, whose stored parent
    is block 1 (a copy of block 0), passes when parents are compared by identity; a match
    of blocks 1 then 2 passes either way."""
    state = _copy_parent_state()
    assert state.blocks[2].parent == 1
    req = Request("r", (7, 8, 9), _NS)
    inv.check_match(state, req, Match(3, 2, (1, 2)), parents_by_identity=by_identity)
    if by_identity:
        inv.check_match(state, req, Match(3, 2, (0, 2)), parents_by_identity=True)
    else:
        with pytest.raises(InvariantViolation):
            inv.check_match(state, req, Match(3, 2, (0, 2)))


def test_match_under_a_parent_of_another_identity_fails_with_identities() -> None:
    state = _state(parent_of_child=1, child_tokens=(7,))
    req = Request("r", (7, 7, 9), _NS)
    with pytest.raises(InvariantViolation, match="another identity"):
        inv.check_match(state, req, Match(3, 2, (0, 2)), parents_by_identity=True)


def test_identity_classes_follow_the_whole_chain() -> None:
    """Copies share a class only if their parents do, up to the first block; a block under
    a lost parent (-1) is like no other."""
    state = _copy_parent_state()
    classes = inv.identity_classes(state)
    assert classes[0] == classes[1] != classes[2]
    orphan = tk.build_snapshot(
        [tk.Block(0, 0, 10, 99, (7,), _NS.key()), tk.Block(1, 0, 11, 98, (7,), _NS.key())],
        [],
        [],
        tk.Counters(),
        block_size=1,
    )
    assert orphan.blocks[0].parent == -1
    found = inv.identity_classes(orphan)
    assert found[0] != found[1]
    other = inv.identity_classes(_state(parent_of_child=1))
    assert other[0] != other[1]  # (7,) and (8,)


def test_the_last_wins_engine_passes_the_kit() -> None:
    """The whole workload, with the adapter on build_snapshot and the engine's own parent
    hashes: no false alarm (before the parents were compared by identity, this run failed
    INV-PUBLISH), so the wrong-parent bug below fails for its bug alone."""
    report = run_conformance(make(), max_examples=60, steps=30, profile="ci")
    assert report.passed and report.rules > 100, report.summary()


def test_the_wrong_parent_bug_fails_the_kit_under_last_wins() -> None:
    assert first_failure(make(WrongParentHash)).check == "INV-PUBLISH"
