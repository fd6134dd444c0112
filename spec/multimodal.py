"""Multimodal spans: images, audio, video frames or prompt embeddings inside a prompt.

A span's placeholder token ids say nothing about its content: two images both become
``<image>`` x 576. What the KV depends on is the content, so every block overlapping a span
carries an *extra key* ``(offset, span key)`` in its identity, where the offset is the span's
start relative to the block's first position and the span key encodes modality, length and
content hash injectively.

::

    positions   0       4       8       12      16          (block_size 4)
    tokens      [t t t t][t I I I][I I I I][I t t t]
    span                    |<-- image, 7 tokens -->|
    extra keys   ()       ((5-4, k),) ((5-8, k),) ((5-12, k),)

A match never ends strictly inside a span (choice 5): the KV of a span's later positions
attends to its earlier ones, so half a span is never a reusable prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .errors import InvalidRequest
from .framing import frame, u64
from .identity import ExtraKey

__all__ = ["MultimodalSpan", "block_extra_keys", "clamp_out_of_spans", "span_containing"]


def _check_bounds(instance: MultimodalSpan, _: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequest(f"span bounds must be non-negative ints, got {value!r}")


def _utf8(what: str, value: str) -> bytes:
    """Encode a name, refusing what has no UTF-8 form (a lone surrogate) with a typed error."""
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"span {what} must be encodable as UTF-8, got {value!r}: {exc.reason}"
        ) from None


def _check_modality(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"span modality must be a non-empty str, got {value!r}")
    _utf8("modality", value)  # key() encodes it on every match


def _to_hash(value: object) -> bytes:
    if isinstance(value, str):
        value = _utf8("content_hash", value)
    if not isinstance(value, bytes) or not value:
        raise InvalidRequest(f"span content_hash must be non-empty bytes or str, got {value!r}")
    return value


@attrs.frozen
class MultimodalSpan:
    """Token positions ``[start, end)`` hold one item of ``modality`` with this content hash."""

    start: int = attrs.field(validator=_check_bounds)
    end: int = attrs.field(validator=_check_bounds)
    modality: str = attrs.field(validator=_check_modality)
    content_hash: bytes = attrs.field(converter=_to_hash)

    def __attrs_post_init__(self) -> None:
        if self.end <= self.start:
            raise InvalidRequest(f"span [{self.start}, {self.end}) is empty")

    @property
    def length(self) -> int:
        return self.end - self.start

    def key(self) -> bytes:
        """Injective: modality and hash are length-prefixed, and the length is included."""
        return frame(self.modality.encode("utf-8")) + u64(self.length) + frame(self.content_hash)


def block_extra_keys(
    spans: Sequence[MultimodalSpan], block_start: int, block_size: int
) -> tuple[ExtraKey, ...]:
    """Extra keys of the block covering ``[block_start, block_start + block_size)``."""
    block_end = block_start + block_size
    return tuple(
        (s.start - block_start, s.key())
        for s in spans
        if s.start < block_end and s.end > block_start
    )


def span_containing(spans: Sequence[MultimodalSpan], position: int) -> MultimodalSpan | None:
    """The span with ``start < position < end`` (a cut at ``position`` would split it)."""
    for s in spans:
        if s.start < position < s.end:
            return s
    return None


def clamp_out_of_spans(num_blocks: int, spans: Sequence[MultimodalSpan], block_size: int) -> int:
    """The largest ``k <= num_blocks`` such that ``k * block_size`` splits no span."""
    while num_blocks:
        cut = span_containing(spans, num_blocks * block_size)
        if cut is None:
            break
        num_blocks = cut.start // block_size
    return num_blocks
