"""Multi-replica serving: a KV-aware router over engine replicas that publish KV events.

``prefixkv serve-sim --replicas N --router {kv,round-robin}`` runs :func:`run_cluster`: N
replica processes (:mod:`prefixkv.events.replicas`), each with its own cache, publishing its
KV events over ZeroMQ; and the router, in this process, which subscribes to every replica,
feeds one index per replica (:mod:`prefixkv.events.router`) and places each request.

A multi-turn workload (:func:`prefixkv.serving.chat_turns`) is served in lock step: a turn
arrives at its arrival tick, or the tick after the turn it follows finished, wherever that
one ran; its prompt is that turn's prompt and output, then its own tokens.

Router accuracy. On every routed request the router records its prediction for the chosen
replica: the tokens the request will be served from cache (``predicted_tokens``), which its
index and the replica's match policy give (:class:`~prefixkv.events.router.MatchPolicy`:
the full-prompt cap, and for a hybrid model the deepest block with a checkpoint), and the
published prefix its index believes the replica holds (``predicted_blocks``). The replica
reports the tokens it actually served from cache at the request's admission
(``cached_tokens``). A request served fewer tokens than predicted, or more, is a
*misprediction*, whatever the mode: there is no exemption.

Two more records say where a misprediction comes from. The replica's
:class:`~prefixkv.events.replicas.Receipt` holds, on the request's arrival, the number of
batches it had published, the prefix it held and the hit its cache's match would have
given. When the router had applied fewer batches than that, events were in flight
(``in_flight``); when the index's published prefix differs from the one held, the index is
out of sync (an *index mismatch*); when the hit on arrival differs from the hit at
admission, the cache changed while the request waited in the replica's queue. After every
tick the router waits (with a timeout) until it has applied every batch each replica
reported published, so in lock step nothing is in flight at routing time.

A replica whose subscriber is stale (batches lost beyond the replay buffer) stays in the
fleet: the router places on it by round-robin turn, never on its index
(:mod:`prefixkv.events.router`), until its events are back in sync.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from prefixkv.spec import PrefixCacheError
from prefixkv.spec.results import CacheStats

from .replicas import (
    STALL_TIMEOUT_S,
    Finished,
    ReplicaFailed,
    ReplicaPool,
    ReplicaRequest,
)
from .router import (
    INDEXES,
    ROUTERS,
    DynamoZmqIndex,
    RouterConfigError,
    RouterIndex,
    make_index,
    make_router,
)

log = logging.getLogger(__name__)

__all__ = [
    "ClusterResult",
    "FailedRequest",
    "ReplicaFailure",
    "RoutedRequest",
    "RouterOutOfSync",
    "run_cluster",
]


class RouterOutOfSync(PrefixCacheError, RuntimeError):
    """The router could not apply a replica's published events in time (or lost them)."""


@attrs.frozen
class RoutedRequest:
    """A request that was served: where, what the router predicted, what it got."""

    request_id: str
    replica: int
    """The replica that served it."""
    predicted_blocks: int
    """The published prefix the router's index believed the replica held, in blocks."""
    served_blocks: int
    """The published prefix the replica held on arrival, in blocks."""
    in_flight: bool
    """Events were in flight between routing and arrival."""
    prompt_tokens: int
    predicted_tokens: int
    """The tokens the router predicted the request would be served from cache."""
    hit_tokens_on_arrival: int
    """The tokens the replica's cache would have served it on arrival."""
    cached_tokens: int
    """The tokens it was served from cache, at its admission."""
    ttft_s: float
    ttft_steps: int
    overlaps: tuple[int, ...]
    attempts: tuple[int, ...] = ()
    """Every replica it was placed on, in order; the last one served it."""
    by_turn: bool = False
    """Placed by round-robin turn on a replica whose subscriber was stale: the router
    predicted nothing for it (0 tokens), so any cache hit there is an under-prediction."""

    @property
    def mispredicted(self) -> bool:
        """Served fewer tokens from cache than predicted, or more."""
        return self.predicted_tokens != self.cached_tokens

    @property
    def index_mismatch(self) -> bool:
        """The index's published prefix differs from the one the replica held."""
        return self.predicted_blocks != self.served_blocks

    @property
    def status(self) -> str:
        """``served`` where it was first placed, or ``rerouted`` after a replica failed."""
        return "rerouted" if len(self.attempts) > 1 else "served"


@attrs.frozen
class FailedRequest:
    """A request that was not served: every replica it was placed on failed, or the turn it
    follows failed, or no replica was left."""

    request_id: str
    attempts: tuple[int, ...]
    reason: str


@attrs.frozen
class ReplicaFailure:
    """A replica the fleet dropped: when, why, and what it took with it."""

    replica: int
    tick: int
    reason: str
    blocks_dropped: int
    """Blocks its index held, removed so that no request is routed on them."""
    rerouted: tuple[str, ...]
    """Its unfinished requests, placed again on the live replicas."""
    failed: tuple[str, ...]
    """Its unfinished requests that had run out of attempts."""


@attrs.frozen
class ClusterResult:
    router: str
    index: str
    replicas: int
    requests: dict[str, RoutedRequest]
    """Every request that was served, once."""
    served_counts: dict[str, int]
    """How many times each request finished, over all replicas (1 for each, exactly)."""
    stats: tuple[CacheStats, ...]
    """Each replica's cache statistics, the last it reported (a dropped one's included)."""
    ticks: int
    wall_s: float
    busy_s: tuple[float, ...]
    """Each replica's model clock: the sum of its step times."""
    rejected_events: int
    replays: int
    failed: dict[str, FailedRequest] = attrs.field(factory=dict)
    """Every request that was not served."""
    replica_failures: tuple[ReplicaFailure, ...] = ()
    workload: tuple[str, ...] = ()
    """Every request id of the workload, in order."""
    index_settle_timeouts: int = 0
    """Ticks after which Dynamo's own consumer (``dynamo-zmq``) still held other blocks than
    a replica published, after the stall timeout: the router then placed on what it held."""

    @property
    def mispredictions(self) -> int:
        return sum(r.mispredicted for r in self.requests.values())

    @property
    def predicted_tokens(self) -> int:
        return sum(r.predicted_tokens for r in self.requests.values())

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from cache at the requests' admissions."""
        return sum(r.cached_tokens for r in self.requests.values())

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.requests.values())

    @property
    def prefill_tokens(self) -> int:
        return sum(s.prefill_tokens for s in self.stats)

    @property
    def prefill_tokens_skipped(self) -> int:
        return sum(s.prefill_tokens_skipped for s in self.stats)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from a cache over prompt tokens admitted, all replicas."""
        return self.prefill_tokens_skipped / self.prefill_tokens if self.prefill_tokens else 0.0

    @property
    def accounted_exactly_once(self) -> bool:
        """Every request of the workload is either served (once) or failed, never both."""
        served, failed = set(self.requests), set(self.failed)
        return (
            not served & failed
            and served | failed == set(self.workload)
            and self.served_counts == dict.fromkeys(served, 1)
        )

    @property
    def served_exactly_once(self) -> bool:
        """Every request of the workload was served, exactly once."""
        return self.accounted_exactly_once and not self.failed


def _sync(
    subs: Sequence[Any], published: dict[int, int], timeout_s: float, stale: list[bool]
) -> dict[int, str]:
    """Apply every batch each replica reported published; returns the replicas that could
    not be brought in sync within ``timeout_s``, and why.

    A replica whose subscriber is stale (a hole replay could not fill) is not one of them:
    it is marked in ``stale``, its batches are read until one brings it back in sync (an
    ``AllBlocksCleared``), and the router places on it by turn meanwhile (see
    :mod:`prefixkv.events.router`).
    """
    from .transport import ReplayGap

    deadline = time.monotonic() + timeout_s
    out: dict[int, str] = {}
    for i, target in published.items():
        sub = subs[i]
        if sub.stale:
            _drain_stale(sub)
            if not sub.stale:
                log.info("replica %d: its events are back in sync", i)
            stale[i] = sub.stale
            if sub.stale:
                continue
        try:
            while sub.last_seq + 1 < target:
                if not sub.poll(20):
                    # PUB/SUB may drop a batch (a late join) with no later one to show the
                    # gap: ask the replay endpoint for what the publisher holds.
                    sub.catch_up()
                if time.monotonic() > deadline:
                    out[i] = (
                        f"replica {i}: applied {sub.last_seq + 1} of {target} event batches "
                        f"after {timeout_s:g} s"
                    )
                    break
        except ReplayGap as exc:
            # NOTE: a hole replay could not fill makes the replica stale: it is healthy, and
            # serves by turn until its events are back in sync. A replay endpoint that does
            # not answer drops it. An event that breaks the stream's contract
            # (EventStreamError, WireError) is a bug, and stops the run.
            if sub.stale:
                log.warning("replica %d: %s; placing on it by turn until it resyncs", i, exc)
                stale[i] = True
            else:
                out[i] = f"replica {i}: {exc}"
    return out


def _drain_stale(sub: Any) -> None:
    """Read every batch a stale subscriber has received: each is refused (ReplayGap) until
    one brings it back in sync, and those after it are applied."""
    from .transport import ReplayGap

    while True:
        try:
            if not sub.poll(0):
                return
        except ReplayGap:
            continue  # that batch was read and refused: the next one may resync


def _dynamo_zmq(infos: Sequence[Any], policy: Any) -> tuple[Any, list[RouterIndex]]:
    """Dynamo's own ZMQ indexer, subscribed to every replica: the ``dynamo-zmq`` index."""
    if policy.hybrid:
        # NOTE: the replicas send their checkpoint events, prefixkv's own tags, which
        # Dynamo's decoder refuses with the whole batch.
        raise RouterConfigError(
            "Dynamo's ZMQ consumer cannot read a hybrid model's checkpoint events: use "
            "--index dynamo or mirror with --hybrid"
        )
    from .dynamo_zmq import DynamoIndexer

    indexer = DynamoIndexer(model=infos[0].namespace.model, block_size=policy.block_size)
    try:
        for i, info in enumerate(infos):
            indexer.register(i, info.endpoint, info.replay_endpoint)
    except PrefixCacheError:
        indexer.close()
        raise
    return indexer, [DynamoZmqIndex(indexer, i, policy.block_size) for i in range(len(infos))]


def run_cluster(
    turns: Sequence[Any],
    engine_config: Any,
    *,
    replicas: int,
    router: str,
    index: str | Callable[[int], RouterIndex] = "auto",
    max_ticks: int = 100_000,
    start_timeout_s: float = 180.0,
    stall_timeout_s: float = STALL_TIMEOUT_S,
    fail_fast: bool = False,
    max_attempts: int = 2,
    on_tick: Callable[[int, ReplicaPool], None] | None = None,
) -> ClusterResult:
    """Serve ``turns`` (:class:`prefixkv.engine.Turn`) on ``replicas`` engine processes.

    Args:
        turns: the workload.
        engine_config: every replica's :class:`~prefixkv.engine.EngineConfig`.
        replicas: how many replica processes.
        router: one of :data:`~prefixkv.events.router.ROUTERS`.
        index: one of :data:`~prefixkv.events.router.INDEXES`, or a factory that makes one
            index from the replicas' block size.
        max_ticks: a bound on the run.
        start_timeout_s: a bound on the replicas' start.
        stall_timeout_s: a replica that has not answered a tick (or whose events the router
            cannot apply) within this many seconds is stalled.
        fail_fast: raise on the first replica that fails, as a run without a fleet would.
            Otherwise the fleet drops it (its process is killed, its blocks leave the
            index), and places its unfinished requests again on the live replicas.
        max_attempts: how many replicas a request may be placed on before it fails.
        on_tick: called after every tick with the tick number and the pool (fault
            injection in tests, progress).

    Returns:
        The result: every request served once, or failed, and the replicas dropped.

    Raises:
        ReplicaFailed, RouterOutOfSync: with ``fail_fast``, the first failure; a replica
            that fails to start, always.
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise RouterConfigError(f"--replicas must be >= 1, got {replicas!r}")
    if router not in ROUTERS:
        raise RouterConfigError(f"unknown router {router!r}; expected one of {ROUTERS}")
    if isinstance(index, str) and index not in INDEXES:
        raise RouterConfigError(f"unknown router index {index!r}; expected one of {INDEXES}")
    if not stall_timeout_s > 0:
        raise RouterConfigError(f"the stall timeout must be > 0 s, got {stall_timeout_s!r}")
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise RouterConfigError(f"max_attempts must be >= 1, got {max_attempts!r}")
    ids = [t.request_id for t in turns]
    if len(set(ids)) != len(ids):
        raise RouterConfigError("request ids in a workload must be unique")
    unknown = sorted({t.follows for t in turns if t.follows is not None} - set(ids))
    if unknown:
        raise RouterConfigError(f"turns follow unknown requests {unknown[:4]}")
    from .transport import EventSubscriber

    start = time.perf_counter()
    pool = ReplicaPool(
        replicas, engine_config, start_timeout_s=start_timeout_s, stall_timeout_s=stall_timeout_s
    )
    subs: list[EventSubscriber] = []
    indexer: Any = None
    indexes: list[RouterIndex] = []
    try:
        infos = pool.start()
        namespace, match_policy = infos[0].namespace, infos[0].policy
        block_size = match_policy.block_size
        if any((i.namespace, i.policy) != (namespace, match_policy) for i in infos):
            raise ReplicaFailed("the replicas disagree on the namespace or the match policy")
        if index == "dynamo-zmq":
            indexer, indexes = _dynamo_zmq(infos, match_policy)
        else:
            indexes = [
                index(block_size) if callable(index) else make_index(index, block_size)
                for _ in infos
            ]
        for info, ix in zip(infos, indexes, strict=True):

            def feed(_: int, events: list[Any], ix: RouterIndex = ix) -> None:
                ix.apply(events)

            subs.append(
                EventSubscriber(
                    info.endpoint, info.replay_endpoint, topic=info.topic, on_batch=feed
                )
            )
        policy = make_router(router, indexes, match_policy)
        live = [True] * replicas
        stale = [False] * replicas  # subscribers that lost batches for good (see _sync)
        prompts: dict[str, tuple[int, ...]] = {}
        finished: dict[str, Finished] = {}
        served: dict[str, int] = {}
        placed: dict[str, tuple[int, Any, int]] = {}  # rid -> (replica, placement, seq)
        attempts: dict[str, list[int]] = {}
        failed: dict[str, FailedRequest] = {}
        failures: list[ReplicaFailure] = []
        receipts: dict[str, Any] = {}
        stats: list[CacheStats | None] = [None] * replicas
        loads = [0] * replicas
        pending = list(turns)
        retry: list[str] = []  # requests of dropped replicas, to place again
        busy = [0.0] * replicas
        tick = 0
        settle_timeouts = 0

        def drop(i: int, reason: str) -> None:
            """Replica ``i`` failed: forget its blocks, place its requests again."""
            if fail_fast:
                raise (RouterOutOfSync if reason.startswith("events:") else ReplicaFailed)(
                    reason.removeprefix("events: ")
                )
            live[i] = False
            pool.drop(i)
            blocks = indexes[i].drop()
            subs[i].close()
            mine = [r for r, (rep, _, _) in placed.items() if rep == i and r not in finished]
            again, lost = [], []
            for rid in mine:
                loads[i] -= 1
                if len(attempts[rid]) >= max_attempts or not any(live):
                    why = f"replica {i} failed ({reason}); " + (
                        f"placed on {len(attempts[rid])} replicas"
                        if any(live)
                        else "no replica left"
                    )
                    failed[rid] = FailedRequest(rid, tuple(attempts[rid]), why)
                    lost.append(rid)
                else:
                    again.append(rid)
            retry.extend(again)
            failures.append(ReplicaFailure(i, tick, reason, blocks, tuple(again), tuple(lost)))

        def place(rid: str, assignments: list[list[ReplicaRequest]], max_new: int) -> None:
            p = policy.place(namespace, prompts[rid], loads, live=live, stale=stale)
            placed[rid] = (p.replica, p, subs[p.replica].last_seq + 1)
            attempts.setdefault(rid, []).append(p.replica)
            loads[p.replica] += 1
            assignments[p.replica].append(ReplicaRequest(rid, prompts[rid], max_new))

        max_new = {t.request_id: t.max_new_tokens for t in turns}
        while pending or retry or any(r not in finished and r not in failed for r in placed):
            if tick >= max_ticks:
                raise RouterOutOfSync(f"workload not finished after {max_ticks} ticks")
            if not any(live):
                for rid in retry:
                    failed[rid] = FailedRequest(rid, tuple(attempts[rid]), "no replica left")
                for t in pending:  # in workload order: a turn after the one it follows
                    why = (
                        f"follows {t.follows}, which was not served"
                        if t.follows in failed
                        else "no replica left"
                    )
                    failed[t.request_id] = FailedRequest(t.request_id, (), why)
                retry, pending = [], []
                break
            assignments: list[list[ReplicaRequest]] = [[] for _ in range(replicas)]
            for rid in retry:
                place(rid, assignments, max_new[rid])
            retry = []
            still = []
            for t in pending:
                parent = t.follows
                if parent is not None and parent in failed:
                    failed[t.request_id] = FailedRequest(
                        t.request_id, (), f"follows {parent}, which was not served"
                    )
                    continue
                if tick < t.arrival_step or (parent is not None and parent not in finished):
                    still.append(t)
                    continue
                history = () if parent is None else prompts[parent] + finished[parent].output
                prompts[t.request_id] = (*history, *t.tokens)
                place(t.request_id, assignments, t.max_new_tokens)
            pending = still
            dead: dict[int, str] = {}
            if fail_fast:
                reports = pool.tick(assignments)
            else:
                reports, dead = pool.tick_surviving(assignments)
            for rep in reports:
                busy[rep.replica] = rep.step_s
                stats[rep.replica] = rep.stats
                for rc in rep.receipts:
                    receipts[rc.request_id] = rc
                for f in rep.finished:
                    served[f.request_id] = served.get(f.request_id, 0) + 1
                    finished[f.request_id] = f
                    loads[rep.replica] -= 1
            for i, reason in dead.items():
                drop(i, reason)
            published = {rep.replica: rep.next_seq for rep in reports}
            behind = _sync(subs, published, stall_timeout_s, stale)
            for i, reason in behind.items():
                drop(i, f"events: {reason}")
            if indexer is not None:
                # Dynamo's consumer applies the same batches on its own, asynchronously:
                # route only once its tree holds what each replica published (or, after the
                # stall timeout, on what it holds, its mispredictions counted).
                for i, ix in enumerate(indexes):
                    if live[i] and not stale[i] and isinstance(ix, DynamoZmqIndex):
                        settle_timeouts += not ix.settle(subs[i].mirror.blocks, stall_timeout_s)
            # Every request placed and not yet finished is on a live replica, or waits to be
            # placed again: a dropped replica never takes a request with it silently.
            lost = [
                r
                for r, (rep, _, _) in placed.items()
                if r not in finished and r not in failed and not live[rep] and r not in retry
            ]
            if lost:
                raise RouterOutOfSync(
                    f"requests {lost[:4]} are on a dropped replica, not re-routed"
                )
            if on_tick is not None:
                on_tick(tick, pool)
            tick += 1
        pool.stop()
        decode_failures = 0 if indexer is None else indexer.decode_failures()
    finally:
        for sub in subs:
            sub.close()
        pool.close()
        if indexer is not None:
            indexer.close()
    routed = {}
    for rid in ids:
        if rid in failed:
            continue
        replica, p, seq = placed[rid]
        rc, f = receipts[rid], finished[rid]
        routed[rid] = RoutedRequest(
            rid,
            replica,
            p.predicted_blocks,
            rc.served_blocks,
            rc.seq != seq,
            f.prompt_tokens,
            p.predicted_tokens,
            rc.hit_tokens,
            f.cached_tokens,
            f.ttft_s,
            f.ttft_steps,
            p.overlaps,
            tuple(attempts[rid]),
            p.by_turn,
        )
    return ClusterResult(
        router=router,
        index=indexes[0].kind,
        replicas=replicas,
        requests=routed,
        served_counts=served,
        stats=tuple(s for s in stats if s is not None),
        ticks=tick,
        wall_s=time.perf_counter() - start,
        busy_s=tuple(busy),
        rejected_events=sum(ix.rejected for ix in indexes) + decode_failures,
        replays=sum(s.replays for s in subs),
        failed={rid: failed[rid] for rid in ids if rid in failed},
        replica_failures=tuple(failures),
        index_settle_timeouts=settle_timeouts,
        workload=tuple(ids),
    )


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def report(result: ClusterResult) -> dict[str, Any]:
    """The ``--json`` object of a multi-replica run (without the workload, which the caller
    adds)."""
    reqs = list(result.requests.values())
    ttft = [r.ttft_s * 1e3 for r in reqs]
    per_replica = [0] * result.replicas
    for r in reqs:
        per_replica[r.replica] += 1
    return {
        "router": result.router,
        "index": result.index,
        "replicas": result.replicas,
        "requests": len(result.workload) or len(reqs),
        "requests_served": sum(r.status == "served" for r in reqs),
        "requests_rerouted": sum(r.status == "rerouted" for r in reqs),
        "requests_failed": len(result.failed),
        "accounted_exactly_once": result.accounted_exactly_once,
        "served_exactly_once": result.served_exactly_once,
        "requests_per_replica": per_replica,
        "hit_rate": result.hit_rate,
        "prefill_tokens": result.prefill_tokens,
        "prefill_tokens_skipped": result.prefill_tokens_skipped,
        "prefill_tokens_computed": result.prefill_tokens - result.prefill_tokens_skipped,
        "ttft_ms_p50": _percentile(ttft, 0.5),
        "ttft_ms_p90": _percentile(ttft, 0.9),
        "ttft_steps_p50": statistics.median(r.ttft_steps for r in reqs) if reqs else 0,
        "routed_in_flight": result.in_flight,
        "requests_by_turn": sum(r.by_turn for r in reqs),
        "predicted_tokens": result.predicted_tokens,
        "cached_tokens": result.cached_tokens,
        "mispredictions": result.mispredictions,
        "mispredicted_under": sum(r.cached_tokens < r.predicted_tokens for r in reqs),
        "mispredicted_over": sum(r.cached_tokens > r.predicted_tokens for r in reqs),
        "index_mismatches": sum(r.index_mismatch for r in reqs),
        "changed_while_queued": sum(r.hit_tokens_on_arrival != r.cached_tokens for r in reqs),
        "rejected_events": result.rejected_events,
        "index_settle_timeouts": result.index_settle_timeouts,
        "replays": result.replays,
        "ticks": result.ticks,
        "replica_busy_s": list(result.busy_s),
        "wall_s": result.wall_s,
        "times": "CPU-model times: each replica's step times, not wall time",
        "replica_failures": [attrs.asdict(f) for f in result.replica_failures],
        "request_log": _request_log(result),
    }


def _request_log(result: ClusterResult) -> list[dict[str, Any]]:
    """Every request of the workload once, in order: served, re-routed or failed."""
    out: list[dict[str, Any]] = []
    for rid in result.workload or tuple(result.requests):
        if rid in result.failed:
            f = result.failed[rid]
            out.append(
                {"id": rid, "status": "failed", "replicas": list(f.attempts), "reason": f.reason}
            )
            continue
        r = result.requests[rid]
        out.append(
            {
                "id": rid,
                "status": r.status,
                "replicas": list(r.attempts) or [r.replica],
                "predicted_tokens": r.predicted_tokens,
                "cached_tokens": r.cached_tokens,
            }
        )
    return out


def figures(
    out_dir: Any,
    *,
    replicas: int = 4,
    repeats: int = 5,
    extra: Sequence[str] = (),
    name: str = "routing",
) -> Any:
    """Run ``serve-sim --replicas N`` for both routers, ``repeats`` times each, each run in a
    fresh process (the two routers alternate, so a change in the machine's load hits both);
    write ``{name}.json`` and ``{name}.png`` under ``out_dir``; return the JSON path.

    Hit rates, tokens and mispredictions are deterministic (lock step); TTFT is a time, so
    it is reported as the median over the runs of each run's p50 and p90, with the range.
    """
    import json
    import os
    import platform
    import subprocess
    import sys
    from pathlib import Path

    out = Path(out_dir)
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict[str, Any]]] = {r: [] for r in ROUTERS}
    for _ in range(repeats):
        for router in ROUTERS:
            argv = [sys.executable, "-m", "prefixkv", "serve-sim", "--replicas", str(replicas)]
            argv += ["--router", router, "--json", *extra]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RouterOutOfSync(f"{' '.join(argv[2:])} failed: {done.stderr[-2000:]}")
            runs[router].append(json.loads(done.stdout))
    load_after = os.getloadavg()[0]
    summary: dict[str, Any] = {
        "machine": f"{platform.machine()}, {platform.system()}, {os.cpu_count()} CPU cores",
        "load_average": [round(load_before, 1), round(load_after, 1)],
        "times": "CPU-model times: each replica's step times, not wall time",
        "replicas": replicas,
        "repeats": repeats,
        "argv_extra": list(extra),
        "routers": {},
    }
    for router, rs in runs.items():
        first = rs[0]
        for key in ("hit_rate", "prefill_tokens_skipped", "predicted_tokens", "mispredictions"):
            if any(r[key] != first[key] for r in rs):
                raise RouterOutOfSync(f"{router}: {key} differs between runs of one workload")
        p50 = [r["ttft_ms_p50"] for r in rs]
        p90 = [r["ttft_ms_p90"] for r in rs]
        summary["routers"][router] = {
            "index": first["index"],
            "requests": first["requests"],
            "requests_per_replica": first["requests_per_replica"],
            "hit_rate": first["hit_rate"],
            "prefill_tokens": first["prefill_tokens"],
            "prefill_tokens_skipped": first["prefill_tokens_skipped"],
            "prefill_tokens_computed": first["prefill_tokens_computed"],
            "predicted_tokens": first["predicted_tokens"],
            "cached_tokens": first["cached_tokens"],
            "mispredictions": first["mispredictions"],
            "ttft_steps_p50": first["ttft_steps_p50"],
            "ttft_ms_p50_median": statistics.median(p50),
            "ttft_ms_p50_range": [min(p50), max(p50)],
            "ttft_ms_p90_median": statistics.median(p90),
            "ttft_ms_p90_range": [min(p90), max(p90)],
            "wall_s_median": statistics.median(r["wall_s"] for r in rs),
        }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    _plot_comparison(summary, out / f"{name}.png")
    return path


def _plot_comparison(summary: dict[str, Any], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = summary["routers"]
    names = list(rs)
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.6))
    axes[0].bar(names, [rs[n]["hit_rate"] * 100 for n in names], color=["C0", "C7"])
    axes[0].set_ylabel("hit rate (% of prompt tokens)")
    axes[1].bar(names, [rs[n]["prefill_tokens_computed"] for n in names], color=["C0", "C7"])
    axes[1].set_ylabel("prefill tokens computed")
    for k, (q, offset) in enumerate((("p50", -0.18), ("p90", 0.18))):
        med = [rs[n][f"ttft_ms_{q}_median"] for n in names]
        lo = [m - rs[n][f"ttft_ms_{q}_range"][0] for m, n in zip(med, names, strict=True)]
        hi = [rs[n][f"ttft_ms_{q}_range"][1] - m for m, n in zip(med, names, strict=True)]
        axes[2].bar(
            [i + offset for i in range(len(names))],
            med,
            width=0.34,
            yerr=[lo, hi],
            capsize=3,
            color=f"C{k + 1}",
            label=f"TTFT {q}",
        )
    axes[2].set_xticks(range(len(names)), names)
    axes[2].set_ylabel("ms, CPU-model time (median, range)")
    axes[2].legend()
    fig.suptitle(
        f"serve-sim {' '.join(summary['argv_extra'])}, {summary['replicas']} replicas, "
        f"chat workload; {summary['repeats']} runs per router ({summary['machine']})",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=figures.__doc__)
    parser.add_argument("--out", default="docs/bench")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hybrid", action="store_true", help="serve the hybrid model")
    ns = parser.parse_args()
    print(
        figures(
            ns.out,
            replicas=ns.replicas,
            repeats=ns.repeats,
            extra=("--hybrid",) if ns.hybrid else (),
            name="routing-hybrid" if ns.hybrid else "routing",
        )
    )
