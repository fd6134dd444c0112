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
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from prefixkv.errors import InvalidConfig

__all__ = ["case_name", "main", "prepare"]


def case_name(case: dict[str, Any]) -> str:
    """The benchmark's name in pyperf's results (unique per case in a run)."""
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

    raise InvalidConfig(f"unknown case kind {case['kind']!r}")


def main() -> None:
    import pyperf

    def pass_case(cmd: list[str], args: Any) -> None:
        cmd.extend(("--case", args.case))

    runner = pyperf.Runner(
        add_cmdline_args=pass_case,
        program_args=("-m", "prefixkv.benchmarks.worker"),
    )
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
