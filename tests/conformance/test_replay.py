"""Replays stay readable at any block size and stay runnable: token ids are written as runs
(``7×256``, ``[1..16]``), block by block, and read back by ``tokens``; the shrink is capped
by ``max_shrink_s`` and then reports the shortest replay found so far."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kit_runs import FIND_ONLY, STEPS
from prefixkv.spec import Namespace, Request

from examples.engine_style import make_double_free_in_batch, make_stale_hash_after_reuse
from prefixkv.conformance import ConformanceFailure, run_conformance
from prefixkv.conformance.replay import CallLog, Recording, format_call, runs, tokens


def test_runs_block_by_block() -> None:
    ids = (7,) * 256 + tuple(range(1, 17)) + (3,) * 240
    assert runs(ids, 256) == "7×256 | [1..16] 3×240"
    assert runs((1, 2, 4, 4, 5, 6, 7, 9, 9), 4) == "1 2 4×2 | [5..7] 9 | 9"
    assert tokens("7x3 [2..4] | 9") == (7, 7, 7, 2, 3, 4, 9)
    with pytest.raises(ValueError, match="cannot read 'seven'"):
        tokens("7 seven")


@given(st.lists(st.integers(0, 12), max_size=40), st.integers(1, 9))
def test_runs_read_back_as_the_same_tokens(ids: list[int], block_size: int) -> None:
    shown = runs(ids, block_size)
    assert tokens(shown) == tuple(ids)
    assert shown.count("|") == max(0, -(-len(ids) // block_size) - 1)


def test_a_call_shows_a_long_prompt_as_runs_and_a_short_one_as_it_is() -> None:
    ns = Namespace("m")
    long = Request(0, (7,) * 512 + (8,) * 256, ns)
    assert format_call("admit", (long, None), {}, 256) == (
        "cache.admit(Request(0, tokens(\"7×256 | 7×256 | 8×256\"), Namespace('m')), None)"
    )
    assert format_call("admit", (Request(0, (7, 7), ns),), {}, 1) == (
        "cache.admit(Request(0, (7, 7), Namespace('m')))"
    )
    assert format_call("commit", (0, 300, (5,) * 300), {}, 256) == (
        'cache.commit(0, 300, tokens("5×300"))'
    )
    bad = (1, -2, True)  # bad inputs are shown exactly as they were passed
    assert format_call("commit", (0, 1, bad), {}, 4) == "cache.commit(0, 1, (1, -2, True))"


def _replay(factory: Any, **kwargs: Any) -> ConformanceFailure:
    with pytest.raises(ConformanceFailure) as info:
        run_conformance(factory, steps=STEPS, max_failures=1, **kwargs)
    return info.value


def test_a_replay_at_block_size_256_is_short_and_runs() -> None:
    """An unshrunk failure at block size 256: every line is short (at most a few runs per
    block), and the replay runs as a
    program against the factory (it raises nothing before the state the check rejected)."""
    failure = _replay(
        make_stale_hash_after_reuse, max_examples=100, profile=FIND_ONLY, block_sizes=(256,)
    )
    assert failure.calls[1].startswith("cache = make(num_blocks=")
    assert ", block_size=256," in failure.calls[1]
    # prompts of up to 15 blocks of 256 tokens: a line per call, never a block's tokens
    assert max(len(line) for line in failure.calls) < 400, failure.calls
    assert len("\n".join(failure.calls)) < 10_000
    assert any('tokens("' in line for line in failure.calls), failure.calls
    _run_replay(failure.calls, make_stale_hash_after_reuse)


def _run_replay(calls: list[str], make: Any) -> None:
    """Run a replay line by line; a line marked ``# raises E`` must raise ``E``."""
    scope: dict[str, Any] = {"make": make}
    for line in calls:
        code, _, note = line.partition("  # ")
        if not note.startswith("raises "):
            exec(code, scope)
            continue
        with pytest.raises(Exception) as info:
            exec(code, scope)
        assert type(info.value).__name__ == note.split()[1].rstrip(":"), line


def test_the_shrink_cap_reports_the_shortest_replay_so_far() -> None:
    """A bug whose shrink takes about 30 s from the full search's 30-step run (no short
    runs first), capped at 1 s: the report says so, and the replay is the best one found
    by then (no longer than the unshrunk run)."""
    found = _replay(
        make_double_free_in_batch, max_examples=100, profile=FIND_ONLY, short_first=False
    )
    capped = _replay(
        make_double_free_in_batch,
        max_examples=100,
        profile="ci",
        max_shrink_s=1,
        short_first=False,
    )
    failure = capped.report.failures[0]
    assert failure.check == found.check == "INV-REF"
    assert failure.shrink_capped and failure.shrink_s < 20, failure.shrink_s
    assert len(failure.calls) <= len(found.calls)
    assert "shortest replay so far" in str(capped)
    assert capped.report.to_json()["failures"][0]["shrink_capped"] is True


def test_the_shrink_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_shrink_s"):
        run_conformance(make_double_free_in_batch, max_examples=1, max_shrink_s=0)


def test_a_call_is_written_as_it_was_made_even_when_read_later() -> None:
    """The log keeps a call's values and writes the source only when a line is read; a value
    the engine could change afterwards (a list it was passed or returned) is written down at
    the call, so a later change does not rewrite the replay."""

    class Engine:
        block_size = 4

        def __init__(self) -> None:
            self.kept: list[int] = [1]

        def free(self, ids: list[int]) -> None:
            ids.append(99)  # an engine that changes its argument

        def table(self) -> list[int]:
            return self.kept

        def match(self, req: Request) -> tuple[int, ...]:
            return (3, 4)

        def fail(self, n: int) -> None:
            raise ValueError(f"no {n}")

    log = CallLog(["header"])
    engine = Engine()
    rec: Any = Recording(engine, log)
    rec.free([1, 2])
    rec.table()
    engine.kept.append(2)
    rec.match(Request(0, (7,) * 9, Namespace("m")))
    with pytest.raises(ValueError):
        rec.fail(5)
    assert list(log) == [
        "header",
        "cache.free([1, 2])",
        "cache.table()  # -> [1]",
        "cache.match(Request(0, tokens(\"7×4 | 7×4 | 7\"), Namespace('m')))  # -> (3, 4)",
        "cache.fail(5)  # raises ValueError: no 5",
    ]
    del log[2:]
    log[0] = "first"
    assert log == ["first", "cache.free([1, 2])"] and log[-1] == "cache.free([1, 2])"
