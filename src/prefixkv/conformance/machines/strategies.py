"""Workload strategies for the differential state machines.

The workload is shaped so that the interesting things happen often in a short run:

* prompts are built from a handful of *shared prefixes* cut at any length plus a short suffix
  over a tiny alphabet, so prefix hits, identical prompts (duplicate publications) and
  shared prefixes across many sequences are the common case, not the exception;
* some prefixes repeat one token, so equal token blocks sit at different depths and only
  the parent link tells them apart (a weak hash then collides all the time);
* pools are small (a few blocks of a few tokens), so eviction pressure is constant;
* two or three namespaces that differ in exactly one field (adapter, salt) share tokens.

Every argument a rule draws is a small int, a tuple of ints or a namespace index, so a failing
run prints a short replay that can be pasted and run.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, cast

from hypothesis import strategies as st

from prefixkv.spec import MultimodalSpan, Namespace, SeqId

__all__ = [
    "BAD_ACCEPTED",
    "BAD_COUNTS",
    "BAD_NAMESPACE_ARGS",
    "BAD_REQUEST_ARGS",
    "BAD_SPAN_ARGS",
    "BAD_SPAN_NAMES",
    "CRAFTED_NAMESPACE_PAIRS",
    "ITEM_KINDS",
    "NAMESPACES",
    "NOT_A_REQUEST",
    "PLACEHOLDER",
    "SHARED_PREFIXES",
    "EnumId",
    "RichArgs",
    "SubclassedIntId",
    "SubclassedStrId",
    "budgets",
    "items",
    "kv_token_limits",
    "namespace_ids",
    "prompts",
    "rich_requests",
    "sampled_tokens",
    "seq_id_of",
    "window_sizes",
]

#: The namespaces a run draws from: same model, differing in the adapter or the tenant salt.
NAMESPACES: tuple[Namespace, ...] = (
    Namespace("tiny-llm@1"),
    Namespace("tiny-llm@1", adapter="lora-a"),
    Namespace("tiny-llm@1", salt=b"tenant-1"),
)

#: Prompts start with a cut of one of these. P1 and P2 share their first four tokens; P0 is
#: one token repeated, so its blocks differ only by parent.
SHARED_PREFIXES: tuple[tuple[int, ...], ...] = (
    (7,) * 12,
    (1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4),
    (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12),
    (3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8),
)

#: The alphabet of suffixes and sampled tokens: small, so continuations collide too.
_ALPHABET = st.integers(min_value=1, max_value=4)


def namespace_ids(count: int = len(NAMESPACES)) -> st.SearchStrategy[int]:
    """An index into :data:`NAMESPACES`."""
    return st.integers(min_value=0, max_value=count - 1)


def _join(parts: tuple[tuple[int, ...], int, list[int]]) -> tuple[int, ...]:
    prefix, cut, suffix = parts
    tokens = prefix[:cut] + tuple(suffix)
    return tokens or (1,)


def prompts(max_suffix: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """A non-empty prompt: a cut of a shared prefix, then a few tokens of a tiny alphabet."""
    return st.tuples(
        st.sampled_from(SHARED_PREFIXES),
        st.integers(min_value=0, max_value=12),
        st.lists(_ALPHABET, max_size=max_suffix),
    ).map(_join)


def sampled_tokens(max_size: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """Tokens a step samples (accepted drafts plus the bonus token)."""
    return st.lists(_ALPHABET, min_size=1, max_size=max_size).map(tuple)


def budgets() -> st.SearchStrategy[int | None]:
    """A per-step token budget for admission (``None``: schedule the whole prompt)."""
    return st.none() | st.integers(min_value=1, max_value=8)


#: Counts no operation accepts as a count (0 is rejected where the minimum is 1 only).
BAD_COUNTS: tuple[object, ...] = (0, -1, -7, True, False, 1.5, "2", None)

#: ``accepted_tokens`` values that are not token ids.
BAD_ACCEPTED: tuple[object, ...] = ((-1,), (2**32,), (1.5,), ("a",), "ab", (1, None), 7)

#: Keyword arguments of ``Request`` that must raise ``InvalidRequest`` on construction.
BAD_REQUEST_ARGS: tuple[dict[str, object], ...] = (
    {"token_ids": ()},
    {"token_ids": (-1, 2)},
    {"token_ids": (1, 2**32)},
    {"token_ids": (1.0, 2)},
    {"token_ids": ("a",)},
    {"token_ids": "abc"},
    {"token_ids": (1, None)},
    {"seq_id": True},
    {"seq_id": 1.5},
    {"seq_id": None},
    {"namespace": "tiny-llm@1"},
)

#: Keyword arguments of ``Namespace`` that must raise ``InvalidRequest`` on construction:
#: wrong types, and names with no UTF-8 form (a lone surrogate), which ``key()`` could not
#: encode later.
BAD_NAMESPACE_ARGS: tuple[dict[str, object], ...] = (
    {"model": ""},
    {"model": 3},
    {"model": "m\ud800"},
    {"model": "m", "adapter": b"x"},
    {"model": "m", "adapter": "lora-\udfff"},
    {"model": "m", "salt": "s"},
    {"model": "m", "salt": bytearray(b"s")},
    {"model": "m", "salt": memoryview(b"s")},
    {"model": "m", "salt": 7},
)

#: ``modality`` and ``content_hash`` of a ``MultimodalSpan`` that must raise
#: ``InvalidRequest`` on construction because they have no UTF-8 form.
BAD_SPAN_NAMES: tuple[dict[str, object], ...] = (
    {"modality": "image\ud800", "content_hash": b"cat"},
    {"modality": "image", "content_hash": "cat\udc80"},
)

#: Pairs of namespaces whose fields concatenate to the same bytes; an injective key keeps
#: them apart.
CRAFTED_NAMESPACE_PAIRS: tuple[tuple[Namespace, Namespace], ...] = (
    (Namespace("m", adapter="ab", salt=b"c"), Namespace("m", adapter="a", salt=b"bc")),
    (Namespace("ma", adapter="b"), Namespace("m", adapter="ab")),
    (Namespace("m", adapter=None), Namespace("m", adapter="")),
    (Namespace("m", salt=b"x"), Namespace("m", adapter="x")),
    (Namespace("m", salt=None), Namespace("m", salt=b"")),
    (Namespace("m", adapter="a", salt=b"b"), Namespace("m", adapter="a\x02", salt=b"b")),
)

#: Things passed to ``match``/``can_admit``/``admit`` in place of a ``Request``.
NOT_A_REQUEST: tuple[object, ...] = (None, "s1", (1, 2, 3), [1, 2, 3], {"seq_id": 1})


# -- multimodal items, recompute windows, chunking --------------------------------------------

#: Every multimodal item is this placeholder token repeated: equal tokens, and only the
#: content hash in the block's extra keys tells two items apart.
PLACEHOLDER = 9

#: ``(modality, content hash)`` of the items a rule may insert. Items 0 and 1 differ only in
#: content; items 0 and 2 only in modality.
ITEM_KINDS: tuple[tuple[str, bytes], ...] = (
    ("image", b"cat"),
    ("image", b"dog"),
    ("audio", b"cat"),
)


def items(max_items: int = 2) -> st.SearchStrategy[list[tuple[int, int, int]]]:
    """Items to insert into a prompt: ``(position, length, kind index)``."""
    return st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=14),
            st.integers(min_value=1, max_value=4),
            st.integers(min_value=0, max_value=len(ITEM_KINDS) - 1),
        ),
        max_size=max_items,
    )


def window_sizes() -> st.SearchStrategy[int]:
    """``recompute_blocks``: mostly 0, sometimes a window of 1-3 blocks."""
    return st.sampled_from((0, 0, 1, 2, 3))


def kv_token_limits() -> st.SearchStrategy[int | None]:
    """``kv_token_limit``: unlimited or a small chunk size."""
    return st.none() | st.integers(min_value=1, max_value=8)


#: Keyword arguments of ``Request`` (with a 6-token prompt) that must raise
#: ``InvalidRequest``: malformed spans, windows and chunk limits.
BAD_SPAN_ARGS: tuple[dict[str, object], ...] = (
    {"spans": (MultimodalSpan(1, 4, "image", b"a"), MultimodalSpan(3, 5, "image", b"b"))},
    {"spans": (MultimodalSpan(3, 5, "image", b"a"), MultimodalSpan(0, 2, "image", b"b"))},
    {"spans": (MultimodalSpan(4, 7, "image", b"a"),)},
    {"spans": MultimodalSpan(0, 2, "image", b"a")},
    {"spans": ((0, 2),)},
    {"spans": 3},
    {"spans": (MultimodalSpan(0, 4, "image", b"a"),), "kv_token_limit": 3},
    {"recompute_blocks": -1},
    {"recompute_blocks": True},
    {"recompute_blocks": 1.5},
    {"recompute_blocks": None},
    {"kv_token_limit": 0},
    {"kv_token_limit": -2},
    {"kv_token_limit": True},
    {"kv_token_limit": 2.0},
)


#: ``(namespace index, tokens, items, recompute_blocks, kv_token_limit)`` of a request that
#: :func:`machines.features.build_request` builds.
RichArgs = tuple[int, tuple[int, ...], list[tuple[int, int, int]], int, int | None]


def rich_requests() -> st.SearchStrategy[RichArgs]:
    """A multimodal request to build: a prompt with items, a window and a chunk limit."""
    return st.tuples(namespace_ids(), prompts(), items(), window_sizes(), kv_token_limits())


# -- sequence ids --------------------------------------------------------------------------


class SubclassedIntId(int):
    """An ``int`` subclass as a sequence id (equal to, and hashed as, its int)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"SubclassedIntId({int(self)})"


class SubclassedStrId(str):
    """A ``str`` subclass as a sequence id (equal to, and hashed as, its str)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"SubclassedStrId({str(self)!r})"


class _EnumIds(IntEnum):
    """The base of :data:`EnumId`: members print as the call that looks them up."""

    def __repr__(self) -> str:
        return f"EnumId({self.value})"


#: ``IntEnum`` members as sequence ids: ``EnumId(n)`` is the member of value ``n``.
EnumId: Any = cast("Any", _EnumIds)("EnumId", [(f"ID{n}", n) for n in range(256)])


def seq_id_of(n: int) -> SeqId:
    """The machines' ``n``-th sequence id: every valid kind of id in turn.

    A plain ``int`` (n % 6 in 0, 1), a ``str`` (2), an ``int`` subclass (3), an ``IntEnum``
    member (4, while ``n`` has one), a ``str`` subclass (5). Each equals the id the machines
    gave before ids of every kind were drawn (``n`` or ``f"r{n}"``), so scripted runs and
    saved examples name the same sequences. A manager that looks a sequence up by the exact
    type of its id (``type(seq_id) is int``) and answers otherwise for any other valid id
    is caught within the first six admissions.
    """
    kind = n % 6
    if kind == 2:
        return f"r{n}"
    if kind == 5:
        return SubclassedStrId(f"r{n}")
    if kind == 3:
        return SubclassedIntId(n)
    if kind == 4 and n < len(EnumId):
        member: int = EnumId(n)
        return member
    return n
