"""Typed errors of the prefix cache.

Every error subclasses :class:`PrefixCacheError` *and* the builtin an engine developer would
already catch, so ``except ValueError`` keeps working in code that predates prefixkv.

Every operation that raises one of these leaves the cache exactly as it was, statistics and
pending events included (INV-TXN).
"""

from __future__ import annotations

from prefixkv.errors import PrefixKVError

__all__ = [
    "CacheBusy",
    "DuplicateSequence",
    "InvalidOperation",
    "InvalidRequest",
    "OutOfBlocks",
    "OutOfStateSlots",
    "PrefixCacheError",
    "UnknownSequence",
    "WrongSlotRole",
]


class PrefixCacheError(PrefixKVError):
    """Base class of every error the prefix cache raises on purpose."""


class InvalidRequest(PrefixCacheError, ValueError):
    """A request or an argument is malformed: empty prompt, bad token id, bad count."""


class InvalidOperation(PrefixCacheError, ValueError):
    """The arguments are well-formed but not allowed in the sequence's current state.

    Example: committing more tokens than are reserved, or rolling back computed tokens.
    """


class UnknownSequence(PrefixCacheError, KeyError):
    """The sequence id is not live in this cache."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable.
        return str(self.args[0]) if self.args else "unknown sequence"


class DuplicateSequence(PrefixCacheError, ValueError):
    """A sequence id is admitted twice, or listed twice in one batched call."""


class OutOfBlocks(PrefixCacheError, RuntimeError):
    """Not enough free or evictable blocks; nothing was allocated and nothing evicted."""


class CacheBusy(PrefixCacheError, RuntimeError):
    """A full reset was asked for while sequences are still live."""


class OutOfStateSlots(OutOfBlocks):
    """A hybrid model has no recurrent-state slot for a new sequence.

    NOTE: a subclass of :class:`OutOfBlocks` on purpose: an engine that already backs off
    on ``OutOfBlocks`` (and ``can_admit``, which returns False on it) needs no new path.
    """


class WrongSlotRole(PrefixCacheError, ValueError):
    """A state slot was freed under another role (runtime vs checkpoint) than it holds."""
