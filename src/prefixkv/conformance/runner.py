"""Aim the conformance machines at a block manager: the runner.

:func:`run_conformance` (and the pytest plugin, ``--prefixkv-adapter=module:make``) drives
an adapter factory (:mod:`.adapters`: the contract, and the ``@adapter(capabilities=...)``
declaration) with the state machines, under the capabilities it declares.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, cast

import attrs

from prefixkv.spec import HASHERS, HybridSpecCache, SpecCache

from ._compat import rules_of, shrink_time_limit
from .adapters import AdapterFactory, BlockManagerAdapter, FactoryLike, as_factory
from .capabilities import Capabilities
from .database import DatabaseOption, campaign_settings, parse_database
from .failures import CheckFailed, message_shape
from .report import ConformanceFailure, ConformanceReport, Coverage, FailedCheck

if TYPE_CHECKING:
    from hypothesis import settings as Settings

    from .machines import DifferentialMachine, PairFactory

__all__ = [
    "ConformanceFailure",
    "ConformanceReport",
    "capabilities_of",
    "conformance_machine",
    "load_factory",
    "required_operations",
    "run_conformance",
]


def load_factory(target: str) -> AdapterFactory[object]:
    """``"package.module:factory"`` -> the factory (a ``ValueError`` if it is not one)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected MODULE:FACTORY, got {target!r}")
    factory: object = getattr(importlib.import_module(module_name), attr, None)
    if not callable(factory):
        raise ValueError(f"{target!r} is not a callable adapter factory")
    return as_factory(factory)


def capabilities_of(factory: FactoryLike, override: str = "") -> Capabilities:
    """The capabilities ``factory`` declares (:func:`~.adapters.adapter`; a plain function:
    prefixkv's own), then ``override`` (``"-multimodal,+exact"``) on top."""
    caps = as_factory(factory).capabilities
    return Capabilities.parse(override, caps) if override else caps


_CORE = (
    "num_blocks", "block_size", "match", "can_admit", "admit", "can_append", "append",
    "commit", "rollback", "free", "evict", "block_table", "num_computed_tokens", "seq_ids",
    "stats", "take_events", "snapshot",
)  # fmt: skip


#: The hybrid operations (``checkpoints``).
_HYBRID = (
    "state_slot", "pending_restore", "restore_issued", "checkpoint_reservation",
    "runtime_state", "keep_state",
)  # fmt: skip


def required_operations(caps: Capabilities) -> tuple[str, ...]:
    """The attributes an adapter with these capabilities must have."""
    optional = {
        "reset": caps.reset,
        "evict": caps.evict,
        "rollback": caps.rolls_back,
        "can_continue_prefill": caps.chunked_prefill,
        "continue_prefill": caps.chunked_prefill,
    }
    return (
        tuple(n for n in _CORE if optional.get(n, True))
        + tuple(n for n in ("reset", "can_continue_prefill", "continue_prefill") if optional[n])
        + (_HYBRID if caps.checkpoints else ())
    )


def _pair_factory(factory: AdapterFactory[object], caps: Capabilities, hasher: str) -> PairFactory:
    from .machines import HybridPoolConfig, PoolConfig

    def make_pair(cfg: PoolConfig) -> tuple[BlockManagerAdapter | None, BlockManagerAdapter]:
        hybrid: dict[str, int] = {}
        if isinstance(cfg, HybridPoolConfig):  # the checkpoints capability
            hybrid = {
                "max_num_seqs": cfg.max_num_seqs,
                "state_budget": cfg.state_budget,
                "decode_state_interval": cfg.decode_state_interval,
            }
        cand = factory(cfg.num_blocks, cfg.block_size, record_events=cfg.record_events, **hybrid)
        missing = [name for name in required_operations(caps) if not hasattr(cand, name)]
        if missing:
            raise TypeError(
                f"{type(cand).__name__} lacks {', '.join(missing)}: declare the capability "
                "off, or add the operation to the adapter"
            )
        # NOTE: the candidate has every operation its capabilities call for (checked just
        # above); the machines call no other.
        adapter = cast(BlockManagerAdapter, cand)
        if not caps.exact:
            return None, adapter
        h = HASHERS[hasher]
        if hybrid:
            return HybridSpecCache(
                cfg.num_blocks, cfg.block_size, hasher=h, record_events=cfg.record_events, **hybrid
            ), adapter
        return SpecCache(
            cfg.num_blocks, cfg.block_size, hasher=h, record_events=cfg.record_events
        ), adapter

    return make_pair


def conformance_machine(
    factory: FactoryLike,
    caps: Capabilities | None = None,
    *,
    name: str = "Conformance",
    hasher: str = "fast",
    ignore: Collection[str] = (),
    skip_rules: Collection[str] = (),
) -> type[DifferentialMachine]:
    """The state machine class for ``factory`` (exact: against the spec with ``hasher``),
    on the pool shapes ``caps`` declares (default: those ``factory`` declares)."""
    from .machines import build_hybrid_machine, build_machine

    declared = as_factory(factory)
    caps = declared.capabilities if caps is None else caps
    build = build_hybrid_machine if caps.checkpoints else build_machine
    return build(
        name,
        _pair_factory(declared, caps, hasher),
        num_blocks=caps.num_blocks,
        block_size_choices=caps.block_sizes,
        caps=caps,
        skip_rules=skip_rules,
        ignored_checks=ignore,
    )


def _shape(check: str, message: str) -> tuple[str, str]:
    """A failure without its operation: the check and the message's shape after the
    ``after <op>, candidate:`` prefix."""
    return check, message_shape(message).split(": ", 1)[-1]


def _bad_input(rule: str) -> bool:
    """A bad-input rule: its operations must be refused, so a refusal there is no gap."""
    return rule.startswith("bad_")


def _skipped(
    machine: type[DifferentialMachine],
    caps: Capabilities,
    fired: Collection[str],
    skip_rules: Collection[str],
) -> dict[str, str]:
    """rule -> why it never fired: the capability whose absence its precondition tests
    (``-speculative``), ``skip_rules``, or ``never drawn`` (its precondition held, or
    depends on the run's state, and the search never picked it)."""
    out = {r: "skip_rules" for r in skip_rules}
    for rule in rules_of(machine):
        if rule.initialize or rule.name in fired or rule.name in out:
            continue
        out[rule.name] = _excluded_by(rule.preconditions, caps) or "never drawn"
    return out


class _Probe:
    """Stands in for a machine when a precondition is asked about capabilities alone: every
    other attribute reads as a large count (bad inputs are due, the pool is big)."""

    def __init__(self, caps: Capabilities) -> None:
        self.caps = caps

    def __getattr__(self, name: str) -> int:
        return 1 << 20


def _holds(preconditions: Iterable[Callable[[object], object]], caps: Capabilities) -> bool | None:
    try:
        return all(bool(p(_Probe(caps))) for p in preconditions)
    except Exception:  # a precondition that reads the run's state: not about capabilities
        return None


def _excluded_by(
    preconditions: tuple[Callable[[object], object], ...], caps: Capabilities
) -> str | None:
    """The capability, off in ``caps``, that keeps ``preconditions`` from holding, or the
    two that do together (``rollback`` needs ``speculative`` and ``rollback``)."""
    if _holds(preconditions, caps) is not False:
        return None
    off = [f.name for f in attrs.fields(Capabilities) if getattr(caps, f.name) is False]
    for names in [(n,) for n in off] + list(itertools.combinations(off, 2)):
        try:
            on = Capabilities.evolve(caps, dict.fromkeys(names, True))
        except ValueError:
            continue
        if _holds(preconditions, on):
            return " ".join(f"-{n}" for n in names)
    return "its precondition never held"


def _by_root_cause(found: list[FailedCheck], related_to: dict[int, int]) -> tuple[FailedCheck, ...]:
    """Every failure class found, in the order found, each a root cause of its own; under
    each, the later failures possibly related to it (``related_to``: the index of a later
    failure in ``found`` -> the index of the earlier one its run went past)."""
    related: dict[int, list[str]] = {}
    for later, earlier in sorted(related_to.items()):
        related.setdefault(earlier, []).append(found[later].fingerprint)
    return tuple(attrs.evolve(f, related=tuple(related.get(i, ()))) for i, f in enumerate(found))


def _seed_of(i: int, runs: list[Settings], seed: int | None) -> int | str | None:
    """The seed of the ``i``-th search of ``runs``: ``seed`` (``None``: the profile's) for
    the full one and the first short one; for a later short one, its own seed derived from
    ``seed`` when there is one or the profile is derandomized.

    NOTE: the first short run draws the full search's own first runs, cut short: a bug it
    finds is mostly the one the full search finds first, by the same check. A derandomized
    profile seeds every run of a machine class alike, so a later short run would begin the
    same runs again; it gets a seed of its own, fixed, so the runs stay repeatable.
    """
    search = runs[i]
    if i == 0 or i == len(runs) - 1 or (seed is None and not search.derandomize):
        return seed
    return f"short-{search.stateful_step_count}-{seed}"


def _names(value: str | Iterable[str]) -> tuple[str, ...]:
    """``"A,B"`` or ``["A", "B,C"]`` -> ``("A", "B", "C")``."""
    items = [value] if isinstance(value, str) else list(value)
    return tuple(n.strip() for item in items for n in item.split(",") if n.strip())


def run_conformance(
    factory: FactoryLike,
    caps: Capabilities | None = None,
    *,
    max_examples: int | None = None,
    steps: int = 50,
    hasher: str = "fast",
    profile: str | None = None,
    ignore: str | Iterable[str] = (),
    skip_rules: str | Iterable[str] = (),
    max_failures: int = 8,
    report: str | os.PathLike[str] | None = None,
    target: str | None = None,
    database: DatabaseOption | None = None,
    seed: int | None = None,
    max_shrink_s: float | None = None,
    short_first: bool = True,
    **capabilities: object,
) -> ConformanceReport:
    """Run the machines against ``factory``; raise :class:`ConformanceFailure` on a failure.

    * ``caps`` (default: the factory's own), then ``capabilities`` as keywords on top, e.g.
      ``publish="schedule", reset=False, block_sizes=(256,)``
      (:meth:`Capabilities.evolve`, the parser the plugin uses too);
    * ``ignore``: checks (``"INV-WRITE"``), check families (``"CRASH"``) or failure classes
      (``"INV-PUBLISH#1a2b3c4d"``, as a report names them) to look past;
      ``skip_rules``: rules that never fire (``"reset"``);
    * ``max_failures``: the run goes on after a failure, with its failure class set aside,
      until it passes or this many failure classes were found; each is a root cause of its
      own, shrunk to its own replay, and one whose run went past an earlier one (or failed
      the same check in the same words after another operation) is also listed under that
      one as possibly related;
    * ``report``: a path to write the JSON report to (passing or not);
    * ``database``: the example database to share with other runs, a directory path or a
      ``redis://host:port/db`` URL (:func:`~prefixkv.conformance.database.parse_database`;
      ``InvalidDatabase`` before anything runs for a bad one, ``DatabaseUnavailable`` for
      a Redis server that refuses, stalls or answers wrongly). Failures found by any run
      that uses it are replayed first; it turns the profile's derandomization off;
    * ``seed``: the seed of the random search (default: a fresh one, or the profile's
      derandomized one), so that a run with a database can be repeated exactly;
    * ``max_shrink_s``: the most seconds spent shrinking one failure (default: Hypothesis'
      own cap, 300 s); past it the shortest replay found so far is reported, marked
      ``shrink_capped`` in the report;
    * ``short_first``: search with short runs (at most 5, then 8 rule steps, a fifth of the
      examples each) before the full one, so that a bug a short run finds is shrunk from a
      short run (:func:`~prefixkv.conformance.profiles.searches`); ``False`` for the full
      search alone. Off with a ``database``.

    Runs under the Hypothesis profile ``profile`` (``dev``, ``ci``, ``thorough``; default:
    the active one) without making it the active one; ``max_examples`` overrides its
    example count, ``steps`` is the most rule steps of one run.
    """
    from hypothesis import Phase, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis.stateful import run_state_machine_as_test

    from .failures import failure_listeners, is_ignored
    from .profiles import register_profiles, searches

    if max_failures < 1:
        raise ValueError(f"max_failures must be at least 1, got {max_failures!r}")
    if max_shrink_s is not None and not max_shrink_s > 0:
        raise ValueError(f"max_shrink_s must be a positive number, got {max_shrink_s!r}")
    # A Redis server is checked once, here, before anything runs (DatabaseUnavailable).
    db = None if database is None else parse_database(database, connect=True)
    caps = capabilities_of(factory) if caps is None else caps
    caps = Capabilities.evolve(caps, capabilities) if capabilities else caps
    ignored, skipped = _names(ignore), _names(skip_rules)
    register_profiles()
    base = settings.get_profile(profile) if profile is not None else settings()
    # NOTE: no explain phase: on a failing machine it re-runs the minimal case hundreds of
    # times to annotate the rules' arguments, which the replay of adapter calls makes moot,
    # and it cost four times the search and the shrinking together.
    run_settings = settings(
        base,
        stateful_step_count=steps,
        report_multiple_bugs=False,
        phases=[p for p in base.phases if p is not Phase.explain],
        max_examples=base.max_examples if max_examples is None else max_examples,
    )
    if db is not None:
        run_settings = campaign_settings(run_settings, db)
    # NOTE: a campaign's shared database gets the full search alone: its saved failures
    # are replayed first, as they were found (see profiles.searches).
    runs = searches(run_settings, short_first and db is None)
    fired: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    ops: Counter[str] = Counter()
    op_errors: Counter[str] = Counter()
    found: list[FailedCheck] = []  # every failure class, in the order found
    index_of: dict[str, int] = {}  # failure class -> its index in found
    related_to: dict[int, int] = {}  # a later failure -> the earlier one it may follow from
    shape_of: dict[tuple[str, str], str] = {}  # (check, message shape) -> its first class
    rules = operations = 0
    start = time.perf_counter()
    while len(found) < max_failures:
        looked_past = (*ignored, *(f.fingerprint for f in found))
        machine = conformance_machine(
            factory, caps, hasher=hasher, ignore=looked_past, skip_rules=skipped
        )
        machine.coverage.reset()
        first: list[float] = []

        def listen(
            exc: CheckFailed, first: list[float] = first, past: tuple[str, ...] = looked_past
        ) -> None:
            if not first and not is_ignored(exc.check, past, exc.fingerprint):
                first.append(time.perf_counter())

        failure_listeners.append(listen)
        began = time.perf_counter()
        try:
            with shrink_time_limit(max_shrink_s):
                for i, search in enumerate(runs):
                    hypothesis_seed(_seed_of(i, runs, seed))(machine)
                    run_state_machine_as_test(machine, settings=search)
        except CheckFailed as exc:
            ended = time.perf_counter()
            seen = first[0] if first else ended
            found.append(
                FailedCheck(
                    exc.check,
                    exc.detail,
                    tuple(machine.last_calls),
                    machine.last_steps,
                    first_seen_s=seen - start,
                    find_s=seen - began,
                    shrink_s=ended - seen,
                    shrink_capped=max_shrink_s is not None and ended - seen >= max_shrink_s,
                    fingerprint=exc.fingerprint,
                    operation=exc.operation,
                )
            )
            # NOTE: the minimal run of this failure went past the classes in exc.after (set
            # aside, they fired before it), or it fails the same check in the same words as
            # an earlier class after another operation: it may follow from that one. It is
            # listed under it as possibly related, and never folded into it: a bug that
            # fires in nearly every run is in the minimal run of every other bug of the
            # same engine, and folding made several bugs one root cause.
            twin = shape_of.setdefault(_shape(exc.check, exc.detail), exc.fingerprint)
            earlier = [index_of[fp] for fp in (*exc.after, twin) if fp in index_of]
            index_of[exc.fingerprint] = len(found) - 1
            if earlier:
                related_to[len(found) - 1] = earlier[0]
            continue
        finally:
            failure_listeners.remove(listen)
            cov = machine.coverage.report()
            rules += cov.total_rules
            operations += sum(cov.ops.values())
            fired.update(cov.rules)
            refused.update({r: n for r, n in cov.refused_rules.items() if not _bad_input(r)})
            ops.update(cov.ops)
            op_errors.update(cov.op_errors)
        break
    fired.pop("init", None)
    coverage = Coverage(
        dict(fired),
        dict(refused),
        _skipped(machine, caps, fired, skipped),
        dict(ops),
        dict(op_errors),
    )
    result = ConformanceReport(
        target=target or str(getattr(factory, "__qualname__", None) or repr(factory)),
        capabilities=caps.describe(),
        rules=rules,
        operations=operations,
        seconds=time.perf_counter() - start,
        failures=_by_root_cause(found, related_to),
        ignored=ignored,
        skipped_rules=skipped,
        max_failures=max_failures,
        coverage=coverage,
    )
    if report is not None:
        with open(report, "w", encoding="utf-8") as out:
            json.dump(result.to_json(), out, indent=2)
            out.write("\n")
    if found:
        raise ConformanceFailure(result)
    return result
