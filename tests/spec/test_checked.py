"""The runtime invariant checker (prefixkv.spec.checked) catches real bugs, and is opt-in."""

from __future__ import annotations

from typing import Any

import pytest
from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import InvalidOperation, InvariantViolation, Namespace, Request, SpecCache
from prefixkv.spec.checked import ENV_VAR, CheckedCache, checked

NS = Namespace("tiny-llm@1")


def run_chat(cache: Any) -> None:
    """Two turns sharing a prefix, decode, a rejected commit, a free and an eviction."""
    adm = cache.admit(Request("a", (1, 2, 3, 4, 5, 6, 7), NS))
    cache.commit("a", adm.num_scheduled_tokens, [8])
    cache.append("a", 2)
    cache.commit("a", 1, [9])
    cache.rollback("a", 1)
    with pytest.raises(InvalidOperation):
        cache.commit("a", 5)
    assert cache.match(Request("q", (1, 2, 3, 4, 5), NS)).num_cached_tokens == 4
    adm = cache.admit(Request("b", (1, 2, 3, 4, 5, 6, 9), NS))
    cache.commit("b", adm.num_scheduled_tokens, [1])
    cache.free(["a", "b"])
    cache.evict(1)
    cache.take_events()


@pytest.mark.parametrize("cls", [SpecCache, PrefixCacheManager])
def test_correct_caches_pass_every_check(cls: type[Any]) -> None:
    """The spec and the impl pass; every call is checked."""
    cache = CheckedCache(cls(8, 2, record_events=True))
    run_chat(cache)
    assert cache.num_checks == 12  # every call above
    assert cache.num_blocks == 8  # attributes pass through


class _MutatingQuery(PrefixCacheManager):
    """A match that refreshes the LRU time of what it finds (a query that writes)."""

    def match(self, req: Request) -> Any:
        m = super().match(req)
        for b in m.block_ids:
            self._pool.last_use[b] += 1
        return m


class _HalfCommit(PrefixCacheManager):
    """A commit that records the accepted tokens before validating the count."""

    def commit(self, seq_id: Any, num_computed: int, accepted_tokens: Any = ()) -> None:
        self._seqs[seq_id].tokens.extend(accepted_tokens)
        super().commit(seq_id, num_computed, ())


def test_a_query_that_writes_is_caught() -> None:
    cache = CheckedCache(_MutatingQuery(8, 2))
    adm = cache.admit(Request("a", (1, 2, 3), NS))
    cache.commit("a", adm.num_scheduled_tokens, [4])
    cache.free(["a"])  # block 0 is cached: its LRU time decides when it is evicted
    with pytest.raises(InvariantViolation, match=r"INV-TXN.*match is a query"):
        cache.match(Request("q", (1, 2, 3), NS))


def test_a_failed_call_that_changed_state_is_caught() -> None:
    cache = CheckedCache(_HalfCommit(8, 2))
    adm = cache.admit(Request("a", (1, 2, 3), NS))
    with pytest.raises(InvariantViolation, match=r"INV-TXN.*commit raised"):
        cache.commit("a", adm.num_scheduled_tokens + 5, [4])


def test_a_broken_refcount_is_named() -> None:
    cache = CheckedCache(PrefixCacheManager(8, 2))
    adm = cache.admit(Request("a", (1, 2, 3), NS))
    cache.commit("a", adm.num_scheduled_tokens, [4])
    cache.wrapped._pool.ref[0] += 1  # a refcount with no table behind it
    with pytest.raises(InvariantViolation) as info:
        cache.stats()
    assert "INV-REF" in str(info.value)


def test_checked_is_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = SpecCache(4, 2)
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert checked(plain) is plain
    assert isinstance(checked(plain, enabled=True), CheckedCache)
    monkeypatch.setenv(ENV_VAR, "1")
    assert isinstance(checked(plain), CheckedCache)
    assert checked(plain, enabled=False) is plain


def test_needs_a_snapshot() -> None:
    with pytest.raises(TypeError, match="snapshot"):
        CheckedCache(object())
