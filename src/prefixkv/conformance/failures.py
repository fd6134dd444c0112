"""What a failed check raises, and who hears about it first.

Hypothesis-free, so that :class:`~prefixkv.conformance.lockstep.Lockstep` can run in any
harness. A check is named by an id such as ``INV-REF``, ``CAN-APPEND`` or
``CRASH(reset_flag)``; :func:`check_family` strips the parenthesised detail, so that
``--prefixkv-ignore=CRASH`` silences every crash and ``CRASH(reset_flag)`` only one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

__all__ = ["CheckFailed", "check_family", "failure_listeners", "is_ignored"]

#: Called with every :class:`CheckFailed` as it is raised (the runner records the time of
#: the first failure here, before Hypothesis starts shrinking).
failure_listeners: list[Callable[[CheckFailed], None]] = []


class CheckFailed(AssertionError):
    """A differential or invariant check failed. ``check`` names it, e.g. ``INV-REF``."""

    def __init__(self, check: str, message: str) -> None:
        self.check = check
        self.detail = message
        super().__init__(f"[{check}] {message}")
        for listener in failure_listeners:
            listener(self)


def check_family(check: str) -> str:
    """``"CRASH(reset_flag)"`` -> ``"CRASH"``; ``"SPEC:INV-REF"`` stays as it is."""
    return check.split("(", 1)[0]


def is_ignored(check: str, ignored: Collection[str]) -> bool:
    """Whether ``check`` is ignored by name or by family."""
    return check in ignored or check_family(check) in ignored
