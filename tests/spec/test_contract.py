"""The shared contract (``prefixkv.spec.contract``), checked directly.

A rule in the contract is called by the spec and by the managers alike, so a bug in it hits
both sides and no differential machine can see it. These tables pin each rule on its own:
every refusal (its error class and a fragment of its message) and every size it computes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest
from prefixkv.impl import HybridPrefixCacheManager, PrefixCacheManager
from prefixkv.impl._stats import Counters as ImplCounters
from prefixkv.spec import (
    CacheBusy,
    DuplicateSequence,
    HybridPrefixCache,
    HybridSpecCache,
    InvalidOperation,
    InvalidRequest,
    LostReuse,
    MultimodalSpan,
    OutOfBlocks,
    OutOfStateSlots,
    PrefixCache,
    PrefixCacheError,
    SeqId,
    SpecCache,
    UnknownSequence,
)
from prefixkv.spec import contract as c
from prefixkv.spec.cache import _Counters as SpecCounters

from prefixkv.errors import InvalidConfig

IMG = MultimodalSpan(4, 8, "image", b"cat")  # tokens 4..7
LIVE: dict[SeqId, int] = {"a": 1, 7: 2}

#: ``(call, error class, fragment of the message)``: each call must raise exactly that.
BAD: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    (
        "count: bool",
        lambda: c.check_count(True, "n", minimum=0),
        InvalidRequest,
        "n must be an int",
    ),
    ("count: float", lambda: c.check_count(1.0, "n", minimum=0), InvalidRequest, "got 1.0"),
    (
        "count: below",
        lambda: c.check_count(0, "n", minimum=1),
        InvalidRequest,
        "n must be an int >= 1",
    ),
    ("pool: bool", lambda: c.check_pool_shape(True, 4), InvalidConfig, "num_blocks must be an int"),
    (
        "pool: zero",
        lambda: c.check_pool_shape(4, 0),
        InvalidConfig,
        "block_size must be an int >= 1",
    ),
    ("seq: bad id", lambda: c.live_seq(LIVE, 1.5), InvalidRequest, "seq_id must be an int"),
    ("seq: bool id", lambda: c.live_seq(LIVE, True), InvalidRequest, "seq_id must be an int"),
    ("seq: not live", lambda: c.live_seq(LIVE, "b"), UnknownSequence, "'b' is not live"),
    ("free: one str", lambda: c.check_free_list("a", LIVE), InvalidRequest, "not one id"),
    ("free: bytes", lambda: c.check_free_list(b"a", LIVE), InvalidRequest, "not one id"),
    ("free: not iterable", lambda: c.check_free_list(3, LIVE), InvalidRequest, "got 3"),
    ("free: bad id", lambda: c.check_free_list(["a", None], LIVE), InvalidRequest, "seq_id"),
    ("free: unknown", lambda: c.check_free_list(["a", "b"], LIVE), UnknownSequence, "'b'"),
    ("free: twice", lambda: c.check_free_list([7, "a", 7], LIVE), DuplicateSequence, "twice"),
    ("reset: not bool", lambda: c.check_reset(1, 0), InvalidRequest, "must be a bool"),
    ("reset: busy", lambda: c.check_reset(False, 2), CacheBusy, "2 sequences are live"),
    (
        "continue: budget",
        lambda: c.check_continue("a", 0, 4, 4, 10),
        InvalidRequest,
        "num_new_tokens must be an int >= 1",
    ),
    (
        "continue: done",
        lambda: c.check_continue("a", None, 10, 10, 10),
        InvalidOperation,
        "no prompt tokens left",
    ),
    (
        "continue: uncommitted",
        lambda: c.check_continue("a", 4, 2, 6, 10),
        InvalidOperation,
        "has 4 reserved tokens not yet committed",
    ),
    (
        "growth: limit",
        lambda: c.check_growth("a", 4, 9, 2, 10, 6, ()),
        InvalidOperation,
        "would hold 7 uncommitted prompt tokens, over its kv_token_limit of 6",
    ),
    (
        "growth: span",
        lambda: c.check_growth("a", 2, 6, 2, 10, None, (IMG,)),
        InvalidOperation,
        "reserving up to 6 would split the span",
    ),
    ("append: zero", lambda: c.check_append("a", 0, 4, 4, 4, None, ()), InvalidRequest, ">= 1"),
    (
        "append: str",
        lambda: c.check_append("a", "1", 4, 4, 4, None, ()),  # type: ignore[arg-type]
        InvalidRequest,
        "'1'",
    ),
    (
        "append: prefill limit",
        lambda: c.check_append("a", 3, 4, 2, 10, 4, ()),
        InvalidOperation,
        "kv_token_limit of 4",
    ),
    (
        "commit: count",
        lambda: c.check_commit("a", 0, 4, 4, -1, ()),
        InvalidRequest,
        "num_computed must be an int >= 0",
    ),
    (
        "commit: count before tokens",
        lambda: c.check_commit("a", 0, 4, 4, None, [-1]),
        InvalidRequest,
        "num_computed must be an int",
    ),
    (
        "commit: token out of range",
        lambda: c.check_commit("a", 0, 4, 4, 1, [2**32]),
        InvalidRequest,
        "accepted_tokens",
    ),
    (
        "commit: token not int",
        lambda: c.check_commit("a", 0, 4, 4, 1, (1, "x")),
        InvalidRequest,
        "accepted_tokens",
    ),
    (
        "commit: not a sequence",
        lambda: c.check_commit("a", 0, 4, 4, 1, 5),
        InvalidRequest,
        "accepted_tokens",
    ),
    (
        "commit: past reserved",
        lambda: c.check_commit("a", 2, 4, 9, 3, ()),
        InvalidOperation,
        "cannot commit 5 tokens of 'a': only 4 slots are reserved",
    ),
    (
        "commit: past known",
        lambda: c.check_commit("a", 2, 8, 3, 3, [1]),
        InvalidOperation,
        "cannot commit KV for 5 tokens of 'a': only 4 tokens are known",
    ),
    ("rollback: zero", lambda: c.check_rollback("a", 0, 4, 2, ()), InvalidRequest, ">= 1"),
    (
        "rollback: written",
        lambda: c.check_rollback("a", 3, 5, 3, ()),
        InvalidOperation,
        "cannot roll back 3 slots of 'a': only 2 reserved slots are unwritten",
    ),
    (
        "rollback: span",
        lambda: c.check_rollback("a", 3, 9, 2, (IMG,)),
        InvalidOperation,
        "rolling back 3 slots would split",
    ),
    (
        "hybrid: runtime slots",
        lambda: c.check_hybrid_config(4, 0, 1, 0),
        InvalidRequest,
        "max_num_seqs must be an int >= 1",
    ),
    (
        "hybrid: budget",
        lambda: c.check_hybrid_config(4, 1, -1, 0),
        InvalidRequest,
        "state_budget must be an int >= 0",
    ),
    (
        "hybrid: interval",
        lambda: c.check_hybrid_config(4, 1, 1, 6),
        InvalidRequest,
        "multiple of block_size=4, got 6",
    ),
    (
        "experts: one bytes",
        lambda: c.check_routed_experts(b"x", 1),
        InvalidRequest,
        "a list of bytes per block",
    ),
    (
        "experts: count",
        lambda: c.check_routed_experts([b"x"], 2),
        InvalidRequest,
        "has 1 entries; this commit completes 2 blocks",
    ),
    (
        "experts: item",
        lambda: c.check_routed_experts(["x"], 1),
        InvalidRequest,
        "entries must be bytes",
    ),
    (
        "state: runtime slots",
        lambda: c.check_runtime_slots(2, 2),
        OutOfStateSlots,
        "2 sequences are live (max_num_seqs)",
    ),
    (
        "restore: none pending",
        lambda: c.check_restore_pending("a", False),
        InvalidOperation,
        "has no restore pending",
    ),
    (
        "keep: position",
        lambda: c.check_keep_state("a", -1, 0, 0),
        InvalidRequest,
        "position must be an int >= 0",
    ),
    (
        "keep: restore pending",
        lambda: c.check_keep_state("a", 4, None, 4),
        InvalidOperation,
        "has a restore pending",
    ),
    (
        "keep: a draft's state",
        lambda: c.check_keep_state("a", 5, 0, 4),
        InvalidOperation,
        "cannot keep the state after 5 tokens of 'a': only the state after its 4",
    ),
    (
        "keep: a stale state",
        lambda: c.check_keep_state("a", 3, 0, 4),
        InvalidOperation,
        "after 3 tokens",
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_a_bad_input_is_refused_with_its_typed_error(
    call: Callable[[], object], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error) as info:
        call()
    assert type(info.value) is error  # exactly that class, not a sibling or a parent
    assert isinstance(info.value, PrefixCacheError | InvalidConfig)
    assert fragment in str(info.value)


def test_error_values_name_the_cause() -> None:
    """The errors handed back (not raised) carry the same typed class and message."""
    err = c.out_of_blocks(5, 3)
    assert type(err) is OutOfBlocks and "need 5 new blocks; only 3 can be freed" in str(err)
    assert type(c.no_state_slot()) is OutOfStateSlots
    assert "only 4 slots are reserved" in str(c.commit_error("a", 5, 4, 9))
    assert "only 4 tokens are known" in str(c.commit_error("a", 5, 8, 4))


def test_allowed_inputs_pass_and_return_the_new_size() -> None:
    assert c.check_count(0, "n", minimum=0) == 0
    assert c.check_pool_shape(8, 4) == (8, 4)
    assert c.live_seq(LIVE, 7) == 2
    assert c.check_free_list(iter(["a", 7]), LIVE) == ["a", 7]
    assert c.check_free_list([], LIVE) == []
    assert c.check_reset(True, 3) is True and c.check_reset(False, 0) is False
    c.check_continue("a", None, 4, 4, 10)
    c.check_growth("a", 10, 99, 0, 10, 1, (IMG,))  # decode: no prefill rule applies
    c.check_growth("a", 2, 8, 2, 10, 6, (IMG,))  # up to the span's end, within the limit
    assert c.check_append("a", 2, 4, 4, 4, None, ()) == 6
    tokens = [1, 2]
    accepted, new = c.check_commit("a", 2, 4, 3, 2, tokens)
    assert (list(accepted), new) == ([1, 2], 4)
    assert accepted is tokens  # the fast path hands a valid list back, uncopied
    assert c.check_commit("a", 0, 4, 4, 4, range(7, 8)) == ((7,), 4)  # copied to a tuple
    assert c.check_rollback("a", 2, 5, 3, ()) == 3
    assert c.check_rollback("a", 1, 9, 2, (IMG,)) == 8  # back to the span's end: no cut
    assert c.check_hybrid_config(4, 2, 0, 8) == (2, 0, 8)
    assert c.check_routed_experts(None, 3) is None
    assert c.check_routed_experts([b"x", b"y"], 2) == (b"x", b"y")
    c.check_runtime_slots(1, 2)
    c.check_restore_pending("a", True)
    assert c.check_keep_state("a", 4, 0, 4) == 4


@pytest.mark.parametrize(
    ("tokens", "bs", "blocks"), [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (8, 4, 2), (9, 1, 9)]
)
def test_blocks_for_is_the_ceiling(tokens: int, bs: int, blocks: int) -> None:
    assert c.blocks_for(tokens, bs) == blocks


@pytest.mark.parametrize(
    ("n", "bs", "cap"), [(1, 4, 0), (4, 4, 0), (5, 4, 1), (8, 4, 1), (9, 4, 2)]
)
def test_full_prompt_cap_leaves_a_token_to_compute(n: int, bs: int, cap: int) -> None:
    assert c.full_prompt_cap(n, bs) == cap
    assert cap * bs < n  # choice 4


@pytest.mark.parametrize(
    ("start", "prompt", "budget", "limit", "spans", "end"),
    [
        (0, 10, None, None, (), 10),
        (0, 10, 3, None, (), 3),
        (2, 10, None, 4, (), 6),
        (2, 10, 3, 4, (), 5),
        (0, 10, 6, None, (IMG,), 4),  # ends inside the image: back to its start
        (4, 10, 2, None, (IMG,), 8),  # starts at the image: on to its end
        (0, 10, 8, None, (IMG,), 8),  # ends at the image's end: no cut
    ],
)
def test_chunk_end(
    start: int,
    prompt: int,
    budget: int | None,
    limit: int | None,
    spans: tuple[MultimodalSpan, ...],
    end: int,
) -> None:
    assert c.chunk_end(start, prompt, budget, limit, spans) == end


@pytest.mark.parametrize(
    ("computed", "reserved", "prompt", "interval", "point"),
    [
        (0, 10, 10, 0, 8),  # prefill: the last complete block of the chunk
        (8, 10, 10, 0, 0),  # nothing beyond the computed tokens
        (10, 17, 10, 8, 16),  # decode: the deepest multiple of the interval
        (16, 17, 10, 8, 0),
        (0, 3, 10, 8, 0),  # no complete block yet
        (0, 12, 20, 0, 12),
    ],
)
def test_save_point(computed: int, reserved: int, prompt: int, interval: int, point: int) -> None:
    assert c.save_point(computed, reserved, prompt, 4, interval) == point


@pytest.mark.parametrize(
    ("n", "matched", "window", "attached", "capped", "evicted", "want"),
    [
        (10, 0, 0, 0, False, 0, LostReuse(never_cached=10)),
        (10, 2, 0, 2, False, 0, LostReuse(never_cached=2)),
        (8, 1, 0, 1, True, 0, LostReuse(cap=4)),
        (13, 3, 1, 1, False, 0, LostReuse(window=4, span=4, never_cached=1)),
        (14, 1, 0, 1, False, 2, LostReuse(evicted=8, never_cached=2)),
    ],
)
def test_lost_reuse_adds_up_to_the_prompt(
    n: int, matched: int, window: int, attached: int, capped: bool, evicted: int, want: LostReuse
) -> None:
    lost = c.lost_reuse(n, 4, matched, window, attached, capped, evicted)
    assert lost == want
    assert lost.total + attached * 4 == n  # INV-STATS: every prompt token is accounted for


@pytest.mark.parametrize("counters_type", [SpecCounters, ImplCounters])
def test_count_admission_moves_every_admission_counter(counters_type: type) -> None:
    """The counters of one admission, shared by the spec and the managers (each with its own
    counters record): checked here directly (the differential machines cannot see a bug in a
    shared rule), and by INV-STATS on both caches after every step."""
    counters = counters_type()
    lost = LostReuse(window=4, span=4, cap=0, evicted=8, never_cached=2, checkpoint=1)
    c.count_admission(counters, 30, 11, lost)
    c.count_admission(counters, 5, 0, LostReuse(never_cached=5))
    moved = {
        "admissions": 2,
        "queries": 35,
        "hits": 11,
        "prefill_tokens": 35,
        "prefill_tokens_skipped": 11,
        "prefill_tokens_computed": 24,
        "lost_window": 4,
        "lost_span": 4,
        "lost_cap": 0,
        "lost_evicted": 8,
        "lost_never_cached": 7,
        "lost_checkpoint": 1,
    }
    assert {name: getattr(counters, name) for name in moved} == moved
    assert counters.evictions == counters.blocks_published == 0  # not an admission's


@pytest.mark.parametrize(
    ("cls", "protocol"),
    [
        (SpecCache, PrefixCache),
        (PrefixCacheManager, PrefixCache),
        (HybridSpecCache, HybridPrefixCache),
        (HybridPrefixCacheManager, HybridPrefixCache),
    ],
)
def test_caches_implement_every_protocol_method(cls: type[PrefixCache], protocol: type) -> None:
    """Each cache subclasses its protocol explicitly (its API docs inherit the protocol's
    docstrings), so a method it forgot would silently inherit the protocol's empty body:
    none may."""
    assert protocol in cls.__mro__  # explicitly (issubclass refuses a protocol with properties)
    for name, member in inspect.getmembers(protocol):
        if name.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
            continue
        mine = inspect.getattr_static(cls, name)
        assert mine is not inspect.getattr_static(protocol, name), f"{cls.__name__}.{name}"
        owner = next(k for k in cls.__mro__ if name in vars(k))
        assert not owner.__dict__.get("_is_protocol", False), f"{cls.__name__}.{name} from {owner}"
    assert inspect.getdoc(cls.can_admit) == inspect.getdoc(PrefixCache.can_admit)
