"""The radix-tree-style example manager: its own API first, then the conformance kit.

The kit part shows that the correct manager passes under its declared capabilities and that
each classic bug of :data:`examples.radix_style.BUGS` is caught by the check named here.
"""

from __future__ import annotations

from typing import Any

import pytest
from kit_runs import FIND_ONLY, STEPS, first_failure, passes, shortest_failure

from examples.radix_style import BUGS, RadixKVManager, Req, TreeNode
from examples.radix_style_adapter import BUG_FACTORIES, CAPABILITIES, make_manager
from prefixkv.conformance import ConformanceFailure, run_conformance

PS = 2


def _req(rid: Any, tokens: list[int], ns: bytes = b"m") -> Req:
    return Req(rid, tokens, ns)


def _run(m: RadixKVManager, rid: Any, tokens: list[int], ns: bytes = b"m") -> Req:
    """Admit the whole prompt and compute it."""
    r = _req(rid, tokens, ns)
    assert m.admit(r)
    m.record_forward(r, len(tokens) - r.num_cached_tokens)
    return r


def _accounting(m: RadixKVManager) -> tuple[int, int]:
    """(evictable, protected) pages recounted from the tree."""
    free = prot = 0
    for _, node, _, _ in m.tree.all_pages():
        if node.parent is None:
            continue
        if node.lock_ref:
            prot += 1
        else:
            free += 1
    return free, prot


# -- the manager's own API -------------------------------------------------------------------


def test_match_leaves_one_token_and_is_page_aligned() -> None:
    m = RadixKVManager(8, PS)
    a = _run(m, "a", [1, 2, 3, 4, 5])  # pages [1,2] [3,4] are inserted, [5] is partial
    m.cache_finished_req(a)
    pages, _ = m.match([1, 2, 3, 4], b"m")
    assert pages == a.pages[:1]  # 4 tokens: the last one must be computed
    pages, _ = m.match([1, 2, 3, 4, 9], b"m")
    assert pages == a.pages[:2]
    assert m.match([1, 2, 3, 4, 9], b"other")[0] == []  # namespaces never share


def test_match_splits_an_edge_where_it_ends() -> None:
    m = RadixKVManager(8, PS)
    m.cache_finished_req(_run(m, "a", [1, 2, 3, 4, 5, 6, 7]))
    root = m.tree.roots[b"m"]
    (edge,) = root.children.values()
    assert len(edge.value) == 3
    pages, node = m.match([1, 2, 3, 4, 0], b"m")
    assert len(pages) == 2 and node.value == pages and len(node.children) == 1
    assert [p for p, *_ in m.tree.all_pages()] == [p for p, *_ in m.tree.all_pages()]
    assert sorted(p for p, *_ in m.tree.all_pages()) == sorted(edge.value + pages)


def test_a_duplicate_page_stays_private_and_is_freed_on_finish() -> None:
    m = RadixKVManager(8, PS)
    a, b = _req("a", [1, 2, 3]), _req("b", [1, 2, 3])
    assert m.admit(a) and m.admit(b)  # neither is cached yet: two copies of page [1, 2]
    m.record_forward(a, 3)
    m.record_forward(b, 3)  # the tree already holds a's page: b's stays private
    assert b.pages[0] in b.private and a.pages[0] not in a.private
    free_before = m.pool.available_size()
    m.cache_finished_req(b)
    assert m.pool.available_size() == free_before + 2  # b's duplicate and its partial page
    assert m.match([1, 2, 9], b"m")[0] == a.pages[:1]


def test_lock_refs_protect_the_path_and_eviction_takes_lru_leaves_from_the_tail() -> None:
    m = RadixKVManager(8, PS)
    m.cache_finished_req(_run(m, "a", [1, 2, 3, 4, 5]))  # pages of [1,2][3,4] cached
    m.cache_finished_req(_run(m, "b", [7, 7, 8, 8, 5]))  # [7,7][8,8] cached, newer
    assert _accounting(m) == (m.tree.evictable_size, m.tree.protected_size) == (4, 0)
    c = _req("c", [1, 2, 3, 4, 6])
    assert m.admit(c)  # hits a's two pages and locks them
    assert _accounting(m) == (m.tree.evictable_size, m.tree.protected_size) == (2, 2)
    assert m.evict(1) == 1  # b's tail page goes first: a's are locked
    assert m.match([7, 7, 8, 8, 0], b"m")[0] != [] and len(m.match([7, 7, 8, 8, 0], b"m")[0]) == 1
    assert m.evict(5) == 1  # only b's head is left to evict
    assert m.match([1, 2, 3, 4, 0], b"m")[0] == c.pages[:2]
    m.cache_finished_req(c)
    assert m.evict(5) == 2  # c computed nothing: its own page went back to the pool
    assert m.pool.available_size() == 8 and _accounting(m) == (0, 0)


def test_admission_counts_the_hit_as_locked() -> None:
    m = RadixKVManager(4, PS)
    m.cache_finished_req(_run(m, "a", [1, 2, 3, 4]))  # pages [1,2][3,4] cached, 2 free
    b = _req("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])  # hits 2 pages, needs 3 more
    assert not m.can_admit(b) and not m.admit(b)  # 2 free + 0 evictable once locked
    assert m.pool.available_size() == 2 and m.tree.evictable_size == 2  # nothing changed
    assert m.can_admit(b, 4) and m.admit(b, 4)  # a chunk of 4 tokens needs 2 pages


def test_extend_and_release_tail() -> None:
    m = RadixKVManager(4, PS)
    r = _run(m, "a", [1, 2, 3])
    assert m.extend(r, 3) is not None and len(r.pages) == 3
    assert m.release_tail(r, 2) == [r.pages[-1]] or len(r.pages) == 2
    assert r.kv_allocated_len == 4 and len(r.pages) == 2
    with pytest.raises(ValueError):
        m.release_tail(r, 2)  # would give back written slots
    assert m.extend(r, 100) is None and r.kv_allocated_len == 4


def test_reset_is_refused_while_a_request_runs() -> None:
    m = RadixKVManager(4, PS)
    r = _run(m, "a", [1, 2, 3])
    assert not m.reset()
    m.cache_finished_req(r)
    assert m.reset() and m.pool.available_size() == 4 and not m.tree.roots


def test_tree_node_order_is_lru_then_creation() -> None:
    a, b = TreeNode(), TreeNode()
    a.last_access_time = b.last_access_time = 3
    assert a < b
    b.last_access_time = 2
    assert b < a


# -- the conformance kit ---------------------------------------------------------------------


#: bug -> the checks that may catch it first. An over-counted supply is a room query that
#: promised more blocks than the snapshot can supply (CAN-ADMIT, CAN-APPEND: the broken
#: promise, named before the manager's own allocation guard trips); a locked
#: page evicted is free while held (INV-PARTITION), or already handed to a second request
#: while the first still holds it (INV-WRITE: a private page shared).
EXPECTED = {
    "evict_locked_leaf": {"INV-PARTITION", "INV-REF", "INV-WRITE"},
    "matched_prefix_counted_evictable": {"CAN-ADMIT"},
    "whole_prompt_matched": {"INV-MATCH"},
    "insert_unwritten_pages": {"INV-PUBLISH"},
    # the unlocked upper node counts as evictable while a request's table holds it
    "split_drops_lock": {"CAN-ADMIT", "CAN-APPEND"},
    "extend_checks_one_page": {"CAN-APPEND"},
    "finish_keeps_lock": {"LEAK"},
}


def test_every_bug_has_an_expected_check() -> None:
    assert set(EXPECTED) == set(BUGS) == set(BUG_FACTORIES)


def test_the_correct_manager_passes_the_kit() -> None:
    assert make_manager.capabilities == CAPABILITIES
    passes(make_manager)


@pytest.mark.parametrize("bug", sorted(EXPECTED))
def test_each_bug_is_caught(bug: str) -> None:
    """Found without shrinking: a failing run is mostly shrinking, and the shortest
    replays are in docs/conformance.md (measured with it)."""
    failure = first_failure(BUG_FACTORIES[bug])
    assert failure.check in EXPECTED[bug], str(failure)


def test_a_lock_never_dropped_is_a_leak_without_evict_too() -> None:
    """LEAK needs no ``evict`` operation and no any-order eviction: the leaked pages look
    evictable in the snapshot, and a pool-sized prompt is refused once nothing is live."""
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(
            BUG_FACTORIES["finish_keeps_lock"],
            max_examples=100,
            steps=STEPS,
            profile=FIND_ONLY,
            max_failures=1,
            evict=False,
        )
    assert info.value.check == "LEAK", str(info.value)


def test_a_bug_shrinks_to_a_short_replay() -> None:
    failure = shortest_failure(BUG_FACTORIES["evict_locked_leaf"])
    assert failure.check in EXPECTED["evict_locked_leaf"] and failure.steps <= 3, failure.format()
