"""Requests: what an engine asks the cache to admit."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import TypeAlias

import attrs

from .errors import InvalidRequest
from .multimodal import MultimodalSpan
from .namespace import Namespace

__all__ = ["MAX_TOKEN_ID", "Request", "SeqId", "check_seq_id", "token_tuple"]

#: Sequence ids are ints or strs, as engines use either.
SeqId: TypeAlias = int | str

#: Token ids are unsigned 32-bit integers.
MAX_TOKEN_ID = 2**32 - 1


def token_tuple(token_ids: Iterable[int], *, what: str = "token_ids") -> tuple[int, ...]:
    """Validate token ids and freeze them.

    NOTE: ``array('I', ...)`` does the range and type check in C. Validating a 2,000-token
    prompt element by element in Python would cost more than admitting it.
    """
    if isinstance(token_ids, (str, bytes)):
        raise InvalidRequest(f"{what} must be a sequence of ints, got {type(token_ids).__name__}")
    try:
        checked = array("I", token_ids)
    except (TypeError, OverflowError, ValueError) as exc:
        raise InvalidRequest(f"{what} must be ints in [0, 2**32): {exc}") from None
    return tuple(checked)


def check_seq_id(seq_id: object) -> SeqId:
    if isinstance(seq_id, bool) or not isinstance(seq_id, (int, str)):
        raise InvalidRequest(f"seq_id must be an int or a str, got {seq_id!r}")
    return seq_id


def _to_tokens(value: Iterable[int]) -> tuple[int, ...]:
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
