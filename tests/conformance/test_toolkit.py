"""The adapter toolkit: argument checks raise the kit's error classes, snapshots of
hash-chained caches are exact, dry runs leave the original untouched, deep copies are
checked field by field; and the lockstep oracle works without Hypothesis."""

from __future__ import annotations

import copy
import re
from collections import deque
from pathlib import Path
from typing import Any

import attrs
import pytest
from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import (
    CacheBusy,
    DuplicateSequence,
    InvalidOperation,
    InvalidRequest,
    Match,
    Namespace,
    OutOfBlocks,
    Request,
    SeqView,
    SpecCache,
    UnknownSequence,
    invariants,
)

from examples.engine_style import EngineStyleManager
from prefixkv.conformance import BlockManagerAdapter, Capabilities, Lockstep
from prefixkv.conformance import toolkit as tk
from prefixkv.conformance.failures import CheckFailed

_ROOT = Path(__file__).parents[2]
_REQ = Request("a", (1, 2, 3), Namespace("m"))


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
        (lambda: tk.check_new("not a request", {}), InvalidRequest),
        (lambda: tk.check_new(_REQ, {"a": 0}), DuplicateSequence),
        # the spec's order: a bad budget is reported before a duplicate sequence
        (lambda: tk.check_new(_REQ, {"a": 0}, 0), InvalidRequest),
        (lambda: tk.check_commit(-1, (), committed=0, allocated=4, known=4), InvalidRequest),
        (lambda: tk.check_commit(1, "x", committed=0, allocated=4, known=4), InvalidRequest),
        # past the slots, or past the known tokens plus the accepted ones
        (lambda: tk.check_commit(5, (), committed=0, allocated=4, known=9), InvalidOperation),
        (lambda: tk.check_commit(3, (7,), committed=2, allocated=9, known=3), InvalidOperation),
    ],
)
def test_argument_checks_raise_the_kits_errors(call: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        call()


def test_argument_checks_pass_good_values_through() -> None:
    assert tk.check_count(0, "n", 0) == 0 and tk.check_seq_id("a") == "a"
    assert tk.check_tokens((1, 2)) == [1, 2] and tk.check_flag(False) is False
    assert tk.check_free_batch([1, "a"], {1: 0, "a": 1}) == [1, "a"]
    assert tk.check_new(_REQ, {"b": 0}, 2) is _REQ
    # exactly up to the limit: the slots, and the known tokens plus the accepted ones
    assert tk.check_commit(2, (), committed=2, allocated=4, known=9) == (2, [])
    assert tk.check_commit(2, (7,), committed=2, allocated=9, known=3) == (2, [7])


def test_refusal_translates_the_engines_error_and_keeps_the_kits() -> None:
    with pytest.raises(InvalidOperation, match="'s': cannot"), tk.refusal(ValueError, what="'s'"):
        raise ValueError("cannot")
    # an argument check inside stays what it is; an error not listed is left alone
    with pytest.raises(InvalidRequest), tk.refusal(ValueError):
        tk.check_count(0, "n")
    with pytest.raises(KeyError), tk.refusal(ValueError):
        raise KeyError("x")


class _Tiny(tk.AdapterBase[list[int]]):
    """An adapter over a pool of ``room`` slots, logging the engine calls it makes."""

    def __init__(self, room: int) -> None:
        super().__init__(4, 2)
        self.room, self.calls = room, list[str]()
        self.reqs.update({"a": [], "b": []})

    def can_append(self, seq_id: Any, num_tokens: int) -> bool:
        tk.live(self.reqs, seq_id)
        return tk.check_count(num_tokens, "n") <= self.room

    def extend(self, seq_id: Any, num_tokens: int) -> list[int]:
        self.calls.append(f"extend {seq_id} {num_tokens}")
        return [0]

    def release(self, seq_id: Any) -> None:
        self.calls.append(f"release {seq_id}")
        del self.reqs[seq_id]

    def clear_cache(self) -> bool:
        self.calls.append("clear")
        return True


def test_adapter_base_checks_before_it_calls_the_engine() -> None:
    tiny = _Tiny(room=3)
    with pytest.raises(OutOfBlocks):
        tiny.append("a", 4)
    with pytest.raises(UnknownSequence):
        tiny.append("zz", 1)
    with pytest.raises(UnknownSequence):  # "a" is not released: the batch is checked first
        tiny.free(["a", "zz"])
    with pytest.raises(CacheBusy):
        tiny.reset(preserve_cache=False)
    with pytest.raises(InvalidRequest):
        tiny.reset(preserve_cache=1)  # type: ignore[arg-type]
    assert tiny.calls == [] and tiny.seq_ids() == ("a", "b")
    assert tiny.append("a", 3) == [0]
    tiny.reset(preserve_cache=True)  # frees every live sequence, keeps the cache
    assert tiny.calls == ["extend a 3", "release a", "release b"] and tiny.seq_ids() == ()
    tiny.reset(preserve_cache=False)
    assert tiny.calls[-1] == "clear"


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


def test_snapshot_names_the_parent_by_identity_under_a_colliding_hash() -> None:
    """Blocks 0 and 2 share the hash 5 with different identities: block 1's parent is the
    block with its parent's identity (2), not the first one indexed under the hash (0)."""
    ns = Namespace("m").key()
    a, b = ("a",), ("b",)
    blocks = [
        tk.Block(0, 0, 5, token_ids=(1, 1), namespace=ns, identity=a),
        tk.Block(1, 0, 6, token_ids=(3, 3), namespace=ns, identity=(b, 3), parent_identity=b),
        tk.Block(2, 0, 5, token_ids=(2, 2), namespace=ns, identity=b),
    ]
    snap = tk.build_snapshot(blocks, [], [], tk.Counters(), block_size=2)
    assert (snap.blocks[1].parent, snap.blocks[1].depth) == (2, 2)
    assert snap.index == ((5, 0), (5, 2), (6, 1))
    # by hash alone, the same cache names the first block indexed under 5
    by_hash = [attrs.evolve(x, identity=None, parent_identity=None) for x in blocks]
    by_hash[1] = attrs.evolve(by_hash[1], parent_hash=5)
    assert tk.build_snapshot(by_hash, [], [], tk.Counters(), block_size=2).blocks[1].parent == 0


def test_snapshot_takes_the_first_copy_in_the_order_the_index_is_given() -> None:
    """Two copies of one identity (blocks 3 and 1): the parent is the copy the engine's
    lookup returns, the first in the index as given, whatever the block ids."""
    ns = Namespace("m").key()
    blocks = [
        tk.Block(0, 0, 7, parent_hash=5, token_ids=(2, 2), namespace=ns),
        tk.Block(1, 0, 5, token_ids=(1, 1), namespace=ns),
        tk.Block(3, 0, 5, token_ids=(1, 1), namespace=ns),
        tk.Block(2, 0),
    ]
    for order, parent in (([(5, 3), (5, 1), (7, 0)], 3), ([(5, 1), (5, 3), (7, 0)], 1)):
        snap = tk.build_snapshot(blocks, [], [], tk.Counters(), block_size=2, index=order)
        assert snap.blocks[0].parent == parent, order
        assert snap.index == ((5, 1), (5, 3), (7, 0))  # held sorted


def test_snapshot_views_of_unchanged_blocks_are_reused_and_exact() -> None:
    """An unchanged block keeps its view object from one snapshot to the next (the oracle
    then compares the two by identity); a changed block, or one whose parent is gone, gets
    a view of its own; and a refcount given as ``True`` stays ``True`` (``True == 1`` must
    not hand it the view of a refcount of 1)."""
    ns = Namespace("m").key()

    def snap(refcount: Any, parent_hash: int = 5) -> Any:
        blocks = [
            tk.Block(0, 0, 5, token_ids=(1, 1), namespace=ns),
            tk.Block(1, refcount, 6, parent_hash=parent_hash, token_ids=(2, 2), namespace=ns),
            tk.Block(2, 0),
        ]
        return tk.build_snapshot(blocks, [], [2], tk.Counters(), block_size=2)

    one, two = snap(1), snap(1)
    assert all(a is b for a, b in zip(one.blocks, two.blocks, strict=True))
    held = snap(2)
    assert held.blocks[1].refcount == 2 and held.blocks[0] is one.blocks[0]
    orphan = snap(1, parent_hash=4)
    assert (orphan.blocks[1].parent, one.blocks[1].parent) == (-1, 0)
    assert snap(True).blocks[1].refcount is True


def test_a_snapshot_of_unchanged_inputs_is_the_last_one_unless_they_could_change() -> None:
    """Equal inputs hand back the last snapshot itself (the oracle then compares the two by
    identity); inputs holding a list are never reused, since the engine may go on changing
    the list in place, and an old snapshot would then pass for the current one."""
    ns = Namespace("m")

    def snap(tokens: Any, refcount: int = 0) -> Any:
        blocks = [tk.Block(0, refcount, 5, token_ids=tokens, namespace=ns.key()), tk.Block(1, 0)]
        return tk.build_snapshot(blocks, [], [1], tk.Counters(), block_size=2)

    first = snap((1, 1))
    assert snap((1, 1)) is first
    assert snap((1, 1), refcount=1) is not first
    held = [2, 2]  # an engine's own token list
    before = snap(held)
    held[1] = 3
    after = snap(held)
    assert (before.blocks[0].token_ids, after.blocks[0].token_ids) == ((2, 2), (2, 3))


def test_snapshot_depth_and_free_queue_options() -> None:
    ns = Namespace("m").key()
    orphan = tk.Block(0, 0, 9, parent_hash=4, token_ids=(1, 1), namespace=ns, depth=3)
    cached = tk.Block(1, 0, 8, token_ids=(2, 2), namespace=ns)
    snap = tk.build_snapshot([orphan, cached], [], [1], tk.Counters(), block_size=2)
    assert (snap.blocks[0].parent, snap.blocks[0].depth) == (-1, 3)  # depth as the engine knows
    assert snap.free_queue == ()  # lazily evicting queue: the cached block is evictable
    strict = tk.build_snapshot(
        [orphan, cached], [], [1], tk.Counters(), block_size=2, cached_in_free_queue=False
    )
    assert strict.free_queue == (1,)  # a published block in the free list is a bug...
    assert "INV-PARTITION" in {v.invariant for v in invariants.violations(strict)}  # ...reported


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
    assert "was cancelled before committing it" in str(info.value)
    assert oracle.log[-1].startswith("cache.match(")
    # the same calls against the correct manager pass every check
    from policy_variants import SchedulePublish

    ok = Lockstep(None, SchedulePublish(4, 1), caps=caps)
    ok.start()
    ok.op("admit", lambda c: c.admit(req))
    ok.op("free", lambda c: c.free([0]))
    ok.check_match(req, ok.op("match", lambda c: c.match(req), pure=True).value, "match")


class _CrashingFree(PrefixCacheManager):
    """Frees with an unlabelled crash, or with the wrong typed error."""

    error: type[Exception] = IndexError

    def free(self, seq_ids: Any) -> None:
        raise self.error("list index out of range")


@pytest.mark.parametrize(
    ("error", "check"), [(IndexError, "CRASH(free)"), (InvalidRequest, "DIFF-RAISE(free)")]
)
def test_exact_mode_names_a_candidate_crash(error: type[Exception], check: str) -> None:
    """Against a reference, a candidate that raises something that is not a
    PrefixCacheError crashed (``CRASH``, as without a reference); one that raises another
    typed error than the reference's differs (``DIFF-RAISE``)."""
    cand = _CrashingFree(4, 1)
    cand.error = error
    oracle: Lockstep[BlockManagerAdapter] = Lockstep(SpecCache(4, 1), cand)
    oracle.start()
    oracle.op("admit", lambda c: c.admit(Request(0, (7, 7), Namespace("m"))))
    with pytest.raises(CheckFailed) as info:
        oracle.op("free", lambda c: c.free([0]))
    assert info.value.check == check


def _translation_lines(text: str, start: str, end: str) -> int:
    """Non-blank lines from ``start`` (the adapter class) up to ``end``: the class and the
    helpers that render the engine's state; the capabilities and factories are apart."""
    block = re.search(rf"^{start}.*?(?=^{end})", text, re.M | re.S)
    assert block is not None, start
    return sum(1 for line in block.group(0).splitlines() if line.strip())


def test_the_readme_adapter_is_at_most_60_lines() -> None:
    """The README's adapter is the translation only: count its non-blank lines."""
    text = (_ROOT / "README.md").read_text(encoding="utf-8")
    lines = _translation_lines(text, "class PlainAdapter", r"@adapter\(")
    assert lines <= 60, lines


@pytest.mark.parametrize(
    "module",
    [
        "vllm_style_adapter",
        "radix_style_adapter",
        "hybrid_style_adapter",
        "minimal_engine_adapter",
        "mtp_engine_adapter",
    ],
)
def test_each_example_adapter_is_at_most_60_lines(module: str) -> None:
    """Each example manager's adapter is the translation only, counted as the README's."""
    text = (_ROOT / "examples" / f"{module}.py").read_text(encoding="utf-8")
    lines = _translation_lines(text, r"class \w+Adapter\(", "def factory_for")
    assert lines <= 60, (module, lines)


def test_deepcopy_of_a_populated_manager_is_faithful_enough_for_dry_runs() -> None:
    manager = EngineStyleManager(6, 2)
    manager.admit(Request("a", (1, 2, 3), Namespace("m")))
    twin = copy.deepcopy(manager)
    twin.free(["a"])
    assert manager.seq_ids() == ("a",) and twin.seq_ids() == ()


class _OverAsking(tk.AdapterBase[Any]):
    """A can_append that says no to everything, and an extend that checks the room."""

    append_asks_can_append = False

    def __init__(self) -> None:
        super().__init__(4, 2)
        self.reqs["a"] = "engine request"
        self.free_slots = 3

    def can_append(self, seq_id: Any, num_tokens: int) -> bool:
        return False

    def extend(self, seq_id: Any, num_tokens: int) -> list[int]:
        with tk.refusal(MemoryError, as_error=OutOfBlocks):
            if num_tokens > self.free_slots:
                raise MemoryError("no free slots")
        self.free_slots -= num_tokens
        return [9]


def test_append_without_asking_can_append_reaches_the_engine() -> None:
    """An over-asking can_append is not consulted, so the kit sees it (CAN-APPEND) instead
    of an append that never happens; the engine's own no-room error becomes OutOfBlocks."""
    adapter = _OverAsking()
    assert adapter.append("a", 2) == [9]
    with pytest.raises(OutOfBlocks, match="no free slots"):
        adapter.append("a", 2)
    with pytest.raises(UnknownSequence):
        adapter.append("b", 1)
    with pytest.raises(InvalidRequest):
        adapter.append("a", 0)


def test_seq_book_renders_a_sequence_view() -> None:
    book = tk.SeqBook.admitted(Request("s", (1, 2, 3), Namespace("m")), hit=2, reserved=3)
    book.committed(1, [4])
    view = book.view("s", [5, 6])
    assert view == SeqView("s", Namespace("m").key(), (1, 2, 3, 4), (5, 6), 3, 3, 3, 2)


def test_lineage_gives_copies_of_one_prefix_one_identity() -> None:
    ns = Namespace("m").key()
    lin = tk.Lineage()
    a0 = lin.published(0, None, ns, (7,))
    a1 = lin.published(1, 0, ns, (8,))
    b0 = lin.published(2, None, ns, (7,))  # a copy of block 0
    b1 = lin.published(3, 2, ns, (8,))  # a copy of block 1, under the copy
    c1 = lin.published(4, 3, ns, (8,))  # same tokens, one block deeper: another prefix
    assert a0 == b0 and a1 == b1 and c1 != a1
    assert lin.parent_identity(3) == a0 and lin.identity(1) == a1
    lin.unpublished(1)
    assert lin.identity(1) is None and lin.parent_identity(1) is None


def test_dry_run_over_several_objects_copies_them_together() -> None:
    engine: dict[str, list[int]] = {"queue": [1, 2]}
    req = {"blocks": engine["queue"]}  # the request refers to the engine's list

    def allocate(pair: tuple[dict[str, list[int]], dict[str, list[int]]]) -> int:
        eng, r = pair
        assert r["blocks"] is eng["queue"]  # the copies keep the sharing
        if len(eng["queue"]) < 3:
            raise OutOfBlocks("no room")
        return eng["queue"].pop()

    with pytest.raises(OutOfBlocks):
        tk.dry_run((engine, req), allocate)
    assert engine["queue"] == [1, 2]


def test_lineage_observe_records_a_block_once_per_key() -> None:
    """``observe`` reads publication off the engine's state: a block already recorded under
    the same key keeps its record; published again under another key, it is recorded again."""
    lin = tk.Lineage()
    lin.observe(0, None, b"m", (1,), key=10)
    lin.observe(1, 0, b"m", (2,), key=11)
    first = lin.identity(1)
    lin.observe(0, None, b"m", (9,), key=10)  # the same key: the record stands
    assert lin.identity(0) == (None, b"m", (1,)) and lin.namespace(1) == b"m"
    lin.observe(1, None, b"x", (2,), key=12)  # reused and published again elsewhere
    assert lin.identity(1) != first and lin.parent_identity(1) is None
    assert lin.namespace(1) == b"x" and lin.namespace(5) == b""


def test_lineage_block_fills_the_record_and_reuses_an_unchanged_block() -> None:
    """``Lineage.block`` is the :class:`Block` an adapter would write with the lineage's
    namespace, identity and parent identity; the same engine block gives the same object
    until it changes (its refcount, its hash, its tokens or its record), and a refcount of
    ``True`` never gets the block of a refcount of 1."""
    lin = tk.Lineage()
    lin.observe(0, None, b"m", (1, 1), key=10)
    lin.observe(1, 0, b"m", (2, 2), key=11)
    one = lin.block(1, 1, 11, [2, 2])
    assert one == tk.Block(
        1, 1, 11, None, (2, 2), b"m", identity=lin.identity(1), parent_identity=lin.identity(0)
    )
    assert lin.block(1, 1, 11, (2, 2)) is one
    assert lin.block(1, 2, 11, (2, 2)).refcount == 2 and lin.block(1, 0, None, ()) != one
    lin.observe(1, None, b"x", (2, 2), key=12)  # published again elsewhere: a new record
    assert lin.block(1, 1, 11, (2, 2)).parent_identity is None
    assert lin.block(1, True, 11, (2, 2)).refcount is True  # type: ignore[arg-type]


def test_counters_count_the_cached_blocks_an_allocation_took_as_evicted() -> None:
    c = tk.Counters()
    assert c.evicted_among({1, 2}, [0, 2, 3]) == 1
    assert c.evicted_among({0}, [0]) == 1 and c.evictions == 2


def test_match_of_is_the_hits_whatever_the_room() -> None:
    req = Request(0, (1, 2, 3, 4, 5), Namespace("m"))
    assert tk.match_of(req, [3, 1], 2) == Match(5, 4, (3, 1))


def test_block_memo_hands_back_an_unchanged_block_and_builds_a_changed_one() -> None:
    """``BlockMemo`` builds the :class:`Block` of its arguments, the same object for the same
    values; a refcount of ``True`` never gets the block of a refcount of 1, and a field that
    does not hash is built every time."""
    memo = tk.BlockMemo()
    one = memo(3, 1, 7, 5, (1, 2), b"m")
    assert one == tk.Block(3, 1, 7, 5, (1, 2), b"m") and memo(3, 1, 7, 5, (1, 2), b"m") is one
    assert memo(3, 2, 7, 5, (1, 2), b"m").refcount == 2 and memo(3, 1) == tk.Block(3, 1)
    assert memo(3, 1, 7, 4, (1, 2), b"m").parent_hash == 4
    assert memo(3, True, 7, 5, (1, 2), b"m").refcount is True  # type: ignore[arg-type]
    listed = memo(3, 1, 7, 5, [1, 2], b"m")  # type: ignore[arg-type]
    assert listed == tk.Block(3, 1, 7, 5, [1, 2], b"m")  # type: ignore[arg-type]
