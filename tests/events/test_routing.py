"""Multi-replica routing: engine replicas as processes, a KV-aware router fed by their events.

The end-to-end runs are tiny (2 replicas, 8 requests) and share one module-scoped result
per router: every request is served exactly once, KV routing hits at least as often as
round-robin on a workload with shared prefixes, and on every request the router predicts
exactly the tokens the chosen replica serves from cache (and the prefix it held), on the
plain model and on the hybrid one, whose hit ends at a checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs
import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgspec")
pytest.importorskip("torch")

from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import KVEvent, Namespace, Request
from prefixkv.spec.errors import PrefixCacheError
from prefixkv.spec.multimodal import MultimodalSpan

from prefixkv import cli
from prefixkv.engine import EngineConfig, ModelConfig
from prefixkv.engine.policy import SchedulerConfig
from prefixkv.events.cluster import ClusterResult, run_cluster
from prefixkv.events.replicas import ReplicaFailed, ReplicaPool, ReplicaRequest
from prefixkv.events.router import (
    KVRouter,
    MatchPolicy,
    MirrorIndex,
    RoundRobinRouter,
    RouterConfigError,
    RouterIndex,
    default_index,
    make_index,
    make_router,
)
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


@pytest.fixture(scope="module")
def kv_run() -> ClusterResult:
    return run_cluster(TURNS, CONFIG, replicas=2, router="kv")


@pytest.fixture(scope="module")
def rr_run() -> ClusterResult:
    # The other index than the kv run's when Dynamo is installed: both paths run end to end.
    return run_cluster(TURNS, CONFIG, replicas=2, router="round-robin", index="mirror")


def _check_run(result: ClusterResult) -> None:
    ids = {t.request_id for t in TURNS}
    assert set(result.requests) == ids
    assert result.served_counts == dict.fromkeys(ids, 1)
    assert result.served_exactly_once
    assert result.mispredictions == 0
    for r in result.requests.values():
        assert r.predicted_tokens == r.cached_tokens == r.hit_tokens_on_arrival
        assert not r.index_mismatch
    assert result.predicted_tokens == result.cached_tokens == result.prefill_tokens_skipped
    assert result.in_flight == 0  # lock step: nothing is in flight at routing time
    assert result.rejected_events == 0
    # INV-STATS across the replicas, and the hit rate is the replicas' own.
    assert sum(s.prefill_tokens_computed for s in result.stats) + (
        result.prefill_tokens_skipped
    ) == (result.prefill_tokens)
    assert 0.0 <= result.hit_rate <= 1.0


def test_kv_routing_serves_every_request_once_and_predicts_exactly(
    kv_run: ClusterResult,
) -> None:
    _check_run(kv_run)
    assert kv_run.index == default_index()
    # Follow-up turns carry their history: the router sends each to its conversation's
    # replica, which holds the whole previous prompt.
    followups = [r for rid, r in kv_run.requests.items() if not rid.endswith("t0")]
    assert followups and all(r.predicted_blocks > 0 for r in followups)
    for r in kv_run.requests.values():
        assert r.predicted_blocks == max(r.overlaps)


def test_round_robin_is_the_baseline(rr_run: ClusterResult, kv_run: ClusterResult) -> None:
    _check_run(rr_run)
    assert rr_run.index == "mirror"
    placed = [r.replica for r in sorted(rr_run.requests.values(), key=lambda r: r.request_id)]
    assert sorted(placed.count(i) for i in range(2)) == [4, 4]
    assert kv_run.hit_rate >= rr_run.hit_rate
    assert kv_run.prefill_tokens_skipped >= rr_run.prefill_tokens_skipped
    assert kv_run.prefill_tokens == rr_run.prefill_tokens  # the same prompts


class _OneBatchLate(MirrorIndex):
    """A router index that applies each batch one batch late, as if every event were still
    in flight while the router believed it in sync: its predictions go stale."""

    def __init__(self) -> None:
        super().__init__()
        self._held: list[KVEvent] = []

    def apply(self, events: Sequence[KVEvent]) -> None:
        super().apply(self._held)
        self._held = list(events)


def test_a_stale_index_is_counted_as_mispredictions() -> None:
    """The accuracy check can fail: follow-up turns find less than the replica holds."""
    result = run_cluster(TURNS, CONFIG, replicas=1, router="kv", index=lambda _: _OneBatchLate())
    assert result.served_exactly_once
    assert result.mispredictions > 0
    wrong = [r for r in result.requests.values() if r.mispredicted]
    assert all(r.predicted_tokens < r.cached_tokens for r in wrong)
    assert all(r.index_mismatch for r in wrong)


# -- hybrid models: the hit ends at a checkpoint -------------------------------------------

HYBRID = attrs.evolve(CONFIG, model=ModelConfig(hybrid=True))


class _CheckpointBlind(MirrorIndex):
    """A router index that ignores the checkpoint events, as if every published block could
    be restored: what a router that models only the published prefix predicts."""

    def checkpoints(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        num_blocks: int,
        spans: Sequence[MultimodalSpan] = (),
    ) -> tuple[bool, ...]:
        return (True,) * num_blocks


def test_hybrid_routing_predicts_the_restorable_prefix_exactly() -> None:
    result = run_cluster(TURNS, HYBRID, replicas=2, router="kv")
    _check_run(result)
    # Some follow-up turns hold more published blocks than they can restore: the
    # prediction follows the checkpoint, not the published prefix.
    assert any(r.predicted_tokens < r.predicted_blocks * 8 for r in result.requests.values())
    assert result.cached_tokens > 0


def test_a_router_blind_to_checkpoints_is_counted_as_mispredictions() -> None:
    """Served fewer tokens than predicted is a misprediction, on a hybrid model too."""
    result = run_cluster(TURNS, HYBRID, replicas=1, router="kv", index=lambda _: _CheckpointBlind())
    assert result.served_exactly_once and result.mispredictions > 0
    wrong = [r for r in result.requests.values() if r.mispredicted]
    assert all(r.cached_tokens < r.predicted_tokens and not r.index_mismatch for r in wrong)
    assert result.cached_tokens < result.predicted_tokens


def test_match_policy_models_the_caps_and_the_checkpoints() -> None:
    plain = MatchPolicy(4)
    assert plain.hit_blocks(3, 13) == 3
    assert plain.hit_blocks(3, 12) == 2  # choice 4: one prompt token is computed
    assert MatchPolicy(4, recompute_blocks=1).hit_blocks(3, 13) == 2  # choice 6
    image = [MultimodalSpan(6, 14, "image", b"x")]
    assert plain.hit_blocks(3, 16, image) == 1  # choice 5: no cut inside the image
    hybrid = MatchPolicy(4, hybrid=True)
    marks = (True, False, False)
    assert hybrid.hit_blocks(3, 13, (), marks.__getitem__) == 1
    assert hybrid.hit_blocks(3, 13, (), ((False,) * 3).__getitem__) == 0
    assert hybrid.hit_blocks(3, 13, (), ((True,) * 3).__getitem__) == 3
    with pytest.raises(RouterConfigError):
        hybrid.hit_blocks(3, 13)


# -- the policy and the indexes, in process --------------------------------------------------


class _Fixed:
    kind = "fixed"
    rejected = 0

    def __init__(self, n: int, checkpoints: Sequence[int] = ()) -> None:
        self.n = n
        self.marks = set(checkpoints)

    def apply(self, events: Sequence[KVEvent]) -> None:
        pass

    def overlap(
        self, namespace: Namespace, token_ids: Sequence[int], spans: Sequence[MultimodalSpan] = ()
    ) -> int:
        return self.n

    def checkpoints(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        num_blocks: int,
        spans: Sequence[MultimodalSpan] = (),
    ) -> tuple[bool, ...]:
        return tuple(j in self.marks for j in range(num_blocks))

    def drop(self) -> int:
        held, self.n = self.n, 0
        return held


NS = Namespace("m")
PROMPT = list(range(10))
ONE = MatchPolicy(1)


def _fixed(*ns: int) -> list[RouterIndex]:
    return [_Fixed(n) for n in ns]


def test_kv_router_longest_prefix_then_load_then_lowest() -> None:
    assert KVRouter(_fixed(1, 3, 2), ONE).place(NS, PROMPT, [0, 9, 0]).replica == 1
    assert KVRouter(_fixed(3, 3, 2), ONE).place(NS, PROMPT, [5, 4, 0]).replica == 1
    assert KVRouter(_fixed(3, 3, 3), ONE).place(NS, PROMPT, [1, 1, 1]).replica == 0
    p = KVRouter(_fixed(0, 2), ONE).place(NS, PROMPT, [0, 0])
    assert (p.replica, p.predicted_blocks, p.predicted_tokens, p.overlaps) == (1, 2, 2, (0, 2))
    # The whole prompt cached: one token is still computed, so the hit is capped.
    assert KVRouter(_fixed(10), ONE).place(NS, PROMPT, [0]).predicted_tokens == 9


def test_kv_router_ranks_hybrid_replicas_by_the_restorable_prefix() -> None:
    hybrid = MatchPolicy(1, hybrid=True)
    # Replica 0 publishes more, but replica 1 can restore more.
    indexes: list[RouterIndex] = [_Fixed(6, [1]), _Fixed(4, [3])]
    p = KVRouter(indexes, hybrid).place(NS, PROMPT, [0, 0])
    assert (p.replica, p.predicted_tokens, p.hits, p.overlaps) == (1, 4, (2, 4), (6, 4))


def test_routers_skip_a_dropped_replica() -> None:
    assert (
        KVRouter(_fixed(1, 3, 2), ONE)
        .place(NS, PROMPT, [0, 0, 0], live=[True, False, True])
        .replica
        == 2
    )
    router = RoundRobinRouter(_fixed(5, 0, 1), ONE)
    got = [router.place(NS, PROMPT, [0, 0, 0], live=[True, False, True]).replica for _ in range(3)]
    assert got == [0, 2, 0]
    with pytest.raises(RouterConfigError, match="no live replica"):
        router.place(NS, PROMPT, [0, 0, 0], live=[False, False, False])


class _Counted(_Fixed):
    """An index that counts how often a router consulted it."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.asked = 0

    def overlap(
        self, namespace: Namespace, token_ids: Sequence[int], spans: Sequence[MultimodalSpan] = ()
    ) -> int:
        self.asked += 1
        return self.n


def test_a_stale_replica_takes_its_turn_and_is_never_scored() -> None:
    """Replica 0's index claims the longest prefix, but its subscriber is stale: it gets
    every third request (its round-robin turn), by turn and with no prediction; the others
    go by the predictions of the replicas in sync; back in sync, it is scored again."""
    indexes = [_Counted(9), _Counted(2), _Counted(4)]
    router = KVRouter(list(indexes), ONE)
    stale = [True, False, False]
    got = [router.place(NS, PROMPT, [0, 0, 0], stale=stale) for _ in range(6)]
    assert [p.replica for p in got] == [0, 2, 2, 0, 2, 2]
    assert [p.by_turn for p in got] == [True, False, False, True, False, False]
    assert indexes[0].asked == 0  # a stale index is never consulted
    assert all(p.overlaps[0] == 0 and p.hits[0] == 0 for p in got)
    assert (got[0].predicted_blocks, got[0].predicted_tokens) == (0, 0)
    assert got[1].predicted_blocks == 4
    # Dropped replicas take no turn; a stale one alone among the live still takes its own.
    alone = router.place(NS, PROMPT, [0, 0, 0], live=[True, False, False], stale=stale)
    assert alone.replica == 0 and alone.by_turn
    back = router.place(NS, PROMPT, [0, 0, 0], stale=[False, False, False])
    assert back.replica == 0 and not back.by_turn and indexes[0].asked == 1


def test_round_robin_never_scores_a_stale_replica() -> None:
    indexes = [_Counted(5), _Counted(0), _Counted(1)]
    router = RoundRobinRouter(list(indexes), ONE)
    got = [router.place(NS, PROMPT, [0, 0, 0], stale=[False, True, False]) for _ in range(3)]
    assert [(p.replica, p.by_turn) for p in got] == [(0, False), (1, True), (2, False)]
    assert indexes[1].asked == 0 and got[1].predicted_blocks == 0


def test_round_robin_cycles_and_records_the_prediction() -> None:
    router = RoundRobinRouter(_fixed(5, 0, 1), ONE)
    got = [router.place(NS, PROMPT, [0, 0, 0]) for _ in range(4)]
    assert [p.replica for p in got] == [0, 1, 2, 0]
    assert [p.predicted_blocks for p in got] == [5, 0, 1, 5]


@pytest.mark.parametrize("kind", ["mirror", "dynamo"])
def test_indexes_predict_the_published_prefix(kind: str) -> None:
    if kind == "dynamo":
        pytest.importorskip("dynamo.llm")
    cache = PrefixCacheManager(16, 4, record_events=True)
    index = make_index(kind, 4)
    tokens = list(range(13))
    adm = cache.admit(Request("a", tokens, NS))
    cache.commit("a", adm.num_scheduled_tokens, [1])
    index.apply(cache.take_events())
    assert index.overlap(NS, [*tokens, 99]) == 3
    assert index.overlap(NS, [0, 1, 2, 3, 9, 9, 9, 9]) == 1
    assert index.overlap(Namespace("m", salt=b"t"), tokens) == 0  # identity, not tokens
    cache.free(["a"])
    assert cache.evict(16) == 3
    index.apply(cache.take_events())
    assert index.overlap(NS, tokens) == 0
    assert index.rejected == 0
    # A dropped replica: the index forgets every block it held.
    adm = cache.admit(Request("b", tokens, NS))
    cache.commit("b", adm.num_scheduled_tokens, [1])
    index.apply(cache.take_events())
    assert index.overlap(NS, tokens) == 3
    assert index.drop() == 3
    assert index.overlap(NS, tokens) == 0 and index.drop() == 0


# -- errors ----------------------------------------------------------------------------------


def test_bad_router_arguments_are_typed_errors() -> None:
    for call in (
        lambda: run_cluster(TURNS, CONFIG, replicas=0, router="kv"),
        lambda: run_cluster(TURNS, CONFIG, replicas=2, router="random"),
        lambda: run_cluster(TURNS, CONFIG, replicas=2, router="kv", index="btree"),
        lambda: make_router("least-loaded", _fixed(1), ONE),
        lambda: make_index("btree", 4),
        lambda: KVRouter([], ONE),
        lambda: ReplicaPool(0, CONFIG),
    ):
        with pytest.raises(RouterConfigError) as info:
            call()
        assert isinstance(info.value, PrefixCacheError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--replicas", "2", "--router", "random"), "unknown router 'random'"),
        (("--router", "kv"), "--router needs --replicas"),
        (("--replicas", "2", "--index", "btree"), "unknown router index 'btree'"),
    ],
)
def test_serve_sim_bad_replica_arguments(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["serve-sim", *argv, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["ok"] is False
    assert "RouterConfigError" in report["error"] and message in report["error"]


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "must be an int >= 1, got 0"), ("100000", "must be <= 64, got 100000")],
)
def test_serve_sim_replica_count_out_of_range_is_a_usage_error(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["serve-sim", "--replicas", value, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 2 and report["ok"] is False and report["exit_code"] == 2
    assert "--replicas" in report["error"] and message in report["error"]


def _one(rid: str, prompt: Sequence[int]) -> list[list[ReplicaRequest]]:
    return [[ReplicaRequest(rid, tuple(prompt), 2)]]


def test_a_replica_that_dies_is_a_clear_error_not_a_hang() -> None:
    with ReplicaPool(1, CONFIG, stall_timeout_s=30) as pool:
        pool.tick(_one("a", range(10)))
        pool.processes[0].kill()
        # "died": noticed by the liveness poll, not by the timeout ("did not answer in time").
        with pytest.raises(ReplicaFailed, match="replica 0 died") as info:
            pool.tick(_one("b", range(10)))
        assert isinstance(info.value, RuntimeError)


def test_a_replica_that_raises_reports_the_error() -> None:
    bad: Any = _one("a", [CONFIG.model.vocab_size + 1])
    with ReplicaPool(1, CONFIG) as pool, pytest.raises(ReplicaFailed, match="InvalidRequest"):
        pool.tick(bad)
