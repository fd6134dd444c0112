"""Timing in fresh processes through pyperf: the values of every case, interleaved in rounds.

Every benchmark of this package times what a user's program does in several fresh worker
processes (pyperf), each with warm-ups and several values, and reports the median and the
spread of all values, never the best one. :func:`run_pyperf` interleaves the cases: each
*round* runs every case once, so each case's values are spread over the whole run and its
ratios to the others are measured side by side on a machine whose load drifts.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from prefixkv.errors import InvalidConfig

from .errors import BenchmarkFailed

__all__ = ["Launch", "Timing", "TimingSummary", "quantile", "run_pyperf", "this_tree"]


@attrs.frozen
class Timing:
    """One case's pyperf values, in µs per unit (block touched or lookup)."""

    values_us: tuple[float, ...]
    processes: int

    @property
    def median(self) -> float:
        return quantile(self.values_us, 0.5)

    @property
    def q1(self) -> float:
        return quantile(self.values_us, 0.25)

    @property
    def q3(self) -> float:
        return quantile(self.values_us, 0.75)

    def summary(self) -> TimingSummary:
        vals = self.values_us
        mean = sum(vals) / len(vals)
        stdev = (
            math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))
            if len(vals) > 1
            else 0.0
        )
        return TimingSummary(
            median_us=self.median,
            q1_us=self.q1,
            q3_us=self.q3,
            min_us=min(vals),
            max_us=max(vals),
            stdev_us=stdev,
            values=len(vals),
            processes=self.processes,
            values_us=vals,
        )


@attrs.frozen
class TimingSummary:
    """One case's values summarised, µs per unit: the median and the spread, never a best."""

    median_us: float
    q1_us: float
    q3_us: float
    min_us: float
    max_us: float
    stdev_us: float
    values: int
    processes: int
    values_us: tuple[float, ...]


def quantile(values: Iterable[float], q: float) -> float:
    """Linear-interpolation quantile (the median for q = 0.5)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


#: How a case's worker is started: ``case -> (command line before its options, environment;
#: None: this process's)``.
Launch = Callable[[dict[str, Any]], tuple[list[str], dict[str, str] | None]]


def this_tree(case: dict[str, Any]) -> tuple[list[str], dict[str, str] | None]:
    return [sys.executable, "-m", "prefixkv.benchmarks.worker"], None


def run_pyperf(
    cases: list[dict[str, Any]],
    rounds: int,
    options: Callable[[dict[str, Any]], list[str]],
    workdir: Path,
    log: Callable[[str], None],
    launch: Launch = this_tree,
) -> dict[str, Timing]:
    """Run every case ``rounds`` times, interleaved, each time with pyperf's ``options``
    (processes, values, warm-ups) and started by ``launch`` (default: this tree's
    :mod:`.worker`); returns each case's values, in µs per unit.

    NOTE: every worker runs in ``workdir``: a worker started with ``-m`` or ``-c`` has its
    working directory first on ``sys.path``, and a source checkout's root there would shadow
    what the environment's ``PYTHONPATH`` says to import.
    """
    import pyperf

    from .worker import case_name

    paths = {case_name(c): workdir / f"{case_name(c)}.json" for c in cases}
    if len(paths) != len(cases):
        raise InvalidConfig("two cases share a name")
    for r in range(rounds):
        for case in cases:
            name = case_name(case)
            log(f"round {r + 1}/{rounds}: {name}")
            start, env = launch(case)
            cmd = [*start, "--case", json.dumps(case), *options(case)]
            cmd += ["--quiet", "--append", str(paths[name])]
            done = subprocess.run(
                cmd, capture_output=True, text=True, check=False, env=env, cwd=workdir
            )
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
                raise BenchmarkFailed(f"benchmark {name} failed: " + " | ".join(tail))
    timings: dict[str, Timing] = {}
    for name, path in paths.items():
        bench = pyperf.Benchmark.load(str(path))
        values = tuple(v * 1e6 for v in bench.get_values())
        timings[name] = Timing(values, bench.get_nrun())
    return timings
