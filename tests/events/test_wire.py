"""The vLLM-facing renderings of prefixkv's identity: salts, image identifiers, extra keys."""

from __future__ import annotations

import pytest

pytest.importorskip("msgspec")

from prefixkv.spec import BlockStored, MultimodalSpan

from prefixkv.events.wire import (
    WireError,
    as_format,
    mm_hash,
    mm_identifier,
    salt_key,
    vllm_extra_keys,
)


def test_salts_render_as_text_injectively() -> None:
    salts = [b"tenant-7", b"", b"hex:", b"hex:ab", b"\xff\x00", b"\xc3\xa9t\xc3\xa9"]
    rendered = [salt_key(s) for s in salts]
    assert rendered[0] == "tenant-7" and rendered[5] == "été"
    assert rendered[1] == "hex:" and rendered[4] == "hex:ff00"
    assert all(isinstance(r, str) and r for r in rendered)  # never bin, never empty
    assert len(set(rendered)) == len(salts)


def test_image_identifier_has_the_shape_of_vllm_hashes() -> None:
    key = MultimodalSpan(0, 4, "image", b"\x01" * 8).key()
    ident = mm_identifier(key)
    assert len(ident) == 64 and ident == ident.lower() and int(ident, 16) >= 0
    assert mm_hash(key) == int(ident[:16], 16) < 1 << 64
    assert mm_identifier(MultimodalSpan(0, 5, "image", b"\x01" * 8).key()) != ident


def test_extra_keys_follow_vllms_layout() -> None:
    img = MultimodalSpan(2, 7, "image", b"\x07" * 8).key()
    first = BlockStored(
        (1, 2), None, tuple(range(8)), 4, "m", "lora-a", b"t", (((2, img),), ((-2, img),))
    )
    assert vllm_extra_keys(first) == [
        ("lora-a", (mm_identifier(img), 2), "t"),  # adapter, image, salt (first block only)
        ("lora-a", (mm_identifier(img), -2)),
    ]
    child = first._replace(parent_block_hash=9, adapter=None, extra_keys=((), ()))
    assert vllm_extra_keys(child) == [None, None]  # the salt sits in a sequence's first block


def test_unknown_format_is_a_typed_error() -> None:
    assert as_format("vllm-0.20").value == "vllm-0.20"
    with pytest.raises(WireError, match=r"vllm-0\.33, vllm-0\.20"):
        as_format("vllm-0.19")


@pytest.mark.parametrize("fmt", ["vllm-0.33", "vllm-0.20"])
def test_an_image_is_hashed_once_per_event_on_each_side(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image spanning two blocks: its identifier (a SHA-256) is computed once when the
    event is encoded and once when it is decoded, not per block and per field."""
    from prefixkv.events import wire

    img = MultimodalSpan(2, 7, "image", b"\x07" * 8).key()
    event = BlockStored(
        (1, 2), None, tuple(range(8)), 4, "m", "lora-a", b"t", (((2, img),), ((-2, img),))
    )
    calls: list[bytes] = []
    real = wire.mm_identifier

    def counted(content: bytes) -> str:
        calls.append(content)
        return real(content)

    monkeypatch.setattr(wire, "mm_identifier", counted)
    payload = wire.encode_batch([event], wire_format=fmt)
    assert calls == [img]
    assert wire.decode_batch(payload, wire_format=fmt) == [event]
    assert calls == [img, img]
