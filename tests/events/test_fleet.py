"""A fleet that survives a replica's death: killed (SIGKILL) and stopped (SIGSTOP) replicas.

The router drops a replica that died or stalled, forgets its blocks, and places its
unfinished requests again on the live replicas; the report lists every request of the
workload exactly once, served, re-routed or failed. The runs are tiny (2 replicas, 8
requests) with a short stall timeout. Every test that stops a replica continues it in a
``finally``, and the pool kills every replica it started when it closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from typing import Any

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgspec")
pytest.importorskip("torch")

from prefixkv import cli
from prefixkv.engine import EngineConfig, ModelConfig
from prefixkv.engine.policy import SchedulerConfig
from prefixkv.events import cluster
from prefixkv.events.cluster import ClusterResult, run_cluster
from prefixkv.events.replicas import ReplicaFailed, ReplicaPool
from prefixkv.events.router import MirrorIndex
from prefixkv.serving import ServeSimConfig, chat_turns

SIM = ServeSimConfig(conversations=4, turns=2, system_prompts=2, system_tokens=32)
CONFIG = EngineConfig(
    model=ModelConfig(),
    num_blocks=128,
    block_size=8,
    scheduler=SchedulerConfig(max_num_batched_tokens=128, min_prefill_tokens=32),
    backend="torch",
    device="cpu",
)
TURNS = chat_turns(SIM, CONFIG.model.vocab_size)
IDS = [t.request_id for t in TURNS]
STALL_S = 4.0
MAX_TICKS = 500  # the workload takes a few dozen ticks: a lost request fails, never spins


class _Fault:
    """An ``on_tick`` hook: after tick ``at``, send ``sig`` to replica ``replica``; keeps the
    process so that a test can continue it in a ``finally``, whatever happened."""

    def __init__(self, replica: int, at: int, sig: signal.Signals) -> None:
        self.replica, self.at, self.sig = replica, at, sig
        self.proc: BaseProcess | None = None
        self.sent_at: float | None = None
        self.ticks: list[tuple[int, float, tuple[bool, ...]]] = []

    def __call__(self, tick: int, pool: ReplicaPool) -> None:
        self.ticks.append((tick, time.monotonic(), tuple(pool.alive)))
        if tick == self.at:
            self.proc = pool.processes[self.replica]
            assert self.proc.pid is not None
            os.kill(self.proc.pid, self.sig)
            self.sent_at = time.monotonic()

    def release(self) -> None:
        """Continue a stopped replica that is still running (never signal a reaped pid)."""
        if self.proc is not None and self.proc.pid is not None and self.proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)


@contextlib.contextmanager
def fault(replica: int, at: int, sig: signal.Signals) -> Iterator[_Fault]:
    f = _Fault(replica, at, sig)
    try:
        yield f
    finally:
        f.release()


def _check_accounting(result: ClusterResult) -> None:
    """Every request exactly once: served (once), re-routed (served once) or failed."""
    assert result.workload == tuple(IDS)
    assert result.accounted_exactly_once
    assert set(result.requests) | set(result.failed) == set(IDS)
    assert not set(result.requests) & set(result.failed)
    assert result.served_counts == dict.fromkeys(result.requests, 1)
    log = cluster.report(result)["request_log"]
    assert [e["id"] for e in log] == IDS
    assert {e["status"] for e in log} <= {"served", "rerouted", "failed"}


def test_a_stopped_replica_is_dropped_within_the_stall_timeout() -> None:
    # kv places the first conversation on replica 0 at tick 0; stopped after that tick, it
    # still holds the request unfinished, and its blocks are in replica 0's index.
    indexes: list[MirrorIndex] = []

    def index(_: int) -> MirrorIndex:
        indexes.append(MirrorIndex())
        return indexes[-1]

    with fault(0, 0, signal.SIGSTOP) as f:
        result = run_cluster(
            TURNS,
            CONFIG,
            replicas=2,
            router="kv",
            index=index,
            stall_timeout_s=STALL_S,
            on_tick=f,
            max_ticks=MAX_TICKS,
        )
    _check_accounting(result)
    assert result.served_exactly_once and not result.failed
    (failure,) = result.replica_failures
    assert failure.replica == 0 and failure.tick == 1
    assert "stalled" in failure.reason and f"{STALL_S:g} s" in failure.reason
    assert failure.blocks_dropped > 0 and failure.rerouted == ("c0t0",)
    assert len(indexes[0].mirror) == 0 and len(indexes[1].mirror) > 0  # its blocks are gone
    # Noticed at the end of the next tick: within the stall timeout, plus that tick.
    assert f.sent_at is not None
    noticed = next(t for tick, t, alive in f.ticks if not alive[0])
    assert noticed - f.sent_at < STALL_S + 3.0
    rerouted = result.requests["c0t0"]
    assert rerouted.status == "rerouted" and rerouted.attempts == (0, 1)
    # Nothing is placed on a dropped replica, and the router still predicts exactly.
    assert all(r.replica == 1 for r in result.requests.values())
    assert result.mispredictions == 0


def test_a_killed_replica_loses_no_request_in_the_command_report(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = cluster.run_cluster
    with fault(0, 1, signal.SIGKILL) as f:

        def with_fault(*args: Any, **kwargs: Any) -> ClusterResult:
            return real(*args, on_tick=f, max_ticks=MAX_TICKS, **kwargs)

        monkeypatch.setattr(cluster, "run_cluster", with_fault)
        argv = ["serve-sim", "--conversations", "4", "--turns", "2", "--system-tokens", "32"]
        argv += ["--num-blocks", "128", "--backend", "torch", "--device", "cpu"]
        code = cli.main([*argv, "--replicas", "2", "--stall-timeout", "20", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["ok"], report
    assert report["accounted_exactly_once"] and report["served_exactly_once"]
    (failure,) = report["replica_failures"]
    assert failure["replica"] == 0 and "died" in failure["reason"]
    assert failure["rerouted"] and not failure["failed"] and failure["blocks_dropped"] > 0
    log = report["request_log"]
    assert [e["id"] for e in log] == IDS
    assert {e["id"] for e in log if e["status"] == "rerouted"} == set(failure["rerouted"])
    assert report["requests_served"] + report["requests_rerouted"] == len(IDS)
    assert report["mispredictions"] == 0


def test_when_no_replica_is_left_every_request_is_still_accounted_for() -> None:
    with fault(0, 1, signal.SIGKILL) as f:
        result = run_cluster(
            TURNS,
            CONFIG,
            replicas=1,
            router="kv",
            stall_timeout_s=STALL_S,
            on_tick=f,
            max_ticks=MAX_TICKS,
        )
    _check_accounting(result)
    assert result.failed and not result.served_exactly_once
    assert result.failed["c0t0"].attempts == (0,)
    assert "no replica left" in result.failed["c0t0"].reason
    # A turn that follows one that was not served fails with it, never placed.
    assert result.failed["c0t1"].attempts == ()
    assert "follows c0t0" in result.failed["c0t1"].reason


def test_fail_fast_aborts_with_a_clear_error() -> None:
    with fault(0, 1, signal.SIGKILL) as f, pytest.raises(ReplicaFailed) as info:
        run_cluster(
            TURNS, CONFIG, replicas=1, router="kv", fail_fast=True, on_tick=f, max_ticks=MAX_TICKS
        )
    message = str(info.value)
    assert "replica 0 died" in message and not message.endswith(": )")


class _ClosedPipe:
    def poll(self, timeout: float = 0.0) -> bool:
        return True

    def recv(self) -> Any:
        raise EOFError

    def close(self) -> None:
        pass


class _Exited:
    exitcode = -9
    pid = None

    def is_alive(self) -> bool:
        return True  # not yet reaped: the pipe's EOF is seen first

    def join(self, timeout: float | None = None) -> None:
        pass


def test_a_closed_pipe_is_named_never_an_empty_message() -> None:
    pool = ReplicaPool(1, CONFIG)
    pool._conns, pool.processes = [_ClosedPipe()], [_Exited()]  # type: ignore[list-item]
    with pytest.raises(ReplicaFailed) as info:
        pool._expect(0, "tick", time.monotonic() + 1)
    assert str(info.value) == "replica 0 died (exit code -9; pipe closed: EOFError)"


@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon"])
def test_a_bad_stall_timeout_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["serve-sim", "--replicas", "2", "--stall-timeout", value]) == 2
    assert "--stall-timeout: expected a number of seconds" in capsys.readouterr().err


def test_bad_fleet_arguments_are_typed_errors() -> None:
    bad: list[Callable[[], object]] = [
        lambda: run_cluster(TURNS, CONFIG, replicas=1, router="kv", stall_timeout_s=0),
        lambda: run_cluster(TURNS, CONFIG, replicas=1, router="kv", max_attempts=0),
        lambda: ReplicaPool(1, CONFIG, stall_timeout_s=-1),
    ]
    for call in bad:
        with pytest.raises(ValueError, match=r"stall timeout|max_attempts"):
            call()


def test_a_stale_replica_serves_by_turn_and_is_never_scored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replica 0's subscriber loses batch 2 for good (the replay never holds it): it is
    stale, not dropped. It keeps serving its round-robin share, placed by turn with no
    prediction, and its index is never consulted again."""
    from prefixkv.events import transport

    made: list[transport.EventSubscriber] = []

    class LosesBatch2(transport.EventSubscriber):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.loses = not made
            if self.loses:
                kwargs["drop"] = lambda frames: transport._seq(frames[1]) == 2
            super().__init__(*args, **kwargs)
            made.append(self)

        def _replay_from(self, start: int) -> tuple[int, int] | None:
            if self.loses and start == 2:  # gone from the publisher's buffer
                self.replays += 1
                return (2, 2)
            return super()._replay_from(start)

    monkeypatch.setattr(transport, "EventSubscriber", LosesBatch2)
    indexes: list[MirrorIndex] = []
    asked_when_stale: list[int] = []

    class Watched(MirrorIndex):
        def overlap(self, *args: Any, **kwargs: Any) -> int:
            if self is indexes[0] and made[0].stale:
                asked_when_stale.append(1)
            return super().overlap(*args, **kwargs)

    def index(_: int) -> MirrorIndex:
        indexes.append(Watched())
        return indexes[-1]

    result = run_cluster(
        TURNS,
        CONFIG,
        replicas=2,
        router="kv",
        index=index,
        stall_timeout_s=STALL_S,
        max_ticks=MAX_TICKS,
    )
    _check_accounting(result)
    assert result.served_exactly_once and not result.replica_failures
    assert made[0].stale and made[0].holes == 3
    by_turn = [r for r in result.requests.values() if r.by_turn]
    assert by_turn and all(r.replica == 0 and r.predicted_tokens == 0 for r in by_turn)
    assert not asked_when_stale
    assert cluster.report(result)["requests_by_turn"] == len(by_turn)
