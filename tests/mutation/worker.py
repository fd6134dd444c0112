"""Run the differential machines against one (patched) copy of the impl package.

Used by :mod:`tests.mutation.run`, one subprocess per bug::

    python -m tests.mutation.worker --impl DIR [--shrink] [--machine text|steps|hybrid|all]

``DIR`` is a copy of ``impl/`` (with a bug patched in). It is loaded as ``prefixkv.impl``
before anything imports the real one. The machines then run stage by stage (each with a fixed seed,
so runs are reproducible) until the first check fails. The last line of stdout is a JSON object:
``caught``, ``killed_by`` (``"check"``: a check of the machines failed; ``"crash"``: the mutant
raised something no check names, at import or while the machines ran; null when not caught),
``check`` (the failing check or invariant, or ``CRASH(...)``), ``seconds`` (time to the first
failure, before any shrinking), ``stage``, ``message`` and, with ``--shrink``, ``replay``
(the minimal failing program Hypothesis printed).

NOTE: a mutant whose code raises at import is killed by a crash, as in any mutation tool: the
worker reports it (stage ``import``) instead of dying without a result, which the harness
could not tell from a failure of the harness itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

sys.dont_write_bytecode = True


@dataclass(frozen=True)
class Stage:
    """One deterministic run of a machine configuration."""

    config: str  # a key of CONFIGS
    seed: int
    examples: int


#: config -> (hash, pool sizes, block sizes, steps per example)
CONFIGS: dict[str, tuple[str, tuple[int, int], tuple[int, int], int]] = {
    "fast": ("fast", (4, 24), (1, 4), 50),
    "weak": ("weak", (4, 24), (1, 4), 50),
    "tokens": ("tokens", (4, 24), (1, 4), 50),
    "long": ("weak", (8, 32), (1, 3), 300),
    "rich_tokens": ("tokens", (4, 24), (1, 4), 50),
    "churn": ("weak", (8, 32), (1, 3), 100),
    "decode": ("fast", (8, 32), (3, 4), 50),
}

_LIFECYCLE = ("admit", "advance", "commit", "free", "evict", "match", "observe")

#: The rules a focused configuration keeps (every other rule is skipped in its stages).
#: NOTE: a focus only chooses which rules a stage draws; every check still runs after every
#: step. The round robin also runs the unfocused configurations, so a bug outside a focus is
#: still found, later.
FOCUS: dict[str, tuple[str, ...]] = {
    # spans, recompute windows and chunked prefill, under the tokens-only hash: every block
    # of equal tokens shares a bucket, so a hit must be told apart by its parent and extra
    # keys alone (an image's placeholder blocks, the same tokens typed as text)
    "rich_tokens": (
        *_LIFECYCLE,
        "admit_rich",
        "cancel_mid_chunk",
        "trim_and_reuse",
        "continue_prefill",
        "reuse_rich",
        "match_rich",
    ),
    # eviction order and the heap's rebuild: fill, release and evict, over and over, with
    # duplicate publications (parallel sampling) whose canonical twin is evicted and reused
    "churn": (
        *_LIFECYCLE,
        "churn_then_evict",
        "hot_prefix",
        "fits_thanks_to_hits",
        "next_turn",
        "preempt",
        "engine_step",
        "reset",
        "parallel_sampling",
        "admit_at_the_edge",
        "append",
        "rollback",
    ),
    # decode steps and bad counts, under the fast hash and blocks of 2 to 4 slots: a decode
    # commit that completes no block is the path a manager may check apart (a fast path
    # with nothing to publish), and bad_argument's commit_unknown_decode reaches it only in
    # decode, inside a block, which the unfocused stages meet a few times a thousand rules
    "decode": ("admit", "advance", "free", "next_turn", "bad_argument"),
}

#: Round robin over the configurations with fresh seeds, so a bug that only one
#: configuration sees is still found early. The first three rounds also run the focused
#: configurations, right after the fast-hash stage (which finds most bugs within a few
#: hundred rules): the classes that the unfocused stages meet late (a chunk split inside an
#: image, a hit trusted under a collision, the eviction order, the heap's rebuild, a stale
#: canonical twin) then fail within a few hundred rules of their focused stage.
STAGES: tuple[Stage, ...] = tuple(
    stage
    for r in range(6)
    for stage in (
        Stage("fast", r, 15),
        *(
            (Stage("rich_tokens", r, 6), Stage("churn", r, 3), Stage("decode", r, 10))
            if r < 3
            else ()
        ),
        Stage("weak", r, 15),
        Stage("tokens", r, 8),
        Stage("long", r, 2),
    )
)

#: The hybrid-model machines (checkpoints, routed experts): config -> (hash, max_num_seqs,
#: state_budget ranges, steps per example).
HYBRID_CONFIGS: dict[str, tuple[str, tuple[int, int], tuple[int, int], int]] = {
    "hybrid": ("fast", (1, 4), (0, 3), 50),
    "hybrid_weak": ("weak", (1, 2), (0, 0), 50),
}

#: The fast-hash stages of the first two seeds come first: between them they meet every
#: hybrid bug class (slot pressure on a pinned checkpoint needs the second seed's draws).
HYBRID_STAGES: tuple[Stage, ...] = (
    Stage("hybrid", 0, 10),
    Stage("hybrid", 1, 10),
    Stage("hybrid_weak", 0, 5),
    Stage("hybrid", 2, 10),
    Stage("hybrid_weak", 1, 5),
    Stage("hybrid_weak", 2, 5),
)

#: The text machines with the engine-shaped call rules (``advance``, ``advance_batch``)
#: mixed in: config -> the CONFIGS entry it runs. For bugs in the fused and batched calls,
#: which the plain text machines never make.
STEP_CONFIGS: dict[str, str] = {"steps_fast": "fast", "steps_weak": "weak"}

STEP_STAGES: tuple[Stage, ...] = tuple(
    stage for r in range(4) for stage in (Stage("steps_fast", r, 15), Stage("steps_weak", r, 15))
)

#: The ``advance_columns`` rules, which the step stages skip (see ``build_stage_machine``).
COLUMN_RULES = ("columnar_step", "bad_columns_call")

#: ``--machine`` -> the stages a worker runs.
MACHINES: dict[str, tuple[Stage, ...]] = {
    "text": STAGES,
    "steps": STEP_STAGES,
    "hybrid": HYBRID_STAGES,
    "all": STAGES + STEP_STAGES + HYBRID_STAGES,
}


class LoadError(RuntimeError):
    """The copy could not take the place of ``prefixkv.impl``: a harness error, never a kill."""


def install_impl(directory: Path) -> ModuleType:
    """Load ``directory`` as the package ``prefixkv.impl`` (and its submodules).

    Raises :class:`LoadError` when the copy cannot be installed; whatever the copy's own code
    raises while it is executed propagates unchanged.
    """
    if "prefixkv.impl" in sys.modules:
        raise LoadError("prefixkv.impl was imported before the patched copy was installed")
    spec = importlib.util.spec_from_file_location(
        "prefixkv.impl",
        directory / "__init__.py",
        submodule_search_locations=[str(directory)],
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["prefixkv.impl"] = module
    spec.loader.exec_module(module)
    import prefixkv

    prefixkv.impl = module  # type: ignore[attr-defined]
    cache = sys.modules.get("prefixkv.impl.cache")
    cache_file = Path(getattr(cache, "__file__", None) or "")
    if cache_file.resolve().parent != directory.resolve():
        raise LoadError(f"prefixkv.impl.cache loaded from {cache_file}, not {directory}")
    return module


def _crash_at_import(exc: BaseException, seconds: float) -> dict[str, Any]:
    where = next(
        (
            f"{Path(frame.filename).name}:{frame.lineno}"
            for frame in reversed(traceback.extract_tb(exc.__traceback__))
        ),
        "?",
    )
    return {
        "caught": True,
        "killed_by": "crash",
        "check": f"CRASH(import: {type(exc).__name__})",
        "seconds": round(seconds, 3),
        "stage": "import",
        "rules": 0,
        "message": f"{type(exc).__name__} at {where}: {exc}".splitlines()[0][:300],
        "replay": "",
    }


def build_stage_machine(config: str) -> tuple[Any, int]:
    """The machine class of a configuration (its focus applied), and its steps per example."""
    from prefixkv.conformance.machines import (
        build_hybrid_machine,
        build_machine,
        hybrid_spec_vs_impl,
        spec_vs_impl,
    )
    from prefixkv.conformance.machines.differential import all_rule_names, skip
    from prefixkv.conformance.machines.step_calls import build_step_machine

    machine: Any
    if config in HYBRID_CONFIGS:
        hasher, seqs_max, budgets, steps = HYBRID_CONFIGS[config]
        machine = build_hybrid_machine(
            f"Mutant_{config}",
            hybrid_spec_vs_impl(hasher),
            max_num_seqs=seqs_max,
            state_budgets=budgets,
        )
    else:
        # a step configuration runs its CONFIGS entry with the engine-shaped call rules
        base = STEP_CONFIGS.get(config, config)
        hasher, blocks, sizes, steps = CONFIGS[base]
        build = build_step_machine if config in STEP_CONFIGS else build_machine
        machine = build(
            f"Mutant_{config}",
            # these runs rebuild the eviction heap often (see spec_vs_impl)
            spec_vs_impl(hasher, heap_slack=-8 if base in ("long", "churn") else None),
            num_blocks=blocks,
            block_sizes=sizes,
        )
    if config in FOCUS:
        keep = {"init", *FOCUS[config]}
        machine = skip(machine, [r for r in all_rule_names(machine) if r not in keep])
    elif config in STEP_CONFIGS:
        # NOTE: the columnar call's rules came after these stages' seeds were chosen; a rule
        # more changes every draw after it, so these stages run without them (each seeded
        # bug is caught as before) and the columnar call's own machines are in tests/impl.
        machine = skip(machine, list(COLUMN_RULES))
    return machine, steps


def _since_launch() -> float | None:
    """Seconds since the harness launched this process (``PREFIXKV_MUTANT_T0``), if it said."""
    t0 = os.environ.get("PREFIXKV_MUTANT_T0")
    return None if not t0 else round(time.monotonic() - float(t0), 3)


def run(directory: Path, *, shrink: bool, stages: tuple[Stage, ...] = STAGES) -> dict[str, Any]:
    """Run ``stages`` on the copy until a check fails.

    ``seconds`` (the search) and ``cpu`` count from the start of the first stage, after the
    imports; ``startup`` is the time from the launch of this process to that start (the
    interpreter, hypothesis and the patched ``prefixkv``), when the harness gave the launch
    time.
    """
    start = time.perf_counter()
    try:
        install_impl(directory)
    except (LoadError, KeyboardInterrupt):
        raise  # the harness is broken (or stopped), not the mutant
    except BaseException as exc:  # the mutant's own code raised while it was imported
        return {**_crash_at_import(exc, time.perf_counter() - start), "startup": _since_launch()}
    from hypothesis import HealthCheck, Phase, seed, settings
    from hypothesis.stateful import get_state_machine_test

    from prefixkv.conformance.failures import check_family
    from prefixkv.conformance.machines import CheckFailed, failure_listeners

    first: list[tuple[float, CheckFailed]] = []
    first_cpu: list[float] = []
    startup = _since_launch()
    start, cpu_start = time.perf_counter(), time.process_time()

    def listen(exc: CheckFailed) -> None:
        first.append((time.perf_counter() - start, exc))
        first_cpu.append(time.process_time() - cpu_start)

    failure_listeners.append(listen)
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
    rules = 0
    for stage in stages:
        machine, steps = build_stage_machine(stage.config)
        test = get_state_machine_test(
            machine,
            settings=settings(
                max_examples=stage.examples,
                stateful_step_count=steps,
                database=None,
                deadline=None,
                phases=phases,
                suppress_health_check=list(HealthCheck),
                report_multiple_bugs=False,
            ),
        )
        try:
            seed(stage.seed)(test)()
        except BaseException as exc:  # the bug was caught (or crashed the machine)
            rules += machine.coverage.report().total_rules
            seconds, check = (
                (first[0][0], first[0][1].check)
                if first
                else (time.perf_counter() - start, f"CRASH({type(exc).__name__})")
            )
            notes = "\n".join(getattr(exc, "__notes__", []))
            cpu = first_cpu[0] if first_cpu else time.process_time() - cpu_start
            return {
                "caught": True,
                # a check names the failure; anything else the mutant raised, or a check
                # that names a crash (the candidate raised what no check names), is a crash
                "killed_by": (
                    "check" if first and check_family(first[0][1].check) != "CRASH" else "crash"
                ),
                "check": check,
                "startup": startup,
                "seconds": round(seconds, 3),
                "cpu": round(cpu, 3),
                "stage": f"{stage.config}#{stage.seed}",
                "rules": rules,
                "message": str(first[0][1] if first else exc).splitlines()[0][:300],
                "replay": notes if shrink else "",
            }
        rules += machine.coverage.report().total_rules
    return {
        "caught": False,
        "killed_by": None,
        "check": None,
        "startup": startup,
        "seconds": round(time.perf_counter() - start, 3),
        "cpu": round(time.process_time() - cpu_start, 3),
        "stage": None,
        "rules": rules,
        "message": "",
        "replay": "",
    }


def parse_stages(text: str) -> tuple[Stage, ...]:
    """``fast#0:15,long#1:2`` -> the stages (to try a schedule)."""
    stages = []
    for part in text.split(","):
        config, rest = part.split("#")
        seed_, examples = rest.split(":")
        if config not in CONFIGS and config not in HYBRID_CONFIGS:
            raise ValueError(f"no configuration {config!r}")
        stages.append(Stage(config, int(seed_), int(examples)))
    return tuple(stages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", type=Path, required=True, help="a copy of impl/ to test")
    parser.add_argument("--shrink", action="store_true", help="shrink to a minimal replay")
    parser.add_argument(
        "--machine", choices=sorted(MACHINES), default="text", help="which stages to run"
    )
    parser.add_argument(
        "--stages", default=None, help="CONFIG#SEED:EXAMPLES,... instead of --machine's"
    )
    args = parser.parse_args(argv)
    stages = MACHINES[args.machine] if args.stages is None else parse_stages(args.stages)
    result = run(args.impl, shrink=args.shrink, stages=stages)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
