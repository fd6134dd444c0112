"""``serve-sim --index dynamo-zmq``: the cluster routed through Dynamo's own ZMQ consumer.

``python -m dynamo.indexer`` (ai-dynamo-runtime) subscribes to every replica's stream and
replay endpoint itself; the router asks it over HTTP. The run is the routing tests' tiny
workload (2 replicas, 8 requests): every request served once, and every prediction exact.
"""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("dynamo") is None or importlib.util.find_spec("dynamo.indexer") is None:
    pytest.skip("ai-dynamo-runtime is not installed", allow_module_level=True)
pytest.importorskip("zmq")

from test_routing import CONFIG, TURNS

from prefixkv.events.cluster import _dynamo_zmq, run_cluster
from prefixkv.events.router import MatchPolicy, RouterConfigError


def test_dynamo_own_consumer_routes_exactly() -> None:
    result = run_cluster(TURNS, CONFIG, replicas=2, router="kv", index="dynamo-zmq")
    assert result.index == "dynamo-zmq"
    assert result.accounted_exactly_once and result.served_exactly_once
    assert set(result.requests) == {t.request_id for t in TURNS}
    assert result.mispredictions == 0
    assert not any(r.index_mismatch for r in result.requests.values())
    assert result.rejected_events == 0  # Dynamo's decode failures, from its log
    assert result.index_settle_timeouts == 0
    assert result.cached_tokens == result.predicted_tokens > 0  # hits, predicted exactly


def test_a_hybrid_model_is_refused_with_the_reason() -> None:
    with pytest.raises(RouterConfigError, match="checkpoint events"):
        _dynamo_zmq([], MatchPolicy(8, hybrid=True))


def test_a_killed_replica_leaves_dynamo_own_tree() -> None:
    import signal

    from test_fleet import MAX_TICKS, _check_accounting, fault

    with fault(0, 1, signal.SIGKILL) as f:
        result = run_cluster(
            TURNS,
            CONFIG,
            replicas=2,
            router="kv",
            index="dynamo-zmq",
            on_tick=f,
            max_ticks=MAX_TICKS,
            stall_timeout_s=4.0,
        )
    _check_accounting(result)
    assert [x.replica for x in result.replica_failures] == [0]
    assert result.replica_failures[0].blocks_dropped > 0  # Dynamo's /dump held them
    # Routed after the drop on what Dynamo holds for the survivor: still exact.
    assert result.mispredictions == 0 and result.index_settle_timeouts == 0


def test_unregister_empties_the_worker_in_dynamo_own_tree() -> None:
    import time

    from prefixkv.impl import PrefixCacheManager
    from prefixkv.spec import Namespace, Request

    from prefixkv.events.dynamo_zmq import DynamoIndexer
    from prefixkv.events.transport import EventPublisher

    pub = EventPublisher()
    cache = PrefixCacheManager(32, 4, record_events=True)
    try:
        with DynamoIndexer(model="m@1", block_size=4) as indexer:
            indexer.register(5, pub.endpoint, pub.replay_endpoint)
            time.sleep(0.3)  # its subscription; a batch it misses comes by replay anyway
            adm = cache.admit(Request("r", list(range(13)), Namespace("m@1")), 13)
            cache.commit("r", adm.num_scheduled_tokens, [1])
            pub.publish(cache.take_events())
            blocks = cache.snapshot().blocks
            published = {(b.wire_hash or 0) & ((1 << 64) - 1) for b in blocks if b.published}
            deadline = time.monotonic() + 10
            while indexer.held_blocks(5) != published and time.monotonic() < deadline:
                time.sleep(0.02)
            assert indexer.held_blocks(5) == published and len(published) == 3
            indexer.unregister(5)
            assert indexer.held_blocks(5) == set()
    finally:
        pub.close()
