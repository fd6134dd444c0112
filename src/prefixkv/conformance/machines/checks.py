"""Shared plumbing of the machines: the failure type, rule counting, bad-input pacing."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .differential import DifferentialMachine

__all__ = ["CheckFailed", "bad_inputs_due", "counted", "failure_listeners"]

_F = TypeVar("_F", bound=Callable[..., Any])

#: Called with every :class:`CheckFailed` as it is raised (the mutation harness records the
#: time of the first one here, before Hypothesis starts shrinking).
failure_listeners: list[Callable[[CheckFailed], None]] = []


class CheckFailed(AssertionError):
    """A differential or invariant check failed. ``check`` names it, e.g. ``INV-REF``."""

    def __init__(self, check: str, message: str) -> None:
        self.check = check
        super().__init__(f"[{check}] {message}")
        for listener in failure_listeners:
            listener(self)


def counted(fn: _F) -> _F:
    """Count the rule's firings (and firings in which an operation raised)."""
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self: DifferentialMachine, **kwargs: Any) -> Any:
        self._rule_raised = False
        self._since_bad += 1
        try:
            return fn(self, **kwargs)
        finally:
            cls = type(self)
            cls.last_steps += 1
            cov = cls.coverage
            cov.rules[name] += 1
            if self._rule_raised:
                cov.invalid_rules[name] += 1

    return wrapper  # type: ignore[return-value]


def bad_inputs_due(machine: DifferentialMachine) -> bool:
    """At most one bad-input rule in any three consecutive rules, so invalid steps stay rare
    (the first one may fire at once, so minimal replays need no filler steps)."""
    return machine._since_bad >= 3
