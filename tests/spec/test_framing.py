"""The length-prefixed framing (``prefixkv.spec.framing``) and the keys built on it.

The injectivity of every key (namespace, multimodal span, extra keys, the sha256 input,
the cache-off salt) rests on one fact: a frame reads back from any buffer that starts with
it, whatever follows. These tests check that fact, then that the keys decode or differ as
that argument says.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from prefixkv.spec import InvalidRequest, MultimodalSpan, Namespace
from prefixkv.spec.framing import (
    LENGTH_BYTES,
    FramingError,
    frame,
    i64,
    read_frame,
    read_u64,
    u64,
)
from prefixkv.spec.identity import sha256_hash

from prefixkv.engine.scheduler import _off_namespace

fields = st.lists(st.binary(max_size=40), max_size=6)


@given(fields, st.binary(max_size=20))
def test_frames_read_back_whatever_follows(xs: list[bytes], tail: bytes) -> None:
    buf = b"".join(frame(x) for x in xs) + tail
    pos, out = 0, []
    for _ in xs:
        data, pos = read_frame(buf, pos)
        out.append(data)
    assert out == xs
    assert buf[pos:] == tail


@given(fields, fields)
@example([b"ab", b"c"], [b"a", b"bc"])
@example([b"", b"x"], [b"x", b""])
def test_framed_sequences_are_injective(xs: list[bytes], ys: list[bytes]) -> None:
    # what plain concatenation gets wrong: ["ab", "c"] and ["a", "bc"]
    if len(xs) == len(ys) and xs != ys:
        assert b"".join(map(frame, xs)) != b"".join(map(frame, ys))


def test_plain_concatenation_would_collide() -> None:
    # the case the framing exists for: without it these two field lists are one key
    assert b"ab" + b"c" == b"a" + b"bc"
    assert frame(b"ab") + frame(b"c") != frame(b"a") + frame(b"bc")


@given(st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1))
def test_fixed_width_integers(u: int, i: int) -> None:
    assert len(u64(u)) == len(i64(i)) == LENGTH_BYTES
    assert read_u64(u64(u), 0) == (u, LENGTH_BYTES)
    assert int.from_bytes(i64(i), "big", signed=True) == i


@pytest.mark.parametrize(
    "buf",
    [b"", b"\x00" * 7, u64(5) + b"abcd", u64(2**40)],
    ids=["empty", "short-length", "short-frame", "huge-length"],
)
def test_truncated_frames_are_refused(buf: bytes) -> None:
    with pytest.raises(FramingError):
        read_frame(buf, 0)
    assert issubclass(FramingError, ValueError)


names = st.text(min_size=1, max_size=8)
namespaces = st.builds(
    Namespace, names, st.none() | st.text(max_size=8), st.none() | st.binary(max_size=8)
)


@given(namespaces, namespaces)
def test_namespace_keys_decode_so_they_are_injective(a: Namespace, b: Namespace) -> None:
    # from_key reads the frames back: equal keys would decode to one namespace
    assert Namespace.from_key(a.key()) == a
    assert (a.key() == b.key()) == (a == b)


def test_namespace_key_is_tagged_frames() -> None:
    ns = Namespace("m", None, b"s")
    assert ns.key() == b"pkv-ns-v1" + b"\x01" + frame(b"m") + b"\x00" + b"\x02" + frame(b"s")
    with pytest.raises(InvalidRequest, match="not a namespace key"):
        Namespace.from_key(ns.key()[:-1])  # the salt's frame runs past the end


@given(st.text(min_size=1, max_size=6), st.binary(min_size=1, max_size=6), st.integers(1, 9))
def test_span_keys_frame_their_fields(modality: str, content: bytes, length: int) -> None:
    span = MultimodalSpan(0, length, modality, content)
    key = span.key()
    got_modality, pos = read_frame(key)
    got_length, pos = read_u64(key, pos)
    got_content, pos = read_frame(key, pos)
    assert (got_modality.decode(), got_length, got_content, pos) == (
        modality,
        length,
        content,
        len(key),
    )


def test_sha256_input_frames_the_namespace() -> None:
    # unframed, the namespace would swallow the token count and the first two tokens:
    # b"ns" | count 4 | 1 | 2 | 0 | 0  ==  b"ns" + count 4 + 1 + 2 | count 0
    tokens = b"".join(t.to_bytes(4, "big") for t in (1, 2))
    a = sha256_hash(None, b"ns" + u64(4) + tokens, (), ())
    b = sha256_hash(None, b"ns", (1, 2, 0, 0), ())
    assert a != b


def test_cache_off_salts_are_distinct() -> None:
    base = Namespace("m", None, b"x")
    salts = {
        _off_namespace(base, rid, attempt).salt
        for rid, attempt in [("a", 12), ("a1", 2), ("a", 1), ("a1", 12)]
    }
    assert len(salts) == 4
    assert _off_namespace(Namespace("m"), "a", 0) != _off_namespace(
        Namespace("m", None, b""), "a", 0
    )
