"""The pyperf script behind ``prefixkv bench``: one benchmark case per invocation.

``prefixkv bench`` runs ``python -m prefixkv.benchmarks.worker --case JSON [pyperf options]``.
That process is pyperf's *master*: it starts fresh worker processes (the same command with
``--worker``), each of which builds its inputs, runs warm-up and timed values, and reports
them back; pyperf then stores every value, so the caller reads the median and the spread
over all values of all processes, never a best-of-N.

Timing uses pyperf's ``bench_time_func``: the function times only the region the case is
about, and what it must not time (building the trace, constructing the cache, publishing
the prompts a lookup benchmark searches) happens before the clock starts. ``inner_loops``
is the number of units of work per value (blocks touched, or lookups), so pyperf's values
are seconds per unit.

Cases (the ``--case`` JSON):

* ``{"kind": "lifecycle", "tag": str, "manager": "impl"|"spec", "variant":
  "percall"|"fused"|"batched", "num_blocks": N, "trace": {ChatConfig fields}, "live": 32,
  "running": 1}``: one replay of the engine life cycle (:mod:`prefixkv.benchmarks.lifecycle`)
  on a fresh cache per value; per block touched.
* ``{"kind": "lookup", "crafted": true|false, "prompts": 4000, "num_blocks": N,
  "hasher": name|null}``: ``match`` of every probe against a cache holding the prompts
  (:mod:`prefixkv.benchmarks.collisions`); per lookup.
* ``{"kind": "kit", "side": str, "label": str, "target": "module:factory", "examples": N,
  "steps": S}``: one derandomized conformance run (``run_conformance`` under the ``ci``
  profile) of the adapter factory ``target``; CPU seconds per checked operation
  (:mod:`prefixkv.benchmarks.kit`). ``side`` only names the case.

The kit case imports nothing of :mod:`prefixkv.benchmarks`, only the conformance kit's public
API, and this file runs as a script as well as a module (``runpy.run_path``), so that the
same timing can measure the kit of another source tree put first on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from prefixkv.errors import InvalidConfig

__all__ = ["case_name", "main", "prepare"]


def case_name(case: dict[str, Any]) -> str:
    """The benchmark's name in pyperf's results (unique per case in a run)."""
    if case["kind"] == "kit":
        return f"kit-{case['label']}-{case['side']}"
    if case["kind"] == "lifecycle":
        return (
            f"lifecycle-{case['tag']}-{case['manager']}-{case['variant']}-{case['num_blocks']}"
            f"-r{case.get('running', 1)}"
        )
    hasher = case.get("hasher") or "default"
    return f"lookup-{'crafted' if case['crafted'] else 'control'}-{hasher}"


def prepare(case: dict[str, Any]) -> tuple[Callable[[int], float], int]:
    """The case's pyperf time function and its units of work per call."""
    import pyperf

    clock = pyperf.perf_counter
    if case["kind"] == "lifecycle":
        from prefixkv.workloads import ChatConfig

        from .lifecycle import make_cache, replay, trace_from_config

        fields: dict[str, Any] = {
            k: tuple(v) if isinstance(v, list) else v for k, v in case["trace"].items()
        }
        config = ChatConfig(**fields)
        trace = trace_from_config(config)
        manager, variant = case["manager"], case["variant"]
        n, live, running = case["num_blocks"], case["live"], case.get("running", 1)

        def lifecycle(loops: int) -> float:
            total = 0.0
            for _ in range(loops):
                cache = make_cache(manager, n, trace.block_size)
                start = clock()
                replay(cache, trace, variant, live, running=running)
                total += float(clock() - start)
                del cache
            return total

        return lifecycle, trace.blocks_touched

    if case["kind"] == "lookup":
        from prefixkv.spec.hashing import HASHERS

        from .collisions import lookup_setup, publish
        from .lifecycle import make_cache

        setup = lookup_setup(bool(case["crafted"]), int(case["prompts"]))
        kwargs = {} if case.get("hasher") is None else {"hasher": HASHERS[case["hasher"]]}
        cache = make_cache("impl", int(case["num_blocks"]), 16, **kwargs)
        publish(cache, setup.prompts)
        match, probes = cache.match, setup.probes

        def lookups(loops: int) -> float:
            start = clock()
            for _ in range(loops):
                for req in probes:
                    match(req)
            return float(clock() - start)

        return lookups, len(probes)

    if case["kind"] == "kit":
        return kit_run(case), 1

    raise InvalidConfig(f"unknown case kind {case['kind']!r}")


def kit_run(case: dict[str, Any]) -> Callable[[int], float]:
    """The kit case's time function: each call runs the conformance kit on a fresh
    adapter per example and returns the seconds per checked operation (an operation the
    oracle ran on the candidate and then checked), so that values of runs of any length
    compare.

    NOTE: the time divides by the run's own operation count rather than a count fixed in
    advance: the ``ci`` profile is derandomized, so every run of one tree issues the same
    operations, but two trees may draw differently, and the figure must stay per checked
    operation on each side. The clock is the process's CPU time: the kit is one thread
    that computes and never waits, and on a machine shared with other jobs wall time
    mostly measures them (it moved by 2x from one value to the next).
    """
    import time

    from prefixkv.conformance import run_conformance
    from prefixkv.conformance.runner import load_factory

    factory = load_factory(str(case["target"]))
    clock = time.process_time

    def kit(loops: int) -> float:
        total = 0.0
        for _ in range(loops):
            start = clock()
            report = run_conformance(
                factory, max_examples=int(case["examples"]), steps=int(case["steps"]), profile="ci"
            )
            total += float(clock() - start) / max(1, report.operations)
        return total

    return kit


def main() -> None:
    import pyperf

    def pass_case(cmd: list[str], args: Any) -> None:
        cmd.extend(("--case", args.case))

    # Run as a module, or as a script by path (another tree's kit first on PYTHONPATH).
    as_script = not __package__
    program = (
        ("-c", f"import runpy; runpy.run_path({__file__!r}, run_name='__main__')")
        if as_script
        else ("-m", "prefixkv.benchmarks.worker")
    )
    runner = pyperf.Runner(add_cmdline_args=pass_case, program_args=program)
    runner.argparser.add_argument("--case", required=True, help="the case, as JSON")
    args = runner.parse_args()
    case = json.loads(args.case)
    if args.worker:
        func, units = prepare(case)
    else:
        # The master only spawns workers: it never calls the function, so it skips the
        # inputs (crafting and publishing 4,000 prompts takes seconds).
        def func(loops: int) -> float:
            raise AssertionError("pyperf's master does not time")

        units = 1
    runner.bench_time_func(case_name(case), func, inner_loops=units)


if __name__ == "__main__":
    main()
