"""What a failed check raises, and who hears about it first.

Hypothesis-free, so that :class:`~prefixkv.conformance.lockstep.Lockstep` can run in any
harness. A check is named by an id such as ``INV-REF``, ``CAN-APPEND`` or
``CRASH(reset_flag)``; :func:`check_family` strips the parenthesised detail, so that
``--prefixkv-ignore=CRASH`` silences every crash and ``CRASH(reset_flag)`` only one.

One check can fail for several root causes (INV-PUBLISH for a wrong parent, and for a
block published before its KV is written), so a failure is also keyed by its *failure
class*: :func:`fingerprint` of the check, the operation it failed after, and the shape of
its message (the message with its numbers, ids and token runs blanked). The fingerprint is
stable across runs, block sizes and pool sizes, and ``ignore`` takes it as well as a check.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Collection

__all__ = [
    "CheckFailed",
    "check_family",
    "failure_listeners",
    "fingerprint",
    "is_ignored",
    "message_shape",
]

#: Numbers, quoted ids and the lists they fill, blanked by :func:`message_shape`.
_QUOTED = re.compile(r"b?'[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"(?<![\w-])-?\d+(?:\.\d+)?")
_SERIES = re.compile(r"N(?:[,\s]+N)+,?")
#: A sequence id of a subclassed or enum kind, as the machines draw them: ``EnumId(N)``.
_WRAPPED = re.compile(r"\b[A-Z]\w*\(N\)")

#: Called with every :class:`CheckFailed` as it is raised (the runner records the time of
#: the first failure here, before Hypothesis starts shrinking).
failure_listeners: list[Callable[[CheckFailed], None]] = []


def message_shape(message: str) -> str:
    """The first line of ``message`` with every number, quoted id and list of them blanked
    to ``N``: ``"block 3 (#1 of 'a') has the wrong parent 2"`` and ``"block 7 (#2 of 0) has
    the wrong parent 5"`` have one shape, and so has ``"... (#1 of SubclassedIntId(3)) ..."``
    (an id of any kind is an id). A message that says the same thing of several blocks,
    clause after clause (``"hits block 0 ...; hits block 1 ..."``), has the shape of one."""
    head = message.split("\n", 1)[0]
    head = _SERIES.sub("N...", _WRAPPED.sub("N", _NUMBER.sub("N", _QUOTED.sub("N", head))))
    return "; ".join(dict.fromkeys(head.split("; ")))


def fingerprint(check: str, operation: str, message: str) -> str:
    """The failure class: ``CHECK#xxxxxxxx``, a hash of the check, the operation it failed
    after and the message's shape (:func:`message_shape`)."""
    key = f"{check}\n{operation}\n{message_shape(message)}".encode()
    return f"{check}#{hashlib.sha256(key).hexdigest()[:8]}"


class CheckFailed(AssertionError):
    """A differential or invariant check failed. ``check`` names it, e.g. ``INV-REF``;
    ``operation`` is the operation it failed at (``""`` when not one), ``fingerprint`` the
    failure class (:func:`fingerprint`), and ``after`` the failure classes the run looked
    past before this one (ignored ones: the likely root causes of this failure)."""

    def __init__(
        self, check: str, message: str, *, operation: str = "", after: tuple[str, ...] = ()
    ) -> None:
        self.check = check
        self.detail = message
        self.operation = operation
        self.fingerprint = fingerprint(check, operation, message)
        self.after = after
        super().__init__(f"[{check}] {message}")
        for listener in failure_listeners:
            listener(self)


def check_family(check: str) -> str:
    """``"CRASH(reset_flag)"`` -> ``"CRASH"``; ``"SPEC:INV-REF"`` stays as it is."""
    return check.split("(", 1)[0]


def is_ignored(check: str, ignored: Collection[str], fingerprint: str | None = None) -> bool:
    """Whether ``check`` is ignored by name, by family or (given) by its failure class."""
    return (
        check in ignored
        or check_family(check) in ignored
        or (fingerprint is not None and fingerprint in ignored)
    )
