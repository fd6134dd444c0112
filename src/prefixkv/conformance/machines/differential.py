"""The differential state machine: a reference cache and a candidate, driven in lockstep.

Every rule runs its operations through the machine's
:class:`~prefixkv.conformance.lockstep.Lockstep` oracle (``self.oracle.op``), which runs
each on both caches and checks it: the same outcome, every invariant (under the declared
policy when the candidate runs alone), INV-TXN and purity, equal results and snapshots.
The rules come from mixins, one concern each: :mod:`.lifecycle` (admission, growth,
release, queries), :mod:`.bad_inputs`, :mod:`.features` (spans, windows, chunked prefill),
all written in the composite steps of :mod:`~prefixkv.conformance.machines.steps`.

Rules add their own checks: ``check_match`` on every match and admission (``INV-MATCH``),
``can_admit``/``can_append`` must predict the operation that follows on the same cache
(``CAN-ADMIT``, ``CAN-APPEND``), and an admission must attach exactly the blocks the match
just before it found (``ADMIT-MATCH``).

A failure raises :class:`CheckFailed`, whose message starts with the check's name in
brackets; Hypothesis then shrinks the run and prints it as a short program.

The machine class is built by :func:`build_machine` from a :data:`PairFactory`, so the same
rules can drive any pair of caches with the :class:`~prefixkv.spec.PrefixCache` API plus
``snapshot()``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import initialize

from ..capabilities import Capabilities
from ..lockstep import Outcome
from .bad_inputs import BAD_ARGUMENT_KINDS, BAD_REQUEST_KINDS, BAD_SEQUENCE_KINDS, BadInputRules
from .checks import CheckFailed, counted, failure_listeners
from .description import MachineDescription, machine_class, rule_names, without_rules
from .factories import PairFactory, PoolConfig
from .features import FeatureRules
from .lifecycle import LifecycleRules

__all__ = [
    "BAD_ARGUMENT_KINDS",
    "BAD_REQUEST_KINDS",
    "BAD_SEQUENCE_KINDS",
    "CheckFailed",
    "DifferentialMachine",
    "Outcome",
    "all_rule_names",
    "build_machine",
    "failure_listeners",
]


class DifferentialMachine(LifecycleRules, BadInputRules, FeatureRules):
    """Rules over the whole :class:`~prefixkv.spec.PrefixCache` API; see the module doc.

    Do not run this class directly: :func:`build_machine` makes a runnable subclass with a
    pair factory, the pool shapes to draw and its own coverage counters.
    """


M = TypeVar("M", bound=DifferentialMachine)


def build_machine(
    name: str,
    make_pair: PairFactory,
    *,
    num_blocks: tuple[int, int] = (4, 24),
    block_sizes: tuple[int, int] = (1, 4),
    record_events: tuple[bool, ...] = (True, False),
    compared_fields: frozenset[str] | None = None,
    caps: Capabilities | None = None,
    block_size_choices: tuple[int, ...] | None = None,
    skip_rules: Collection[str] = (),
    ignored_checks: Collection[str] = (),
) -> type[DifferentialMachine]:
    """A runnable machine class driving the pair ``make_pair`` returns.

    ``num_blocks`` and ``block_sizes`` are inclusive ranges drawn once per run
    (``block_size_choices``, if given, lists the block sizes instead); ``record_events``
    lists the event-recording settings a run may draw; ``compared_fields`` restricts the
    snapshot comparison. ``skip_rules`` names rules that never fire (``ValueError`` for a
    name that is no rule) and ``ignored_checks`` checks or check families a run looks past.
    The class owns a fresh :class:`~prefixkv.conformance.machines.coverage.RuleCoverage`
    (``cls.coverage``), and ``cls.TestCase`` runs it under pytest or unittest.
    """
    sizes = st.sampled_from(block_size_choices) if block_size_choices else st.integers(*block_sizes)

    @initialize(
        num_blocks=st.integers(*num_blocks),
        block_size=sizes,
        record_events=st.sampled_from(record_events if caps is None or caps.events else (False,)),
    )
    @counted
    def init(
        self: DifferentialMachine, num_blocks: int, block_size: int, record_events: bool
    ) -> None:
        """Build the pair on a freshly drawn pool."""
        self._start(PoolConfig(num_blocks, block_size, record_events))

    description = MachineDescription(
        name,
        make_pair,
        init,
        caps=Capabilities() if caps is None else caps,
        compared_fields=compared_fields,
        ignored_checks=frozenset(ignored_checks),
        skip_rules=frozenset(skip_rules),
    )
    return machine_class(DifferentialMachine, description)


def skip(machine: type[M], rules: Collection[str]) -> type[M]:
    """A subclass of ``machine`` whose ``rules`` never fire (a team looking past a known
    issue); see :func:`~.description.without_rules`."""
    return without_rules(machine, rules)


def all_rule_names(machine: type[DifferentialMachine]) -> list[str]:
    """Every rule and initialize rule of ``machine``, by function name."""
    return rule_names(machine)
