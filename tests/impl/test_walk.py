"""The admission walk's fast paths: keys computed in one pass, candidates verified per run.

The differential machines drive these paths with every hasher; these tests pin down the
cases a random walk reaches rarely: a matched chain whose block ids are not consecutive (so
the token ids are compared run by run), a bad candidate in the middle of a long run, keys
computed up front for a whole prompt against the keys a publication computes block by block,
and prompts whose token ids look like bools to the request's fast check.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from prefixkv.impl import PrefixCacheManager
from prefixkv.impl._keys import ChainKeys
from prefixkv.spec import InvalidRequest, Namespace, Request, SpecCache
from prefixkv.spec.hashing import tokens_only_hash

NS = Namespace("m")
BS = 4


def _prompt(rng: random.Random, blocks: int) -> list[int]:
    return [rng.randrange(1000) for _ in range(blocks * BS + 1)]


def _prefill(cache: object, seq_id: int, prompt: list[int]) -> None:
    adm = cache.admit(Request(seq_id, prompt, NS))  # type: ignore[attr-defined]
    cache.commit(seq_id, adm.num_scheduled_tokens, [7])  # type: ignore[attr-defined]


@pytest.mark.parametrize("hasher", [None, tokens_only_hash], ids=["keyed", "tokens_only"])
def test_non_consecutive_chains_match_like_the_spec(hasher: object) -> None:
    """Interleaved prefills give chains of scattered block ids; every match agrees."""
    rng = random.Random(3)
    kwargs: dict[str, Any] = {} if hasher is None else {"hasher": hasher}
    impl = PrefixCacheManager(256, BS, **kwargs)
    spec = SpecCache(256, BS, **kwargs)
    base = _prompt(rng, 6)
    prompts = [base[:-1] + _prompt(rng, 3) for _ in range(4)]
    # Two sequences prefill in chunks that alternate, so their blocks interleave.
    for cache in (impl, spec):
        for i, p in enumerate(prompts[:2]):
            cache.admit(Request(i, p, NS), 2 * BS)
        for _ in range(4):
            for i in range(2):
                seq_computed = cache.num_computed_tokens(i)
                cache.commit(i, 2 * BS if seq_computed < len(prompts[i]) - 2 * BS else 0, ())
                if cache.num_computed_tokens(i) < len(prompts[i]):
                    cache.continue_prefill(i, 2 * BS)
    table = impl.block_table(0)
    assert any(b - a != 1 for a, b in itertools.pairwise(table)), table
    probes = [*prompts, base, base[: 3 * BS + 2], [*prompts[0][:-3], 999, 998, 997]]
    for j, p in enumerate(probes):
        req = Request(100 + j, p, NS)
        assert impl.match(req) == spec.match(req)


def test_a_bad_candidate_inside_a_run_ends_the_match() -> None:
    """With a tokens-only hash, a block of another prefix is a single candidate that looks
    right: the walk must stop there, even inside a run of consecutive block ids."""
    rng = random.Random(5)
    impl = PrefixCacheManager(64, BS, hasher=tokens_only_hash)
    spec = SpecCache(64, BS, hasher=tokens_only_hash)
    a = _prompt(rng, 6)
    b = list(a)
    b[2 * BS] += 1  # block 2 differs: blocks 3.. collide with a's under the tokens-only hash
    for cache in (impl, spec):
        _prefill(cache, 1, a)
    req = Request(2, b, NS)
    assert impl.match(req) == spec.match(req)
    assert impl.match(req).num_cached_tokens == 2 * BS


def _all_but_last(
    parent: int | None, namespace: bytes, token_ids: tuple[int, ...], extra: object
) -> int:
    """A hash blind to a block's last token: blocks that differ only there collide."""
    return hash((parent, namespace, token_ids[:-1]))


@pytest.mark.parametrize("where", [0, 2, 5])
def test_a_candidate_that_differs_in_its_last_token_is_refused(where: int) -> None:
    """The candidate has the right parent and namespace and collides on the key; only its
    last token differs. It is refused, whether it starts, ends or sits inside a run."""
    rng = random.Random(11)
    impl = PrefixCacheManager(64, BS, hasher=_all_but_last)
    spec = SpecCache(64, BS, hasher=_all_but_last)
    a = _prompt(rng, 6)
    for cache in (impl, spec):
        _prefill(cache, 1, a)
    assert impl.block_table(1) == tuple(range(7))  # one run of consecutive ids
    b = list(a)
    b[where * BS + BS - 1] += 1
    req = Request(2, b, NS)
    assert impl.match(req) == spec.match(req)
    assert impl.match(req).num_cached_tokens == where * BS


def test_prompt_keys_are_the_keys_publication_computes() -> None:
    """The keys an admission computes for a whole prompt in one pass are those the blocks
    are published under one by one (else nothing published would ever be hit)."""
    rng = random.Random(7)
    cache = PrefixCacheManager(64, BS)
    prompt = _prompt(rng, 5)
    cache.admit(Request(1, prompt, NS))
    # Publish the decode-grown blocks too: those keys come from the block-by-block path.
    cache.commit(1, len(prompt), [1])
    reply = [rng.randrange(1000) for _ in range(2 * BS)]
    for tok in reply:
        cache.append(1, 1)
        cache.commit(1, 1, [tok])
    full = [*prompt, 1, *reply]
    req = Request(2, [*full, 3], NS)
    got = cache.match(req)
    assert got.num_cached_tokens == (len(full) // BS) * BS
    assert got.block_ids == cache.block_table(1)[: len(full) // BS]


def test_an_admission_hands_its_prompt_keys_to_the_sequence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The keys the walk computed travel in the match and plan records to the admitted
    sequence: publishing the prompt's blocks hashes none of them again, and a lookup of
    another prompt in between (``match``, ``can_admit``) changes nothing."""
    rng = random.Random(11)
    cache = PrefixCacheManager(64, BS)
    prompt = _prompt(rng, 5)
    req = Request(1, prompt, NS)
    plan = cache._plan(req, None)
    cache.match(Request(9, _prompt(rng, 3), NS))
    cache.can_admit(Request(8, _prompt(rng, 2), NS))
    chain_keys: list[int] = []
    real = ChainKeys.chain_key

    def counted(self: ChainKeys, *args: Any) -> int:
        chain_keys.append(1)
        return real(self, *args)

    monkeypatch.setattr(ChainKeys, "chain_key", counted)
    cache.admit(req)
    assert cache._seqs[1].prompt_keys == plan.keys and len(plan.keys) == 5
    cache.commit(1, len(prompt), [1])  # publishes the five prompt blocks
    assert chain_keys == []
    assert cache.match(Request(2, [*prompt, 3], NS)).num_cached_tokens == 5 * BS


@pytest.mark.parametrize(
    "tokens",
    [
        [256, 1, 0, 512, True],  # low bytes 0 and 1 that are not bools, then a bool
        [0] * 100 + [False],  # more candidates than the fast check probes
        [257, 1] * 50 + [True],
    ],
    ids=["late_bool", "many_zeros", "many_ones"],
)
def test_bools_are_found_among_zeros_and_ones(tokens: list[object]) -> None:
    with pytest.raises(InvalidRequest):
        Request(1, tokens, NS)


def test_zeros_and_ones_that_are_ints_pass() -> None:
    tokens = [256, 1, 0, 512, 1, 0] * 20
    req = Request(1, tokens, NS)
    assert req.token_ids == tuple(tokens)
    assert all(type(t) is int for t in req.token_ids)
