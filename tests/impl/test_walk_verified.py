"""Exact verification of hit chains, on both of ``PrefixWalk.verified``'s paths.

A chain of candidates with consecutive block ids (one run) reads its parents and namespaces
as slices of the pool's columns; any other chain gathers them block by block. Each test
uses a hasher that ignores part of the identity, so the index hands back candidates that
only an exact check can refuse, and compares the manager with the executable spec.
"""

from __future__ import annotations

from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import Namespace, Request, SpecCache

BS = 4
NS_A = Namespace("model@1")
NS_B = Namespace("model@1", adapter="lora-7")


def _no_namespace(parent: int | None, ns: bytes, tokens: tuple[int, ...], extras: object) -> int:
    """A chain hash that ignores the namespace: another tenant's chain collides."""
    return hash((parent, tokens))


def _no_parent(parent: int | None, ns: bytes, tokens: tuple[int, ...], extras: object) -> int:
    """A hash of the block's own tokens: the same block under another prefix collides."""
    return hash((ns, tokens))


def _both(hasher: object) -> tuple[PrefixCacheManager, SpecCache]:
    if hasher is None:  # the default, keyed index
        return PrefixCacheManager(64, BS), SpecCache(64, BS)
    return (
        PrefixCacheManager(64, BS, hasher=hasher),  # type: ignore[arg-type]
        SpecCache(64, BS, hasher=hasher),  # type: ignore[arg-type]
    )


def _publish(cache: PrefixCacheManager | SpecCache, req: Request) -> None:
    adm = cache.admit(req)
    cache.commit(req.seq_id, adm.num_scheduled_tokens, [7])


def test_one_run_chain_in_another_namespace_is_refused() -> None:
    prompt = list(range(100, 113))  # three full blocks, one run of block ids
    for cache in _both(_no_namespace):
        _publish(cache, Request("a", prompt, NS_A))
        other = cache.match(Request("b", prompt, NS_B))
        assert other.num_cached_tokens == 0
        assert other.block_ids == ()
        assert cache.match(Request("c", prompt, NS_A)).num_cached_tokens == 3 * BS


def test_one_run_namespace_mismatch_past_the_first_block_cuts_the_match() -> None:
    # Tenant B publishes its root block first; A's later chain then has B's root as a
    # one-block run and A's blocks after it. Under the namespace-blind hash, B's lookup of
    # A's prompt finds B's root, then A's second block: the namespace check must cut there.
    impl, spec = _both(_no_namespace)
    head, tail = list(range(10, 14)), list(range(20, 29))
    for cache in (impl, spec):
        _publish(cache, Request("b", [*head, 1], NS_B))
        _publish(cache, Request("a", head + tail, NS_A))
        got = cache.match(Request("q", head + tail, NS_B))
        assert got.num_cached_tokens == BS
    assert (
        impl.match(Request("q", head + tail, NS_B)).block_ids
        == spec.match(Request("q", head + tail, NS_B)).block_ids
    )


def test_one_run_chain_whose_first_block_has_a_parent_is_refused() -> None:
    a, b = list(range(30, 34)), list(range(40, 44))
    for cache in _both(_no_parent):
        _publish(cache, Request("a", a + b + [1], NS_A))
        # b's block is cached as the child of a's: as a root it is another identity.
        assert cache.match(Request("q", [*b, 1], NS_A)).num_cached_tokens == 0


def test_chain_of_several_runs_is_verified_and_matches_the_spec() -> None:
    impl, spec = _both(None)
    for cache in (impl, spec):
        turn1 = list(range(200, 210))
        _publish(cache, Request("t1", turn1, NS_A))
        _publish(cache, Request("x", list(range(500, 509)), NS_A))  # takes the next ids
        turn2 = [*turn1, 7, *list(range(300, 310))]
        _publish(cache, Request("t2", turn2, NS_A))
        turn3 = [*turn2, 7, 1, 2, 3, 4, 5, 6]
        got = cache.match(Request("t3", turn3, NS_A))
        assert got.num_cached_tokens == (len(turn2) + 1) // BS * BS
        # A different token in the last matched block ends the match one block earlier.
        bad = list(turn3)
        bad[got.num_cached_tokens - 1] += 1
        assert cache.match(Request("t4", bad, NS_A)).num_cached_tokens == (
            got.num_cached_tokens - BS
        )
    blocks = impl.match(Request("t3", turn3, NS_A)).block_ids
    assert len(blocks) > 1 and list(blocks) != list(range(blocks[0], blocks[0] + len(blocks)))


def _no_last_token(parent: int | None, ns: bytes, tokens: tuple[int, ...], extras: object) -> int:
    """A chain hash blind to each block's last token: a near-miss block collides."""
    return hash((parent, ns, tokens[:-1]))


def test_one_run_token_mismatch_cuts_the_match_at_that_block() -> None:
    prompt = list(range(60, 73))  # three full blocks, one run of block ids
    for cache in _both(_no_last_token):
        _publish(cache, Request("a", prompt, NS_A))
        for j in range(3):
            near = list(prompt)
            near[j * BS + BS - 1] += 1000  # only block j's last token differs
            assert cache.match(Request("q", near, NS_A)).num_cached_tokens == j * BS
