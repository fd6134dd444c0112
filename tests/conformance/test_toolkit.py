"""The adapter toolkit: argument checks raise the kit's error classes, snapshots of
hash-chained caches are exact, dry runs leave the original untouched, deep copies are
checked field by field; and the lockstep oracle works without Hypothesis."""

from __future__ import annotations

import copy
import re
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from prefixkv.spec import (
    DuplicateSequence,
    InvalidRequest,
    Namespace,
    OutOfBlocks,
    Request,
    SeqView,
    UnknownSequence,
    invariants,
)

from examples.engine_style import EngineStyleManager
from prefixkv.conformance import Capabilities, Lockstep
from prefixkv.conformance import toolkit as tk
from prefixkv.conformance.failures import CheckFailed

_ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: tk.check_count(0, "n"), InvalidRequest),
        (lambda: tk.check_count(True, "n", 0), InvalidRequest),
        (lambda: tk.check_count(1.5, "n"), InvalidRequest),
        (lambda: tk.check_seq_id(1.5), InvalidRequest),
        (lambda: tk.check_request("not a request"), InvalidRequest),
        (lambda: tk.check_tokens("abc"), InvalidRequest),
        (lambda: tk.check_tokens([1, -2]), InvalidRequest),
        (lambda: tk.check_flag(1), InvalidRequest),
        (lambda: tk.live({}, "x"), UnknownSequence),
        (lambda: tk.live({}, None), InvalidRequest),
        (lambda: tk.check_free_batch(7, {7: 0}), InvalidRequest),
        (lambda: tk.check_free_batch("ab", {"ab": 0}), InvalidRequest),
        (lambda: tk.check_free_batch([7, 7], {7: 0}), DuplicateSequence),
        (lambda: tk.check_free_batch([7, 8], {7: 0}), UnknownSequence),
    ],
)
def test_argument_checks_raise_the_kits_errors(call: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        call()


def test_argument_checks_pass_good_values_through() -> None:
    assert tk.check_count(0, "n", 0) == 0 and tk.check_seq_id("a") == "a"
    assert tk.check_tokens((1, 2)) == [1, 2] and tk.check_flag(False) is False
    assert tk.check_free_batch([1, "a"], {1: 0, "a": 1}) == [1, "a"]


def test_snapshot_of_a_hash_chained_cache_with_cached_blocks_in_the_free_queue() -> None:
    ns = Namespace("m").key()
    blocks = [
        tk.Block(0, 1, block_hash=10, parent_hash=None, token_ids=(1, 2), namespace=ns),
        tk.Block(1, 0, block_hash=11, parent_hash=10, token_ids=(3, 4), namespace=ns),
        tk.Block(2, 0, block_hash=12, parent_hash=99, token_ids=(5, 6), namespace=ns),
        tk.Block(3, 0),
    ]
    seq = SeqView("s", ns, (1, 2, 9), (0,), 2, 2, 3, 0)
    snap = tk.build_snapshot(blocks, [seq], deque([1, 2, 3]), tk.Counters(queries=3), block_size=2)
    assert snap.free_queue == (3,)  # the cached blocks 1 and 2 count as evictable
    views = snap.blocks
    assert (views[1].parent, views[1].depth) == (0, 2)
    assert views[2].parent == -1  # parent evicted: no match can pass through it
    st = snap.stats
    assert (st.num_free_blocks, st.num_cached_blocks, st.num_used_blocks) == (1, 2, 1)
    found = {v.invariant for v in invariants.violations(snap)}
    assert found <= {"INV-ANCESTOR"}, found  # only the any-order eviction difference


class _Flaky:
    """An engine whose allocate is not transactional: it takes blocks, then fails."""

    def __init__(self) -> None:
        self.free = [0, 1, 2]
        self.taken: list[int] = []

    def allocate(self, n: int) -> list[int]:
        for _ in range(n):
            if not self.free:
                raise OutOfBlocks("ran out half way")
            self.taken.append(self.free.pop())
        return self.taken[-n:]


def test_dry_run_leaves_the_original_untouched_on_failure() -> None:
    engine = _Flaky()
    with pytest.raises(OutOfBlocks):
        tk.dry_run(engine, lambda e: e.allocate(5))
    assert engine.free == [0, 1, 2] and engine.taken == []
    assert tk.dry_run(engine, lambda e: e.allocate(2)) == [2, 1]
    assert engine.free == [0]


class _SharesOnCopy:
    def __init__(self) -> None:
        self.table: dict[int, list[int]] = {1: [1, 2]}

    def __deepcopy__(self, memo: dict[int, Any]) -> _SharesOnCopy:
        twin = _SharesOnCopy.__new__(_SharesOnCopy)
        twin.table = self.table  # a shallow copy: the dry run would mutate the original
        return twin


def test_check_deepcopy_finds_shared_and_lost_fields() -> None:
    manager = EngineStyleManager(6, 2)
    req = Request("a", (1, 2, 3, 4, 5), Namespace("m"))
    manager.admit(req)
    manager.commit("a", 5, (1,))
    assert tk.check_deepcopy(manager) == []
    assert any("shared with the copy" in p for p in tk.check_deepcopy(_SharesOnCopy()))

    class _LosesField(_SharesOnCopy):
        def __deepcopy__(self, memo: dict[int, Any]) -> _LosesField:
            return _LosesField.__new__(_LosesField)

    assert any("lost in the copy" in p for p in tk.check_deepcopy(_LosesField()))


def test_the_lockstep_oracle_runs_without_hypothesis() -> None:
    """A scripted run: a cancelled writer's block left findable under publish=schedule."""
    from policy_variants import SchedulePublishKeepsCancelled

    caps = Capabilities(publish="schedule", exact=False)
    oracle = Lockstep(None, SchedulePublishKeepsCancelled(4, 1), caps=caps)
    oracle.start()
    req = Request(0, (7, 7), Namespace("m"))
    oracle.op("admit", lambda c: c.admit(req))
    oracle.op("free", lambda c: c.free([0]))
    out = oracle.op("match", lambda c: c.match(req), pure=True)
    with pytest.raises(CheckFailed) as info:
        oracle.check_match(req, out.value, "match")
    assert info.value.check == "INV-PUBLISH"
    assert "freed before committing it" in str(info.value)
    assert oracle.log[-1].startswith("cache.match(")
    # the same calls against the correct manager pass every check
    from policy_variants import SchedulePublish

    ok = Lockstep(None, SchedulePublish(4, 1), caps=caps)
    ok.start()
    ok.op("admit", lambda c: c.admit(req))
    ok.op("free", lambda c: c.free([0]))
    ok.check_match(req, ok.op("match", lambda c: c.match(req), pure=True).value, "match")


def test_the_readme_adapter_is_at_most_60_lines() -> None:
    """The README's adapter is the translation only: count its non-blank lines."""
    text = (_ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"^class PlainAdapter.*?(?=^PlainAdapter\.capabilities)", text, re.M | re.S)
    assert block is not None
    lines = [line for line in block.group(0).splitlines() if line.strip()]
    assert len(lines) <= 60, len(lines)


def test_deepcopy_of_a_populated_manager_is_faithful_enough_for_dry_runs() -> None:
    manager = EngineStyleManager(6, 2)
    manager.admit(Request("a", (1, 2, 3), Namespace("m")))
    twin = copy.deepcopy(manager)
    twin.free(["a"])
    assert manager.seq_ids() == ("a",) and twin.seq_ids() == ()
