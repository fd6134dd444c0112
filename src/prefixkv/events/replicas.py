"""Engine replicas as separate processes, each publishing its KV events over ZeroMQ.

Each replica is a spawned process that owns one :class:`prefixkv.engine.Engine` (its own
scheduler, tiny model, KV pool and prefix cache, built with ``record_events=True``) and one
:class:`~prefixkv.events.transport.EventPublisher`. It talks to the router over a pipe, and
its KV events go over ZeroMQ alone, in vLLM's wire format: the router learns what a replica
caches only from its events, as a cluster router does.

The replicas run in lock step with the router, one *tick* at a time: the router sends each
replica the requests it placed on it, and every replica

1. takes each new request in, recording for it a :class:`Receipt`: the number of event
   batches it had published (every event up to this point is published, since a replica
   publishes after each step and nothing else changes its cache), the prefix it holds
   for the request (:func:`~prefixkv.spec.event_mirror.served_prefix_blocks`) and the hit
   its cache's match would give it on arrival;
2. runs one engine step, timed (the replica's *model clock* advances by the CPU time the
   step took on the replica's thread);
3. publishes the step's events as one batch, and answers with a :class:`TickReport`.

NOTE: lock step keeps the simulation deterministic (placement, hits and tokens do not depend
on how the OS schedules the processes) and makes times CPU-model times: a request's time to
first token is the sum of its replica's step times from its arrival to its first token, not
the wall time, which on a shared machine would mostly measure the other replicas.

Every wait has a timeout. A replica that raises reports the error before it exits; one that
dies is noticed within the poll interval; one that stalls (stopped, or stuck in a step) is
noticed when it has not answered a tick within ``stall_timeout_s``. Either is a
:class:`ReplicaFailed`, never a hang. :meth:`ReplicaPool.tick` raises it (the fail-fast
path); :meth:`ReplicaPool.tick_surviving` drops the failed replicas instead (kills the
process, closes its pipe) and carries on with the others, as a fleet that survives a
replica's death does (:mod:`prefixkv.events.cluster`).
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

import attrs

from prefixkv.spec import Namespace, PrefixCacheError
from prefixkv.spec.results import CacheStats

from .router import MatchPolicy, RouterConfigError

__all__ = [
    "STALL_TIMEOUT_S",
    "Finished",
    "Receipt",
    "ReplicaFailed",
    "ReplicaInfo",
    "ReplicaPool",
    "ReplicaRequest",
    "TickReport",
    "replica_main",
]

_POLL_S = 0.05
#: How long a replica may take to answer one tick before it counts as stalled.
STALL_TIMEOUT_S = 10.0


class ReplicaFailed(PrefixCacheError, RuntimeError):
    """A replica process raised, died, or did not answer in time."""


@attrs.frozen
class ReplicaRequest:
    """A request as the router sends it: the whole prompt (history included)."""

    request_id: str
    prompt: tuple[int, ...]
    max_new_tokens: int


@attrs.frozen
class ReplicaInfo:
    """A replica's hello: where its events are published, how its blocks are keyed, and how
    its cache turns a published prefix into a hit."""

    endpoint: str
    replay_endpoint: str
    topic: bytes
    namespace: Namespace
    policy: MatchPolicy

    @property
    def block_size(self) -> int:
        return self.policy.block_size


@attrs.frozen
class Receipt:
    """A request as the replica found it on arrival."""

    request_id: str
    seq: int
    """Event batches the replica had published when the request arrived."""
    served_blocks: int
    """Leading blocks of the prompt the replica held (published) when it arrived."""
    hit_tokens: int
    """Prompt tokens its cache's match would serve from cache on arrival (caps, checkpoints)."""


@attrs.frozen
class Finished:
    request_id: str
    output: tuple[int, ...]
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens served from the cache at the first admission."""
    ttft_s: float
    """Model-clock time from arrival to the first token (the replica's step times)."""
    ttft_steps: int


@attrs.frozen
class TickReport:
    replica: int
    next_seq: int
    """Event batches published so far (the router's subscriber must reach this)."""
    step_s: float
    receipts: tuple[Receipt, ...]
    finished: tuple[Finished, ...]
    stats: CacheStats
    """The replica's cache statistics after the step: what is known of it if it dies."""


def replica_main(replica: int, config: Any, conn: Connection) -> None:
    """The replica process: serve ticks until told to stop (see the module doc)."""
    publisher = None
    try:
        import attrs as _attrs

        from prefixkv.engine import Engine
        from prefixkv.engine.draft import RECOMPUTE_BLOCKS
        from prefixkv.spec.event_mirror import served_prefix_blocks

        from .transport import EventPublisher

        engine = Engine(_attrs.evolve(config, record_events=True, cache_enabled=True))
        publisher = EventPublisher(topic=f"replica-{replica}".encode(), checkpoint_events=True)
        conn.send(
            (
                "ready",
                ReplicaInfo(
                    publisher.endpoint,
                    publisher.replay_endpoint,
                    publisher.topic,
                    engine.namespace,
                    MatchPolicy(
                        engine.config.block_size,
                        hybrid=engine.hybrid is not None,
                        recompute_blocks=RECOMPUTE_BLOCKS if engine.speculative else 0,
                    ),
                ),
            )
        )
        clock, steps = 0.0, 0
        arrived: dict[str, tuple[float, int]] = {}
        first: dict[str, tuple[float, int]] = {}
        while True:
            kind, payload = conn.recv()
            if kind == "stop":
                conn.send(("stats", engine.cache.stats()))
                return
            receipts = []
            for r in payload:
                request = engine.request(r.request_id, r.prompt, r.max_new_tokens)
                served = served_prefix_blocks(
                    engine.cache.snapshot(), engine.namespace, r.prompt, request.spans
                )
                hit = engine.cache.match(request.cache_request(engine.namespace, r.prompt))
                receipts.append(
                    Receipt(r.request_id, publisher.next_seq, served, hit.num_cached_tokens)
                )
                engine.add(request)
                arrived[r.request_id] = (clock, steps)
            # NOTE: the thread's CPU time, not the wall time: on a shared machine the wall
            # time of a step mostly measures who else had the cores. torch runs on this
            # thread (cpu_threads=1), so this is the step's compute.
            start = time.thread_time()
            engine.step()
            clock += time.thread_time() - start
            steps += 1
            publisher.publish(engine.cache.take_events())
            done = []
            for rid in list(arrived):
                g = engine.scheduler.generation(rid)
                if rid not in first and g.output:
                    first[rid] = (clock, steps)
                if g.finished:
                    (t0, s0), (t1, s1) = arrived.pop(rid), first.pop(rid)
                    done.append(
                        Finished(
                            rid,
                            g.output,
                            len(g.request.prompt),
                            g.num_cached_at_admission,
                            t1 - t0,
                            s1 - s0,
                        )
                    )
            conn.send(
                (
                    "tick",
                    TickReport(
                        replica,
                        publisher.next_seq,
                        clock,
                        tuple(receipts),
                        tuple(done),
                        engine.cache.stats(),
                    ),
                )
            )
    except BaseException as exc:  # report, then exit: the router raises ReplicaFailed
        import contextlib

        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if publisher is not None:
            publisher.close()
        conn.close()


class ReplicaPool:
    """``n`` replica processes (spawned), driven tick by tick; a context manager.

    ``start_timeout_s`` bounds the start of all replicas (importing torch and building the
    engine); ``stall_timeout_s`` each answer after that: a replica that has not answered
    within it is stalled. :attr:`alive` says which replicas are still in the pool.
    """

    def __init__(
        self,
        n: int,
        config: Any,
        *,
        start_timeout_s: float = 180.0,
        stall_timeout_s: float = STALL_TIMEOUT_S,
    ) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise RouterConfigError(f"need at least one replica, got {n!r}")
        if not stall_timeout_s > 0:
            raise RouterConfigError(f"the stall timeout must be > 0 s, got {stall_timeout_s!r}")
        self.n = n
        self.config = config
        self.start_timeout_s = start_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.processes: list[BaseProcess] = []
        self.infos: list[ReplicaInfo] = []
        self.alive: list[bool] = []
        self._conns: list[Connection] = []

    def __enter__(self) -> ReplicaPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> list[ReplicaInfo]:
        """Spawn the replicas and wait for every hello; returns them, in replica order."""
        ctx = multiprocessing.get_context("spawn")
        for i in range(self.n):
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=replica_main, args=(i, self.config, child), name=f"prefixkv-replica-{i}"
            )
            p.daemon = True
            p.start()
            child.close()
            self.processes.append(p)
            self._conns.append(parent)
        self.alive = [True] * self.n
        deadline = time.monotonic() + self.start_timeout_s
        try:
            self.infos = [self._expect(i, "ready", deadline, "start") for i in range(self.n)]
        except BaseException:
            self.close()
            raise
        return self.infos

    def _expect(self, i: int, kind: str, deadline: float, what: str = "tick") -> Any:
        """The next message of replica ``i``, which must be ``kind``; or ReplicaFailed."""
        conn, proc = self._conns[i], self.processes[i]
        while not conn.poll(_POLL_S):
            if not proc.is_alive():
                # It may have sent its error just before exiting.
                if conn.poll(0):
                    break
                raise ReplicaFailed(f"replica {i} died (exit code {proc.exitcode})")
            if time.monotonic() > deadline:
                timeout = self.start_timeout_s if what == "start" else self.stall_timeout_s
                raise ReplicaFailed(
                    f"replica {i} stalled: no answer to its {what} within {timeout:g} s"
                )
        try:
            got, payload = conn.recv()
        except (EOFError, OSError) as exc:
            proc.join(timeout=1.0)  # the pipe closes as the process exits: say how it ended
            # NOTE: an EOFError's message is empty; name the exception, never print "()".
            raise ReplicaFailed(
                f"replica {i} died (exit code {proc.exitcode}; pipe closed: "
                f"{str(exc) or type(exc).__name__})"
            ) from None
        if got == "error":
            raise ReplicaFailed(f"replica {i} failed: {payload}")
        if got != kind:
            raise ReplicaFailed(f"replica {i} sent {got!r}, expected {kind!r}")
        return payload

    def _send(self, i: int, message: tuple[str, Any]) -> None:
        try:
            self._conns[i].send(message)
        except (BrokenPipeError, OSError) as exc:
            raise ReplicaFailed(
                f"replica {i} died (exit code {self.processes[i].exitcode}): "
                f"{str(exc) or type(exc).__name__}"
            ) from None

    def tick(self, assignments: Sequence[Sequence[ReplicaRequest]]) -> list[TickReport]:
        """Send every replica its new requests, run one step on each, return the reports.

        Args:
            assignments: the new requests of each replica, one list per replica.

        Returns:
            Every replica's report, in replica order.

        Raises:
            ReplicaFailed: the first replica that raised, died or stalled.
        """
        reports, failed = self._tick(assignments, survive=False)
        assert not failed
        return reports

    def tick_surviving(
        self, assignments: Sequence[Sequence[ReplicaRequest]]
    ) -> tuple[list[TickReport], dict[int, str]]:
        """One tick on every live replica; a replica that fails is dropped, not raised.

        Args:
            assignments: the new requests of each replica, one list per replica (those of
                a dropped replica must be empty).

        Returns:
            The reports of the replicas that answered, in replica order, and for each
            replica dropped in this tick, why. A dropped replica's process is killed.
        """
        return self._tick(assignments, survive=True)

    def _tick(
        self, assignments: Sequence[Sequence[ReplicaRequest]], *, survive: bool
    ) -> tuple[list[TickReport], dict[int, str]]:
        if len(assignments) != self.n:
            raise ReplicaFailed(f"{len(assignments)} assignment lists for {self.n} replicas")
        failed: dict[int, str] = {}
        for i, requests in enumerate(assignments):
            if not self.alive[i]:
                if requests:
                    raise ReplicaFailed(f"requests assigned to replica {i}, which was dropped")
                continue
            try:
                self._send(i, ("tick", tuple(requests)))
            except ReplicaFailed as exc:
                if not survive:
                    raise
                failed[i] = str(exc)
        deadline = time.monotonic() + self.stall_timeout_s
        reports: list[TickReport] = []
        for i in range(self.n):
            if not self.alive[i] or i in failed:
                continue
            try:
                reports.append(self._expect(i, "tick", deadline))
            except ReplicaFailed as exc:
                if not survive:
                    raise
                failed[i] = str(exc)
        for i in failed:
            self.drop(i)
        return reports, failed

    def drop(self, i: int) -> None:
        """Take a replica out of the pool: close its pipe, kill its process (a stopped
        process too: SIGKILL needs no cooperation), reap it; idempotent.

        Args:
            i: the replica's number.
        """
        if not self.alive[i]:
            return
        self.alive[i] = False
        self._conns[i].close()
        proc = self.processes[i]
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=5.0)

    def stop(self) -> dict[int, CacheStats]:
        """Stop every live replica; returns each one's final cache statistics."""
        live = [i for i in range(self.n) if self.alive[i]]
        for i in live:
            self._send(i, ("stop", None))
        deadline = time.monotonic() + self.stall_timeout_s
        stats: dict[int, CacheStats] = {i: self._expect(i, "stats", deadline) for i in live}
        self.close()
        return stats

    def close(self) -> None:
        """Join every replica (briefly), kill the ones that do not exit; idempotent."""
        for conn in self._conns:
            conn.close()
        for p in self.processes:
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join(timeout=2.0)
        self._conns = []
        self.processes = []
        self.alive = [False] * self.n
