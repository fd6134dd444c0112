"""Requests: what an engine asks the cache to admit."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from operator import countOf
from typing import Any, TypeAlias

import attrs

from .errors import InvalidRequest
from .multimodal import MultimodalSpan
from .namespace import Namespace

__all__ = ["MAX_TOKEN_ID", "Request", "SeqId", "check_seq_id", "token_tuple"]

#: Sequence ids are ints or strs, as engines use either.
SeqId: TypeAlias = int | str

#: Token ids are unsigned 32-bit integers.
MAX_TOKEN_ID = 2**32 - 1


#: ``array`` type codes of integer elements, and those that can hold a negative value.
_INT_CODES = frozenset("bBhHiIlLqQ")
_SIGNED_CODES = frozenset("bhilq")


def _bad(what: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{what} must be a sequence of ints in [0, 2**32): {why}")


def _from_ndarray(value: Any, what: str) -> tuple[int, ...]:
    """A numpy-like integer array (duck-typed: spec imports no numpy), checked with
    vectorised reductions and converted in one ``tolist``."""
    kind = getattr(value.dtype, "kind", None)
    if kind not in ("i", "u"):  # 'b' is bool, 'f' float, 'O' object, ...
        raise _bad(what, f"an array of dtype {value.dtype}")
    if value.ndim != 1:
        raise _bad(what, f"a {value.ndim}-D array")
    if value.size and (int(value.min()) < 0 or int(value.max()) > MAX_TOKEN_ID):
        raise _bad(what, "an element is out of range")
    return tuple(value.tolist())


def _from_tensor(value: Any, what: str) -> tuple[int, ...]:
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


def token_tuple(token_ids: object, *, what: str = "token_ids") -> tuple[int, ...]:
    """Validate token ids and freeze them into one read-only tuple, in one pass.

    Accepted: a list or tuple of ints, any other sequence of ints (``range``), an integer
    ``array.array``, a 1-D integer numpy array, a 1-D integer CPU torch tensor.
    Refused with :class:`InvalidRequest`: sets and mappings (no order, so no identity),
    strings and bytes, bools and bool arrays, floats, negatives, ids past ``2**32 - 1``,
    multi-dimensional arrays, device tensors, and iterators (a prompt is read more than once).

    NOTE: ``array('I', ...)`` does the range and type check in C. Validating a 2,000-token
    prompt element by element in Python would cost more than admitting it. A tuple of plain
    ints is kept as it is: no copy at all.
    """
    kind = type(token_ids)
    if kind is tuple or kind is list:
        seq: Any = token_ids
    elif isinstance(token_ids, array):
        if token_ids.typecode not in _INT_CODES:
            raise _bad(what, f"an array('{token_ids.typecode}')")
        if token_ids and (
            (token_ids.typecode in _SIGNED_CODES and min(token_ids) < 0)
            or (token_ids.itemsize > 4 and max(token_ids) > MAX_TOKEN_ID)
        ):
            raise _bad(what, "an element is out of range")
        return tuple(token_ids)
    elif hasattr(token_ids, "dtype") and hasattr(token_ids, "ndim"):
        if hasattr(token_ids, "device") and hasattr(token_ids, "detach"):
            return _from_tensor(token_ids, what)
        return _from_ndarray(token_ids, what)
    elif isinstance(token_ids, (str, bytes, bytearray, memoryview)):
        raise _bad(what, f"got {kind.__name__}")
    elif isinstance(token_ids, (AbstractSet, Mapping)):
        raise _bad(what, f"a {kind.__name__} has no order")
    elif isinstance(token_ids, Sequence):
        seq = tuple(token_ids)
    else:
        raise _bad(what, f"got {kind.__name__}, not a sequence")
    try:
        checked = array("I", seq)
    except (TypeError, OverflowError, ValueError) as exc:
        raise _bad(what, str(exc)) from None
    # array('I') takes bools and anything with __index__: only plain ints may stay as given.
    if countOf(map(type, seq), int) != len(seq):
        if any(type(t) is bool for t in seq):
            raise _bad(what, "bools are not token ids")
        return tuple(checked)  # numpy scalars and other int-likes become ints
    return seq if type(seq) is tuple else tuple(seq)


def check_seq_id(seq_id: object) -> SeqId:
    if isinstance(seq_id, bool) or not isinstance(seq_id, (int, str)):
        raise InvalidRequest(f"seq_id must be an int or a str, got {seq_id!r}")
    return seq_id


def _to_tokens(value: object) -> tuple[int, ...]:
    tokens = token_tuple(value)
    if not tokens:
        raise InvalidRequest("a request needs at least one prompt token")
    return tokens


def _check_seq(_: object, __: attrs.Attribute[SeqId], value: object) -> None:
    check_seq_id(value)


def _check_namespace(_: object, __: attrs.Attribute[Namespace], value: object) -> None:
    if not isinstance(value, Namespace):
        raise InvalidRequest(f"namespace must be a Namespace, got {value!r}")


def _to_spans(value: object) -> tuple[MultimodalSpan, ...]:
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
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequest(f"recompute_blocks must be an int >= 0, got {value!r}")


def _check_limit(_: object, __: attrs.Attribute[int | None], value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise InvalidRequest(f"kv_token_limit must be None or an int >= 1, got {value!r}")


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
    token_ids: tuple[int, ...] = attrs.field(converter=_to_tokens)
    namespace: Namespace = attrs.field(validator=_check_namespace)
    spans: tuple[MultimodalSpan, ...] = attrs.field(default=(), converter=_to_spans)
    recompute_blocks: int = attrs.field(default=0, validator=_check_recompute)
    kv_token_limit: int | None = attrs.field(default=None, validator=_check_limit)

    def __attrs_post_init__(self) -> None:
        previous_end = 0
        for span in self.spans:
            if span.start < previous_end:
                raise InvalidRequest(f"spans overlap or are unsorted at {span!r}")
            if span.end > len(self.token_ids):
                raise InvalidRequest(f"span {span!r} ends past the prompt")
            if self.kv_token_limit is not None and span.length > self.kv_token_limit:
                raise InvalidRequest(
                    f"span {span!r} is longer than kv_token_limit={self.kv_token_limit}: "
                    "a span must fit in one prefill chunk"
                )
            previous_end = span.end

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
