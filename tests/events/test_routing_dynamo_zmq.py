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
