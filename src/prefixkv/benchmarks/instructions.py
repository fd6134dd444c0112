"""CPU instructions per block touched of the life-cycle replay, under valgrind's callgrind.

Wall-clock figures on a shared machine move by 10-30% from run to run; an instruction count
does not move with the load. This is the method of ``docs/benchmarks.md``: the replay of
:mod:`prefixkv.benchmarks.lifecycle` runs in a fresh interpreter under callgrind, and so does
the same process without the replay (the trace built, the cache constructed, the modules
imported); the difference, divided by the trace's blocks touched, is the figure.
``PYTHONHASHSEED=0`` makes both runs hash alike.

::

    python -m prefixkv.benchmarks.instructions --variant fused --num-blocks 4096 [--events]

prints one JSON object (:class:`InstructionCount`). About a minute per replay of the full
trace under callgrind; ``--inner`` is the process callgrind runs. ``--events`` builds the
cache with ``record_events=True`` (both runs), so the figure includes the KV events the
replay queues (never drained: their construction is the cost).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import attrs

from prefixkv.workloads import ChatConfig

from .errors import BenchmarkFailed
from .lifecycle import VARIANTS, make_cache, replay, trace_from_config

__all__ = ["InstructionCount", "collected", "count_instructions", "main", "run_inner"]

#: callgrind's summary line: ``==123== Collected : 4130812888``.
_COLLECTED = re.compile(r"^==\d+==\s+Collected\s*:\s*(\d+)\s*$", re.MULTILINE)


@attrs.frozen
class InstructionCount:
    """One call shape at one pool size: instructions per block touched."""

    variant: str
    num_blocks: int
    live: int
    running: int
    blocks_touched: int
    #: The whole process with the replay, and without it.
    with_replay: int
    without_replay: int
    events: bool = False

    @property
    def per_block(self) -> float:
        return (self.with_replay - self.without_replay) / self.blocks_touched


def collected(stderr: str) -> int:
    """The instruction count of callgrind's summary in ``stderr``."""
    found = _COLLECTED.findall(stderr)
    if len(found) != 1:
        raise BenchmarkFailed("no callgrind summary ('Collected : N') in the run's output")
    return int(found[0])


def run_inner(
    variant: str, num_blocks: int, live: int, running: int, do_replay: bool, events: bool = False
) -> int:
    """The process callgrind measures: build the trace and the cache, replay if asked;
    returns the blocks touched."""
    trace = trace_from_config(ChatConfig())
    cache = make_cache("impl", num_blocks, trace.block_size, record_events=events)
    import prefixkv.spec.steps  # noqa: F401  (the replay imports it; so does the baseline)

    if do_replay:
        replay(cache, trace, variant, live, running=running)
    return trace.blocks_touched


def _callgrind(args: list[str], valgrind: str, events: bool) -> tuple[int, int]:
    cmd = [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
    cmd += ["-m", "prefixkv.benchmarks.instructions", "--inner", *args]
    if events:
        cmd.append("--events")
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise BenchmarkFailed(f"callgrind run failed: {done.stderr.strip()[-300:]}")
    return collected(done.stderr), int(done.stdout.strip().splitlines()[-1])


def count_instructions(
    variant: str,
    num_blocks: int,
    *,
    live: int = 32,
    running: int = 1,
    valgrind: str = "valgrind",
    events: bool = False,
) -> InstructionCount:
    """Run the replay and the baseline under callgrind (two fresh processes).

    Args:
        variant: the call shape (one of ``VARIANTS``).
        num_blocks: the pool's size.
        live: conversations in flight.
        running: sequences per decode step.
        valgrind: the valgrind executable.
        events: record KV events.

    Returns:
        The two counts and the blocks touched.
    """
    if variant not in VARIANTS:
        raise BenchmarkFailed(f"unknown call shape {variant!r}: expected one of {VARIANTS}")
    if shutil.which(valgrind) is None:
        raise BenchmarkFailed(f"{valgrind!r} not found: instruction counts need valgrind")
    args = [variant, str(num_blocks), str(live), str(running)]
    with_replay, blocks = _callgrind([*args, "1"], valgrind, events)
    without_replay, _ = _callgrind([*args, "0"], valgrind, events)
    return InstructionCount(
        variant, num_blocks, live, running, blocks, with_replay, without_replay, events
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m prefixkv.benchmarks.instructions")
    parser.add_argument("--inner", nargs=5, metavar=("VARIANT", "N", "LIVE", "RUNNING", "REPLAY"))
    parser.add_argument("--variant", choices=VARIANTS, default="fused")
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--live", type=int, default=32)
    parser.add_argument("--running", type=int, default=1)
    parser.add_argument("--events", action="store_true", help="record KV events")
    args = parser.parse_args(argv)
    if args.inner:
        variant, n, live, running, do_replay = args.inner
        print(run_inner(variant, int(n), int(live), int(running), do_replay == "1", args.events))
        return
    result = count_instructions(
        args.variant, args.num_blocks, live=args.live, running=args.running, events=args.events
    )
    out: dict[str, Any] = {**attrs.asdict(result), "per_block": round(result.per_block)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
