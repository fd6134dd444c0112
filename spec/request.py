"""Requests: what an engine asks the cache to admit."""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from operator import countOf
from typing import Any, TypeAlias

import attrs

from prefixkv.errors import require_int

from .errors import InvalidRequest
from .multimodal import MultimodalSpan
from .namespace import Namespace

__all__ = [
    "MAX_TOKEN_ID",
    "Prompt",
    "Request",
    "SeqId",
    "check_seq_id",
    "token_buffer",
    "token_tuple",
]

#: Sequence ids are ints or strs, as engines use either.
SeqId: TypeAlias = int | str

#: Token ids are unsigned 32-bit integers.
MAX_TOKEN_ID = 2**32 - 1


#: ``array`` type codes of integer elements.
_INT_CODES = frozenset("bBhHiIlLqQ")

# NOTE: a prompt is kept as native uint32 bytes, ``array('I')``'s own layout (checked here
# rather than assumed): 4 bytes per token id on every platform CPython supports.
assert array("I").itemsize == 4, "array('I') must hold 32-bit token ids"
#: Where the low byte of a native uint32 sits within its 4 bytes.
_LOW_BYTE = 0 if sys.byteorder == "little" else 3
#: Candidates for bools a prompt may hold before the check scans every element instead.
_BOOL_PROBES = 64


def _bad(what: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{what} must be a sequence of ints in [0, 2**32): {why}")


def _checked(seq: Any, what: str) -> array[int]:
    """``seq`` as ``array('I')``: C checks that every element is an int in range.

    NOTE: ``fromlist`` converts a list a third faster than the ``array`` constructor.
    """
    try:
        if type(seq) is not list:
            return array("I", seq)
        checked: array[int] = array("I")
        checked.fromlist(seq)
    except (TypeError, OverflowError, ValueError) as exc:
        raise _bad(what, str(exc)) from None
    return checked


def _holds_bool(seq: Any, checked: array[int], data: bytes) -> bool:
    """Whether ``seq`` holds a bool, given ``checked``, its ``array('I')`` (bytes ``data``).

    ``array('I')`` takes ``True`` and ``False`` as 1 and 0, so only an element of value 0
    or 1 can be one, and such an element has a low byte of 0 or 1. Those bytes are found
    with ``bytes.find`` (memchr) over the low bytes, and only those elements are looked at.
    NOTE: this replaces a type check of every element, which cost twice the conversion.
    """
    lows = data[_LOW_BYTE::4]
    probes = 0
    for value in (0, 1):
        i = lows.find(value)
        while i >= 0:
            if checked[i] == value and type(seq[i]) is bool:
                return True
            probes += 1
            if probes > _BOOL_PROBES:  # a prompt of many such ids: one scan of every type
                return bool in set(map(type, seq))
            i = lows.find(value, i + 1)
    return False


def _from_ndarray(value: Any, what: str) -> bytes:
    """A numpy-like integer array (duck-typed: spec imports no numpy), checked with
    vectorised reductions and converted in one ``astype``: no Python int per element.

    A masked array is refused: its masked elements have no token id (``tobytes`` would
    put the fill value, 999999 by default, in their place). An array-like that lacks part
    of numpy's surface, or whose conversion is not 4 bytes per element, is refused too.
    """
    if hasattr(value, "mask") and hasattr(value, "fill_value"):
        raise _bad(what, "a masked array (pass .compressed() or .filled(token) instead)")
    kind = getattr(value.dtype, "kind", None)
    if kind not in ("i", "u"):  # 'b' is bool, 'f' float, 'O' object, ...
        raise _bad(what, f"an array of dtype {value.dtype}")
    if value.ndim != 1:
        raise _bad(what, f"a {value.ndim}-D array")
    try:
        size = int(value.size)
        in_range = not size or (int(value.min()) >= 0 and int(value.max()) <= MAX_TOKEN_ID)
        data = value.astype("uint32", copy=False).tobytes() if in_range else b""
    except (AttributeError, TypeError, ValueError) as exc:
        raise _bad(what, f"a {type(value).__name__} that is no numpy array ({exc})") from None
    if not in_range:
        raise _bad(what, "an element is out of range")
    if type(data) is not bytes or len(data) != 4 * size:
        raise _bad(what, f"a {type(value).__name__} whose tobytes() is not 4 bytes per id")
    return data


def _from_tensor(value: Any, what: str) -> bytes:
    """A torch tensor (duck-typed: spec never imports torch): CPU only, integer dtype."""
    if getattr(value.device, "type", None) != "cpu":
        raise _bad(what, f"a tensor on {value.device} (copy it to the host first)")
    if value.dtype.is_floating_point or value.dtype.is_complex or "bool" in str(value.dtype):
        raise _bad(what, f"a tensor of dtype {value.dtype}")
    try:
        host = value.detach().numpy()  # a view of the same memory, no copy
    except (TypeError, RuntimeError) as exc:
        raise _bad(what, f"a tensor of dtype {value.dtype} ({exc})") from None
    return _from_ndarray(host, what)


def token_buffer(
    token_ids: object, *, what: str = "token_ids"
) -> tuple[bytes, tuple[int, ...] | None]:
    """Validate token ids in one pass: their native uint32 bytes, and the tuple of ints when
    the caller's own tuple can be kept as it is (else None: :class:`Prompt` makes it).

    Accepted: a list or tuple of ints, any other sequence of ints (``range``), an integer
    ``array.array``, a 1-D integer numpy array, a 1-D integer CPU torch tensor. Int-likes
    (numpy scalars) become ints.
    Refused with :class:`InvalidRequest`: sets and mappings (no order, so no identity),
    strings and bytes, bools and bool arrays, floats, negatives, ids past ``2**32 - 1``,
    multi-dimensional arrays, device tensors, and iterators (a prompt is read more than once).

    NOTE: ``array('I', ...)`` does the range and type check in C, and its bytes are the copy
    that is kept: validating a 2,000-token prompt element by element in Python would cost
    more than admitting it. A tuple of plain ints is kept as it is: no copy at all.
    """
    kind = type(token_ids)
    if kind is list:
        seq: Any = token_ids
    elif kind is tuple:
        checked = _checked(token_ids, what)
        data = checked.tobytes()
        assert isinstance(token_ids, tuple)
        # The caller's tuple is kept only if it holds plain ints and nothing else.
        if countOf(map(type, token_ids), int) == len(token_ids):
            return data, token_ids
        if any(type(t) is bool for t in token_ids):
            raise _bad(what, "bools are not token ids")
        return data, None  # numpy scalars and other int-likes become ints
    elif isinstance(token_ids, array):
        if token_ids.typecode not in _INT_CODES:
            raise _bad(what, f"an array('{token_ids.typecode}')")
        if token_ids.typecode == "I":
            return token_ids.tobytes(), None
        return _checked(token_ids, what).tobytes(), None
    elif hasattr(token_ids, "dtype") and hasattr(token_ids, "ndim"):
        if hasattr(token_ids, "device") and hasattr(token_ids, "detach"):
            return _from_tensor(token_ids, what), None
        return _from_ndarray(token_ids, what), None
    elif isinstance(token_ids, (str, bytes, bytearray, memoryview)):
        raise _bad(what, f"got {kind.__name__}")
    elif isinstance(token_ids, (AbstractSet, Mapping)):
        raise _bad(what, f"a {kind.__name__} has no order")
    elif isinstance(token_ids, Sequence):
        seq = tuple(token_ids)
    else:
        raise _bad(what, f"got {kind.__name__}, not a sequence")
    checked = _checked(seq, what)
    data = checked.tobytes()
    if _holds_bool(seq, checked, data):
        raise _bad(what, "bools are not token ids")
    return data, None


def _ids_of(data: bytes) -> tuple[int, ...]:
    ids: array[int] = array("I")
    ids.frombytes(data)
    return tuple(ids)


def token_tuple(token_ids: object, *, what: str = "token_ids") -> tuple[int, ...]:
    """Validate token ids (see :func:`token_buffer`) and freeze them into one tuple of ints."""
    data, ids = token_buffer(token_ids, what=what)
    return _ids_of(data) if ids is None else ids


class Prompt:
    """A validated prompt: its token ids as native uint32 bytes (the one copy a request
    keeps), and as a tuple of ints, made from the bytes on first use.

    NOTE: a cache manager hashes and compares the bytes, block by block, and never needs a
    Python int per token; the executable spec reads the tuple. Equal prompts have equal
    bytes, so equality and hashing use the bytes alone.
    """

    __slots__ = ("_ids", "data")

    def __init__(self, data: bytes, ids: tuple[int, ...] | None = None) -> None:
        self.data = data
        self._ids = ids

    @property
    def ids(self) -> tuple[int, ...]:
        ids = self._ids
        if ids is None:
            ids = self._ids = _ids_of(self.data)
        return ids

    def __len__(self) -> int:
        return len(self.data) >> 2

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Prompt):
            return NotImplemented
        return self.data == other.data

    def __hash__(self) -> int:
        return hash(self.data)

    def __repr__(self) -> str:
        return repr(self.ids)


def check_seq_id(seq_id: object) -> SeqId:
    if isinstance(seq_id, bool) or not isinstance(seq_id, (int, str)):
        raise InvalidRequest(f"seq_id must be an int or a str, got {seq_id!r}")
    return seq_id


def _to_prompt(value: object) -> Prompt:
    if type(value) is Prompt:  # a request's own prompt (``attrs.evolve``): already checked
        return value
    data, ids = token_buffer(value)
    if not data:
        raise InvalidRequest("a request needs at least one prompt token")
    return Prompt(data, ids)


def _check_seq(_: object, __: attrs.Attribute[SeqId], value: object) -> None:
    check_seq_id(value)


def _check_namespace(_: object, __: attrs.Attribute[Namespace], value: object) -> None:
    if not isinstance(value, Namespace):
        raise InvalidRequest(f"namespace must be a Namespace, got {value!r}")


def _to_spans(value: object) -> tuple[MultimodalSpan, ...]:
    if value == () and type(value) is tuple:  # text: skip the ABC check below
        return ()
    if isinstance(value, MultimodalSpan):
        raise InvalidRequest("spans must be a sequence of MultimodalSpan, not a single span")
    if not isinstance(value, Iterable):
        raise InvalidRequest(f"spans must be a sequence of MultimodalSpan, got {value!r}")
    checked: list[MultimodalSpan] = []
    for span in value:
        if not isinstance(span, MultimodalSpan):
            raise InvalidRequest(f"spans must hold MultimodalSpan objects, got {span!r}")
        checked.append(span)
    return tuple(checked)


def _check_recompute(_: object, __: attrs.Attribute[int], value: object) -> None:
    require_int(value, "recompute_blocks", minimum=0, error=InvalidRequest)


def _check_limit(_: object, __: attrs.Attribute[int | None], value: object) -> None:
    if value is not None:
        require_int(value, "kv_token_limit (or None)", minimum=1, error=InvalidRequest)


@attrs.frozen
class Request:
    """A prompt to admit as sequence ``seq_id``.

    The prompt is validated on construction; an invalid one raises
    :class:`~prefixkv.spec.errors.InvalidRequest` before it can reach any cache.

    * ``spans``: multimodal items (or prompt embeddings), sorted, non-overlapping, inside the
      prompt. They enter block identities and clamp matches (choice 5).
    * ``recompute_blocks``: the last ``k`` matched blocks are recomputed into fresh private
      blocks (speculative decoding / MTP needs their hidden states; choice 6).
    * ``kv_token_limit``: prefill in chunks of at most this many tokens (choice 8). A span
      must fit in one chunk, so no span may be longer than the limit.
    """

    seq_id: SeqId = attrs.field(validator=_check_seq)
    #: The prompt, validated once; ``token_ids`` and ``token_bytes`` read it.
    prompt: Prompt = attrs.field(alias="token_ids", converter=_to_prompt)
    namespace: Namespace = attrs.field(validator=_check_namespace)
    spans: tuple[MultimodalSpan, ...] = attrs.field(default=(), converter=_to_spans)
    recompute_blocks: int = attrs.field(default=0, validator=_check_recompute)
    kv_token_limit: int | None = attrs.field(default=None, validator=_check_limit)

    def __attrs_post_init__(self) -> None:
        previous_end = 0
        for span in self.spans:
            if span.start < previous_end:
                raise InvalidRequest(f"spans overlap or are unsorted at {span!r}")
            if span.end > len(self.prompt):
                raise InvalidRequest(f"span {span!r} ends past the prompt")
            if self.kv_token_limit is not None and span.length > self.kv_token_limit:
                raise InvalidRequest(
                    f"span {span!r} is longer than kv_token_limit={self.kv_token_limit}: "
                    "a span must fit in one prefill chunk"
                )
            previous_end = span.end

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The prompt's token ids (plain ints)."""
        return self.prompt.ids

    @property
    def token_bytes(self) -> bytes:
        """The prompt's token ids as native uint32 bytes (``array('I')``'s layout)."""
        return self.prompt.data

    @property
    def num_tokens(self) -> int:
        return len(self.prompt.data) >> 2
