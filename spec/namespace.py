"""Namespaces: which model, adapter and tenant a block's KV belongs to.

Two requests share KV only when their namespaces are equal. The namespace enters every block
identity through :meth:`Namespace.key`, an injective, length-prefixed byte encoding.

NOTE: plain concatenation is not injective: ``("ab", "c")`` and ``("a", "bc")`` would
collide, and so would a salt that happens to end with an adapter name. Each field is
therefore written as ``tag | frame`` (:func:`.framing.frame`: the length, then the bytes;
the injectivity argument is there), and ``None`` gets a tag of its own so that "no adapter"
never equals the adapter ``""``.
"""

from __future__ import annotations

from functools import lru_cache

import attrs

from .errors import InvalidRequest
from .framing import FramingError, frame, read_frame

__all__ = ["Namespace"]

_TAG_NONE = b"\x00"
_TAG_STR = b"\x01"
_TAG_BYTES = b"\x02"


def _field(value: str | bytes | None) -> bytes:
    if value is None:
        return _TAG_NONE
    if isinstance(value, str):
        return _TAG_STR + frame(value.encode("utf-8"))
    return _TAG_BYTES + frame(value)


def _encodable(what: str, value: str) -> None:
    """A name must be valid Unicode: a lone surrogate (``"m\\ud800"``) has no UTF-8 form.

    Checked at construction, so the error is a typed ``InvalidRequest`` here and never a raw
    ``UnicodeEncodeError`` out of ``match`` or ``admit`` later, when ``key()`` encodes it.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"namespace {what} must be encodable as UTF-8, got {value!r}: {exc.reason}"
        ) from None


def _check_model(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"namespace model must be a non-empty str, got {value!r}")
    _encodable("model", value)


def _check_adapter(_: object, __: attrs.Attribute[str | None], value: object) -> None:
    if value is None:
        return
    if not isinstance(value, str):
        raise InvalidRequest(f"namespace adapter must be a str or None, got {value!r}")
    _encodable("adapter", value)


def _check_salt(_: object, __: attrs.Attribute[bytes | None], value: object) -> None:
    # NOTE: bytes only. A bytearray is mutable (the key would change under the index), and a
    # str salt would need an encoding the caller did not choose.
    if value is not None and not isinstance(value, bytes):
        raise InvalidRequest(f"namespace salt must be bytes or None, got {value!r}")


@attrs.frozen(cache_hash=True)
class Namespace:
    """Model/weights version, LoRA adapter id and tenant salt.

    ``model`` should name the weights version too (``"llama-3-8b@rev2"``): blocks computed
    by different weights must never be shared.
    """

    model: str = attrs.field(validator=_check_model)
    adapter: str | None = attrs.field(default=None, validator=_check_adapter)
    salt: bytes | None = attrs.field(default=None, validator=_check_salt)

    def key(self) -> bytes:
        """The injective encoding used inside block identities."""
        return b"pkv-ns-v1" + _field(self.model) + _field(self.adapter) + _field(self.salt)

    @staticmethod
    def from_key(key: bytes) -> Namespace:
        """The namespace whose :meth:`key` is ``key`` (the encoding is injective).

        Raises :class:`InvalidRequest` on bytes that no namespace encodes to. Cached: a cache
        that emits KV events decodes the few namespaces it serves over and over.
        """
        return _decode(key)


@lru_cache(maxsize=4096)
def _decode(key: bytes) -> Namespace:
    prefix = b"pkv-ns-v1"
    if not isinstance(key, bytes) or not key.startswith(prefix):
        raise InvalidRequest(f"not a namespace key: {key!r}")
    pos, fields = len(prefix), list[str | bytes | None]()
    for _ in range(3):
        tag = key[pos : pos + 1]
        pos += 1
        if tag == _TAG_NONE:
            fields.append(None)
            continue
        if tag not in (_TAG_STR, _TAG_BYTES):
            raise InvalidRequest(f"not a namespace key: {key!r}")
        try:
            data, pos = read_frame(key, pos)
            fields.append(data.decode("utf-8") if tag == _TAG_STR else data)
        except (FramingError, UnicodeDecodeError):
            raise InvalidRequest(f"not a namespace key: {key!r}") from None
    model, adapter, salt = fields
    ns = Namespace(model, adapter, salt)  # type: ignore[arg-type]
    if pos != len(key) or ns.key() != key:
        raise InvalidRequest(f"not a namespace key: {key!r}")
    return ns
