"""Requests: what an engine asks the cache to admit."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import TypeAlias

import attrs

from .errors import InvalidRequest
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


@attrs.frozen
class Request:
    """A prompt to admit as sequence ``seq_id``.

    The prompt is validated on construction; an invalid one raises
    :class:`~prefixkv.spec.errors.InvalidRequest` before it can reach any cache.
    """

    seq_id: SeqId = attrs.field(validator=_check_seq)
    token_ids: tuple[int, ...] = attrs.field(converter=_to_tokens)
    namespace: Namespace = attrs.field(validator=_check_namespace)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
