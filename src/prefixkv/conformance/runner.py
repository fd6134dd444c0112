"""Aim the conformance machines at a block manager: the adapter contract and the runner.

An adapter is any object with the :class:`~prefixkv.spec.PrefixCache` operations that can
render itself as a :class:`~prefixkv.spec.CacheState` (``snapshot()``), raising prefixkv's
errors (:mod:`prefixkv.spec.errors`) for bad input. An *adapter factory* builds a fresh one
for each run::

    def make(num_blocks: int, block_size: int, *, record_events: bool) -> BlockManagerAdapter:
        return MyAdapter(MyBlockManager(num_blocks, block_size), record_events=record_events)

    make.capabilities = Capabilities(multimodal=False, exact=False)   # optional

:func:`run_conformance` (and the pytest plugin, ``--prefixkv-adapter=module:make``) drives
it with the state machines under the capabilities it declares.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import attrs

from prefixkv.spec import HASHERS, Inspectable, PrefixCache, SpecCache

from .capabilities import Capabilities

__all__ = [
    "AdapterFactory",
    "BlockManagerAdapter",
    "ConformanceFailure",
    "capabilities_of",
    "conformance_machine",
    "load_factory",
    "required_operations",
    "run_conformance",
]


@runtime_checkable
class BlockManagerAdapter(PrefixCache, Inspectable, Protocol):
    """The operations the machines drive, plus a neutral snapshot for the invariants."""


#: ``factory(num_blocks, block_size, *, record_events) -> BlockManagerAdapter``.
AdapterFactory = Callable[..., Any]


class ConformanceFailure(AssertionError):
    """A conformance run failed. ``check`` names the check (e.g. ``INV-REF``), ``calls`` is
    the minimal failing run as calls of the adapter, ``steps`` its number of rule steps."""

    def __init__(self, check: str, message: str, calls: list[str], steps: int) -> None:
        self.check, self.calls, self.steps = check, calls, steps
        replay = "\n".join(f"    {line}" for line in calls)
        super().__init__(
            f"{message}\n\nminimal replay ({steps} steps, {len(calls) - 2} adapter calls):\n"
            f"{replay}"
        )


def load_factory(target: str) -> AdapterFactory:
    """``"package.module:factory"`` -> the factory (a ``ValueError`` if it is not one)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected MODULE:FACTORY, got {target!r}")
    factory = getattr(importlib.import_module(module_name), attr, None)
    if not callable(factory):
        raise ValueError(f"{target!r} is not a callable adapter factory")
    return factory


def capabilities_of(factory: AdapterFactory, override: str = "") -> Capabilities:
    """The factory's ``capabilities`` attribute (default: everything), then ``override``
    (``"-multimodal,+exact"``) on top."""
    base = getattr(factory, "capabilities", None)
    caps = base if isinstance(base, Capabilities) else Capabilities()
    return Capabilities.parse(override, caps) if override else caps


_CORE = (
    "num_blocks", "block_size", "match", "can_admit", "admit", "can_append", "append",
    "commit", "rollback", "free", "evict", "block_table", "num_computed_tokens", "seq_ids",
    "stats", "take_events", "snapshot",
)  # fmt: skip


def required_operations(caps: Capabilities) -> tuple[str, ...]:
    """The attributes an adapter with these capabilities must have."""
    extra = ("reset",) if caps.reset else ()
    if caps.chunked_prefill:
        extra += ("can_continue_prefill", "continue_prefill")
    return _CORE + extra


def _pair_factory(factory: AdapterFactory, caps: Capabilities, hasher: str) -> Any:
    from .machines import PoolConfig

    def make_pair(cfg: PoolConfig) -> tuple[Any, Any]:
        cand = factory(cfg.num_blocks, cfg.block_size, record_events=cfg.record_events)
        missing = [name for name in required_operations(caps) if not hasattr(cand, name)]
        if missing:
            raise TypeError(
                f"{type(cand).__name__} lacks {', '.join(missing)}: declare the capability "
                "off, or add the operation to the adapter"
            )
        if not caps.exact:
            return None, cand
        ref = SpecCache(
            cfg.num_blocks, cfg.block_size, hasher=HASHERS[hasher], record_events=cfg.record_events
        )
        return ref, cand

    return make_pair


def conformance_machine(
    factory: AdapterFactory,
    caps: Capabilities | None = None,
    *,
    name: str = "Conformance",
    hasher: str = "fast",
    num_blocks: tuple[int, int] = (4, 24),
    block_sizes: tuple[int, int] = (1, 4),
) -> Any:
    """The state machine class for ``factory`` (exact: against the spec with ``hasher``)."""
    from .machines import build_machine

    caps = capabilities_of(factory) if caps is None else caps
    return build_machine(
        name,
        _pair_factory(factory, caps, hasher),
        num_blocks=num_blocks,
        block_sizes=block_sizes,
        caps=caps,
    )


@attrs.frozen
class ConformanceReport:
    """What a passing run did."""

    rules: int
    operations: int
    seconds: float


def run_conformance(
    factory: AdapterFactory,
    caps: Capabilities | None = None,
    *,
    max_examples: int | None = None,
    steps: int = 50,
    hasher: str = "fast",
    profile: str | None = None,
) -> ConformanceReport:
    """Run the machines against ``factory``; raise :class:`ConformanceFailure` on a failure.

    Runs under the Hypothesis profile ``profile`` (``dev``, ``ci``, ``thorough``; default:
    the active one) without making it the active one; ``max_examples`` overrides its
    example count, ``steps`` is the most rule steps of one run.
    """
    import time

    from hypothesis import Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from .machines import CheckFailed
    from .profiles import register_profiles

    register_profiles()
    base = settings.get_profile(profile) if profile is not None else settings()
    machine = conformance_machine(factory, caps, hasher=hasher)
    machine.coverage.reset()
    # NOTE: no explain phase: on a failing machine it re-runs the minimal case hundreds of
    # times to annotate the rules' arguments, which the replay of adapter calls makes moot,
    # and it cost four times the search and the shrinking together.
    extra: dict[str, Any] = {
        "stateful_step_count": steps,
        "report_multiple_bugs": False,
        "phases": [p for p in base.phases if p is not Phase.explain],
    }
    if max_examples is not None:
        extra["max_examples"] = max_examples
    start = time.perf_counter()
    try:
        run_state_machine_as_test(machine, settings=settings(base, **extra))
    except CheckFailed as exc:
        calls = list(machine.last_calls)
        raise ConformanceFailure(exc.check, str(exc), calls, machine.last_steps) from exc
    report = machine.coverage.report()
    return ConformanceReport(
        report.total_rules, sum(report.ops.values()), time.perf_counter() - start
    )
