"""Regression tables for what the reliability audit found and what it confirmed (issue 17 §4).

Every table runs over both managers, the spec and the impl, because either one may be the
cache an engine uses, and each finding was reproduced in both:

* the namespace digest memo is bounded (it grew by one entry per tenant salt, forever);
* names that have no UTF-8 form are refused with ``InvalidRequest`` at construction, and the
  salt is bytes only, so no raw ``UnicodeEncodeError`` ever leaves ``match`` or ``admit``;
* identity chains as deep as long prompts neither recurse nor compare to the root;
* bad inputs raise typed errors (prefixkv's and a builtin) and change nothing;
* namespaces whose fields concatenate to the same bytes never share a block, even when
  every block lands in one of four hash buckets.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import (
    InvalidRequest,
    MultimodalSpan,
    Namespace,
    PrefixCacheError,
    Request,
    SpecCache,
    invariants,
)
from prefixkv.spec.hashing import weak_hash
from prefixkv.spec.identity import NS_DIGEST_CACHE_SIZE, BlockIdentity, ns_digest

from prefixkv.conformance.machines.strategies import (
    BAD_NAMESPACE_ARGS,
    BAD_SPAN_NAMES,
    CRAFTED_NAMESPACE_PAIRS,
)

MANAGERS: dict[str, Callable[..., Any]] = {"spec": SpecCache, "impl": PrefixCacheManager}
NS = Namespace("tiny-llm@1")


def _case_id(kwargs: dict[str, Any]) -> str:
    """A stable ASCII id: parallel workers must collect the same names (no addresses, no
    lone surrogates)."""
    shown = {k: type(v).__name__ if isinstance(v, memoryview) else v for k, v in kwargs.items()}
    return ascii(shown)


@pytest.fixture(params=sorted(MANAGERS))
def make(request: pytest.FixtureRequest) -> Callable[..., Any]:
    return MANAGERS[request.param]


def busy(make: Callable[..., Any]) -> Any:
    """A cache with a live sequence, a cached prefix and pending events."""
    c = make(16, 2, record_events=True)
    c.admit(Request("cached", (1, 2, 3, 4, 5), NS))
    c.commit("cached", 5, (6,))
    c.free(["cached"])
    c.admit(Request("live", (1, 2, 3, 4, 7, 8), NS))
    return c


# -- the namespace digest memo ---------------------------------------------------------------


def test_ns_digest_memo_is_bounded() -> None:
    """Three times the bound in distinct namespaces: the memo never holds more than the bound,
    and an evicted namespace digests to the same value again (the memo is only a memo)."""
    first = ns_digest(Namespace("m", salt=b"user-0").key())
    for i in range(3 * NS_DIGEST_CACHE_SIZE):
        ns_digest(Namespace("m", salt=b"user-%d" % i).key())
        assert ns_digest.cache_info().currsize <= NS_DIGEST_CACHE_SIZE
    assert ns_digest(Namespace("m", salt=b"user-0").key()) == first


def test_per_tenant_salts_do_not_grow_the_memo(make: Callable[..., Any]) -> None:
    """A server isolating each user with a salt: admissions, matches and a full reset over
    twice the bound in salts leave the process-wide memo at its bound."""
    c = make(8, 2)
    for i in range(2 * NS_DIGEST_CACHE_SIZE + 10):
        req = Request(i, (1, 2, 3), Namespace("tiny-llm@1", salt=b"user-%d" % i))
        c.match(req)
        if i % 512 == 0:
            c.admit(req)
            c.commit(i, 3, (4,))
            c.free([i])
    c.reset(preserve_cache=False)
    assert ns_digest.cache_info().currsize <= NS_DIGEST_CACHE_SIZE
    # The impl keeps a per-manager memo of namespace keys on top: bounded the same way.
    if isinstance(c, PrefixCacheManager):
        assert 0 < len(c._keys) <= NS_DIGEST_CACHE_SIZE


# -- names without a UTF-8 form, salts that are not bytes ----------------------------------


@pytest.mark.parametrize("kwargs", BAD_NAMESPACE_ARGS, ids=_case_id)
def test_bad_namespaces_are_refused_at_construction(
    make: Callable[..., Any], kwargs: dict[str, Any]
) -> None:
    c = busy(make)
    before = c.snapshot()
    with pytest.raises(InvalidRequest) as caught:
        c.admit(Request("new", (1, 2, 3), Namespace(**kwargs)))
    assert isinstance(caught.value, ValueError)  # the builtin a caller would catch
    assert not isinstance(caught.value, UnicodeError)  # typed at construction, not later
    invariants.check_unchanged(before, c.snapshot(), "admit")


@pytest.mark.parametrize("kwargs", BAD_SPAN_NAMES, ids=_case_id)
def test_bad_span_names_are_refused_at_construction(
    make: Callable[..., Any], kwargs: dict[str, Any]
) -> None:
    c = busy(make)
    before = c.snapshot()
    with pytest.raises(InvalidRequest) as caught:
        c.match(Request("new", (9, 9, 9, 1), NS, spans=(MultimodalSpan(0, 3, **kwargs),)))
    assert not isinstance(caught.value, UnicodeError)
    invariants.check_unchanged(before, c.snapshot(), "match")


# -- deep identity chains --------------------------------------------------------------------


def test_identity_chains_deeper_than_the_recursion_limit() -> None:
    """Hash, equality and depth of a 50,000-block chain: no recursion, exact answers."""
    a = b = None
    for i in range(50_000):
        a = BlockIdentity(b"ns", a, (i,))
        b = BlockIdentity(b"ns", b, (i,))
    assert a is not None and b is not None
    assert a == b and hash(a) == hash(b) and a.depth == 50_000
    c = BlockIdentity(b"ns", a.parent, (-1,))
    assert c != b and BlockIdentity(b"other", None, (0,)) != BlockIdentity(b"ns", None, (0,))


def test_long_prompt_at_block_size_one(make: Callable[..., Any]) -> None:
    """A 3,000-token prompt cached at block size 1 is matched in full (minus the cap)."""
    c = make(4_000, 1)
    tokens = tuple(range(1, 3_001))
    c.admit(Request("a", tokens, NS))
    c.commit("a", len(tokens), (1,))
    c.free(["a"])
    assert c.match(Request("b", tokens, NS)).num_cached_tokens == len(tokens) - 1
    assert c.match(Request("b", (*tokens, 5), NS)).num_cached_tokens == len(tokens)


# -- bad inputs: typed errors, nothing changes ----------------------------------------------

#: ``(what, call)``: each call must raise a PrefixCacheError that is also a builtin error.
BAD_CALLS: tuple[tuple[str, Callable[[Any], Any]], ...] = (
    ("admit live id", lambda c: c.admit(Request("live", (1, 2), NS))),
    ("admit a tuple", lambda c: c.admit((1, 2, 3))),
    ("admit budget 0", lambda c: c.admit(Request("x", (1, 2), NS), 0)),
    ("admit too big", lambda c: c.admit(Request("x", (1,) * 100, NS))),
    ("append unknown", lambda c: c.append("ghost", 1)),
    ("append 0", lambda c: c.append("live", 0)),
    ("append bool", lambda c: c.append("live", True)),
    ("commit past reserved", lambda c: c.commit("live", 7, (1,))),
    ("commit bad token", lambda c: c.commit("live", 0, (-1,))),
    ("commit str tokens", lambda c: c.commit("live", 0, "ab")),
    ("rollback past computed", lambda c: c.rollback("live", 7)),
    ("free one id", lambda c: c.free("live")),
    ("free twice", lambda c: c.free(["live", "live"])),
    ("free unknown in batch", lambda c: c.free(["live", "ghost"])),
    ("evict -1", lambda c: c.evict(-1)),
    ("full reset while live", lambda c: c.reset(preserve_cache=False)),
    ("reset flag int", lambda c: c.reset(preserve_cache=1)),
    ("block_table float id", lambda c: c.block_table(1.5)),
)


@pytest.mark.parametrize(("what", "call"), BAD_CALLS, ids=[what for what, _ in BAD_CALLS])
def test_bad_inputs_raise_typed_errors_and_change_nothing(
    make: Callable[..., Any], what: str, call: Callable[[Any], Any]
) -> None:
    c = busy(make)
    before = c.snapshot()
    with pytest.raises(PrefixCacheError) as caught:
        call(c)
    assert isinstance(caught.value, (ValueError, KeyError, RuntimeError)), what
    invariants.check_unchanged(before, c.snapshot(), what)


# -- crafted namespaces ----------------------------------------------------------------------


@pytest.mark.parametrize(("left", "right"), CRAFTED_NAMESPACE_PAIRS, ids=ascii)
def test_crafted_namespaces_never_share_a_block(
    make: Callable[..., Any], left: Namespace, right: Namespace
) -> None:
    """Fields that concatenate to the same bytes: distinct keys, no hit across, no shared
    block, under a hash that puts every block in one of four buckets."""
    assert left.key() != right.key()
    c = make(16, 2, hasher=weak_hash)
    tokens = (1, 2, 3, 4, 5)
    c.admit(Request("l", tokens, left))
    c.commit("l", 5, (6,))
    assert c.match(Request("r", tokens, right)).num_cached_tokens == 0
    adm = c.admit(Request("r", tokens, right))
    assert adm.num_cached_tokens == 0
    c.commit("r", 5, (6,))
    left_blocks = set(c.block_table("l"))
    assert not left_blocks & set(c.block_table("r"))
    assert c.match(Request("x", tokens, left)).block_ids == tuple(c.block_table("l")[:2])
    invariants.check(c.snapshot())
