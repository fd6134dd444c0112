"""The callgrind driver: what it parses, what it refuses, and the process it measures.

The measurement itself (a replay under valgrind) takes minutes, so it is not run here; these
tests check the parts its figure rests on.
"""

from __future__ import annotations

from typing import Any

import pytest

from prefixkv.benchmarks.errors import BenchmarkFailed
from prefixkv.benchmarks.instructions import (
    InstructionCount,
    collected,
    count_instructions,
    run_inner,
)
from prefixkv.benchmarks.lifecycle import trace_from_config
from prefixkv.workloads import ChatConfig

SUMMARY = """==4711== Events    : Ir
==4711== Collected : 4130812888
==4711==
==4711== I   refs:      4,130,812,888
"""


def test_the_summary_count_is_read() -> None:
    assert collected(SUMMARY) == 4_130_812_888


@pytest.mark.parametrize("stderr", ["", "==1== I   refs: 12\n", SUMMARY + SUMMARY])
def test_no_single_summary_is_an_error(stderr: str) -> None:
    with pytest.raises(BenchmarkFailed, match="callgrind summary"):
        collected(stderr)


def test_the_figure_is_the_difference_per_block() -> None:
    count = InstructionCount("fused", 4096, 32, 1, 1_000, 5_000_000, 2_000_000)
    assert count.per_block == 3_000.0


def test_a_missing_valgrind_or_an_unknown_shape_is_refused() -> None:
    with pytest.raises(BenchmarkFailed, match="not found"):
        count_instructions("fused", 64, valgrind="no-such-valgrind-here")
    with pytest.raises(BenchmarkFailed, match="unknown call shape"):
        count_instructions("sideways", 64)


def test_the_measured_process_reports_the_trace_it_replays() -> None:
    # Without the replay (the baseline run): the trace is built and its size reported.
    assert run_inner("fused", 64, 32, 1, do_replay=False) == (
        trace_from_config(ChatConfig()).blocks_touched
    )


def test_the_events_flag_builds_a_recording_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    from prefixkv.benchmarks import instructions

    built: list[Any] = []
    real = instructions.make_cache

    def recorded(*a: Any, **kw: Any) -> Any:
        built.append(real(*a, **kw))
        return built[-1]

    monkeypatch.setattr(instructions, "make_cache", recorded)
    run_inner("fused", 64, 32, 1, do_replay=False, events=True)
    assert built[-1].record_events
