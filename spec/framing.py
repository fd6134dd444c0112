"""Length-prefixed framing: the one byte encoding behind every injective key.

A namespace key, a multimodal span's key, the extra keys of a block, the canonical bytes
that :func:`~.identity.sha256_hash` digests and the cache-off salt of the reference
scheduler are all sequences of fields. Concatenating the fields as they are is not
injective (``"ab" + "c" == "a" + "bc"``), so each variable-length field is written as a
*frame*: its length in :data:`LENGTH_BYTES` big-endian bytes, then the bytes themselves.
Integers are written at a fixed width (:func:`u64`, :func:`i64`), so they need no prefix.

NOTE: the injectivity argument, once. A frame is self-delimiting: :func:`read_frame` reads
it back from any buffer that starts with it and says where it ends, whatever follows. So a
sequence of frames and fixed-width integers, read in the same order, decodes to exactly the
fields it was written from: two different field sequences of the same layout cannot
produce the same bytes. ``tests/spec/test_framing.py`` checks the round trip on arbitrary
fields, and :meth:`~.namespace.Namespace.from_key` decodes namespace keys with
:func:`read_frame`, which is the same argument run on every key it reads.
"""

from __future__ import annotations

__all__ = ["LENGTH_BYTES", "FramingError", "frame", "i64", "read_frame", "read_u64", "u64"]

#: Width of a frame's length prefix and of a fixed-width integer.
LENGTH_BYTES = 8


class FramingError(ValueError):
    """Bytes that no framing writes: a truncated frame or integer.

    A plain ``ValueError``: callers that decode user input (``Namespace.from_key``) turn it
    into their own typed error.
    """


def u64(value: int) -> bytes:
    """``value`` (0 <= value < 2**64) as 8 big-endian bytes."""
    return value.to_bytes(LENGTH_BYTES, "big")


def i64(value: int) -> bytes:
    """``value`` (a signed 64-bit int) as 8 big-endian two's-complement bytes."""
    return value.to_bytes(LENGTH_BYTES, "big", signed=True)


def frame(data: bytes) -> bytes:
    """``data`` framed: its length (:func:`u64`), then the bytes."""
    return u64(len(data)) + data


def read_u64(buf: bytes, pos: int) -> tuple[int, int]:
    """The :func:`u64` at ``buf[pos:]``, and the position after it."""
    end = pos + LENGTH_BYTES
    if pos < 0 or end > len(buf):
        raise FramingError(f"no 8-byte integer at offset {pos} of {len(buf)} bytes")
    return int.from_bytes(buf[pos:end], "big"), end


def read_frame(buf: bytes, pos: int = 0) -> tuple[bytes, int]:
    """The frame at ``buf[pos:]``: its bytes, and the position after it (the inverse of
    :func:`frame`, whatever follows the frame in ``buf``)."""
    n, start = read_u64(buf, pos)
    end = start + n
    if end > len(buf):
        raise FramingError(f"a frame of {n} bytes at offset {pos} runs past {len(buf)} bytes")
    return buf[start:end], end
