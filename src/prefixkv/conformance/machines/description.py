"""What a runnable machine class is made of, and the one place that makes it.

A machine's rules live in mixins (:mod:`.lifecycle`, :mod:`.bad_inputs`, :mod:`.features`,
:mod:`.hybrid`, :mod:`.step_calls`); a run needs one more rule, ``init``, that draws the pool
and builds the pair, plus the class-level settings the rules read. :class:`MachineDescription`
holds all of them, typed and frozen, and :func:`machine_class` makes the class in one
``type(...)`` call, so that no class is patched after it exists (Hypothesis reads a class's
rules once and caches them).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TypeVar, cast

import attrs

from prefixkv.spec import Namespace

from .._compat import rules_of
from ..capabilities import Capabilities
from .base import MachineBase
from .coverage import RuleCoverage
from .factories import PairFactory
from .strategies import NAMESPACES

__all__ = ["MachineDescription", "machine_class", "rule_names", "without_rules"]

_M = TypeVar("_M", bound="type[MachineBase]")


@attrs.frozen
class MachineDescription:
    """Everything a runnable machine class adds to its rule mixins.

    ``init`` is the initialize rule (already decorated with ``@initialize`` and
    ``@counted``); ``skip_rules`` names inherited rules that never fire; the rest become the
    class attributes of :class:`~.base.MachineBase` of the same names.
    """

    name: str
    make_pair: PairFactory
    init: Callable[..., None]
    caps: Capabilities = attrs.field(factory=Capabilities)
    compared_fields: frozenset[str] | None = None
    ignored_checks: frozenset[str] = frozenset()
    skip_rules: frozenset[str] = frozenset()
    namespaces: tuple[Namespace, ...] = NAMESPACES
    #: Extra class attributes of a machine family (rules or settings of its own).
    extra: Mapping[str, object] = attrs.field(factory=dict)


def rule_names(machine: type[MachineBase]) -> list[str]:
    """Every rule and initialize rule of ``machine``, by function name, sorted."""
    return sorted(rule.name for rule in rules_of(machine))


def _skipped(base: type[MachineBase], rules: Collection[str]) -> dict[str, None]:
    """``rules`` as attributes that shadow them (``ValueError`` for a name no rule has)."""
    known = set(rule_names(base)) - {"init"}
    unknown = sorted(set(rules) - known)
    if unknown:
        raise ValueError(
            f"no rule named {', '.join(unknown)}; the rules are {', '.join(sorted(known))}"
        )
    # A plain attribute shadows the inherited rule, so Hypothesis never sees it.
    return dict.fromkeys(rules)


def machine_class(base: _M, description: MachineDescription) -> _M:
    """A runnable subclass of ``base`` (a machine of rule mixins) made from
    ``description``, with its own coverage counters; ``cls.TestCase`` runs it.

    Args:
        base: the machine family (``DifferentialMachine``, ``HybridMachine``, ...).
        description: the pair, the initialize rule and the settings.

    Returns:
        The new class, named ``description.name``.

    Raises:
        ValueError: ``skip_rules`` names a rule ``base`` does not have.
    """
    d = description
    namespace: dict[str, object] = {
        "__module__": base.__module__,
        "__qualname__": d.name,
        "__doc__": base.__doc__,
        **_skipped(base, d.skip_rules),
        **d.extra,
        "coverage": RuleCoverage(),
        "namespaces": d.namespaces,
        "caps": d.caps,
        "compared_fields": d.compared_fields,
        "ignored_checks": d.ignored_checks,
        "make_pair": staticmethod(d.make_pair),
        "init": d.init,
    }
    return cast(_M, type(d.name, (base,), namespace))


def without_rules(machine: _M, rules: Collection[str]) -> _M:
    """A subclass of a runnable ``machine`` whose ``rules`` never fire (a team looking past
    a known issue, or a run focused on a few rules); it shares ``machine``'s counters.

    Args:
        machine: a runnable machine class.
        rules: the rules to switch off (``ValueError`` for a name that is no rule).

    Returns:
        The new class, with ``machine``'s name.
    """
    namespace: dict[str, object] = {
        "__module__": machine.__module__,
        "__qualname__": machine.__qualname__,
        **_skipped(machine, rules),
    }
    return cast(_M, type(machine.__name__, (machine,), namespace))
