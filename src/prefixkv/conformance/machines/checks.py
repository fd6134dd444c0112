"""Shared plumbing of the machines: rule counting and bad-input pacing.

The failure type lives in :mod:`prefixkv.conformance.failures` (Hypothesis-free); it is
re-exported here for the machines and their tests.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Concatenate, ParamSpec, TypeAlias, TypeVar, cast

from hypothesis.stateful import MultipleResults, multiple

from prefixkv.spec import SeqId

from ..failures import CheckFailed, failure_listeners, is_ignored

if TYPE_CHECKING:
    from .base import MachineBase

__all__ = ["CheckFailed", "Targets", "bad_inputs_due", "counted", "failure_listeners"]

#: What a rule with a target bundle returns: the new sequence, or several (``multiple()``:
#: none).
Targets: TypeAlias = "SeqId | MultipleResults[SeqId]"

_M = TypeVar("_M", bound="MachineBase")
_R = TypeVar("_R")
_P = ParamSpec("_P")


def counted(fn: Callable[Concatenate[_M, _P], _R]) -> Callable[Concatenate[_M, _P], _R]:
    """Count the rule's firings (and firings in which an operation raised).

    A rule ends with a step boundary (``oracle.end_step``); rules that model several
    engine steps close the inner ones themselves. A failure of a check the run ignores ends
    the rule early; the oracle re-reads both
    caches so that the next rule starts from what they really hold.
    """
    name = fn.__name__
    # A rule with a target bundle returns its new entries (``multiple()`` for none); any
    # other rule must return None. Target rules are annotated ``-> Targets``.
    targeted = fn.__annotations__.get("return") in ("Targets", Targets)

    @functools.wraps(fn)
    def wrapper(self: _M, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        self.oracle.raised_in_rule = self.oracle.refused_in_rule = False
        self._since_bad += 1
        try:
            out = fn(self, *args, **kwargs)
            self.oracle.end_step()  # a rule is one engine step, or ends with one
            return out
        except CheckFailed as exc:
            if not is_ignored(exc.check, type(self).ignored_checks, exc.fingerprint):
                raise
            if exc.fingerprint not in self.oracle.suppressed:
                self.oracle.suppressed.append(exc.fingerprint)
            self.oracle.resync()
            # a target rule's _R is Targets, any other rule's None
            return cast(_R, multiple() if targeted else None)
        finally:
            cls = type(self)
            cls.last_steps += 1
            cov = cls.coverage
            cov.rules[name] += 1
            if self.oracle.raised_in_rule:
                cov.invalid_rules[name] += 1
            if self.oracle.refused_in_rule:
                cov.refused_rules[name] += 1

    return wrapper


def bad_inputs_due(machine: MachineBase) -> bool:
    """At most one bad-input rule in any three consecutive rules, so invalid steps stay rare
    (the first one may fire at once, so minimal replays need no filler steps)."""
    return machine._since_bad >= 3
