"""One conformance run in a process of its own, on a shared example database.

``tests/conformance/test_database.py`` starts this twice on one database, to show that a
failure found by one process is the first example the next process tries::

    python tests/conformance/replay_worker.py --database DIR_OR_URL --seed 3 [--no-shrink]

It runs the kit against one of the example engine's classic bugs and prints one line of
JSON: the check that failed, and how many examples (runs of the machine, each from a fresh
manager) had been tried when the first check failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[2]))  # the examples package

from hypothesis import Phase, settings

from examples import engine_style
from prefixkv.conformance import ConformanceFailure, run_conformance
from prefixkv.conformance.failures import CheckFailed, failure_listeners
from prefixkv.conformance.profiles import register_profiles


def run(
    bug: str, database: Any, seed: int, examples: int, steps: int, shrink: bool = True
) -> dict[str, Any]:
    profile = "dev"
    if not shrink:  # a failing run is mostly shrinking; the replay needs none
        register_profiles()
        dev = settings.get_profile("dev")
        profile = "dev-find-only"
        settings.register_profile(profile, dev, phases=[p for p in dev.phases if p != Phase.shrink])
    base = getattr(engine_style, f"make_{bug}")
    made = 0
    first: list[int] = []

    def make(num_blocks: int, block_size: int, *, record_events: bool) -> Any:
        nonlocal made
        made += 1  # one manager per example: the machine builds it in its first rule
        return base(num_blocks, block_size, record_events=record_events)

    def listen(exc: CheckFailed) -> None:
        if not first:
            first.append(made)

    failure_listeners.append(listen)
    try:
        run_conformance(
            make,
            base.capabilities,
            max_examples=examples,
            steps=steps,
            profile=profile,
            database=database,
            seed=seed,
            max_failures=1,
        )
    except ConformanceFailure as exc:
        return {"check": exc.report.checks[0], "first_failure_example": first[0]}
    finally:
        failure_listeners.remove(listen)
    return {"check": None, "first_failure_example": None, "examples": made}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database", default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bug", default="stale_hash_after_reuse")
    parser.add_argument("--examples", type=int, default=500)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--no-shrink", dest="shrink", action="store_false")
    args = parser.parse_args(argv)
    report = run(args.bug, args.database, args.seed, args.examples, args.steps, args.shrink)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
