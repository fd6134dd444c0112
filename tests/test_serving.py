"""The serving driver: the engine's turns of the one chat workload, pinned, and its report."""

from __future__ import annotations

import hashlib

import pytest

from prefixkv.serving import ServeReport, ServeSimConfig, chat_turns, engine_config, percentile
from prefixkv.workloads import chat_workload


def _digest(cfg: ServeSimConfig, vocab: int) -> str:
    turns = chat_turns(cfg, vocab)
    data = [(t.request_id, t.tokens, t.max_new_tokens, t.follows, t.arrival_step) for t in turns]
    return hashlib.sha256(repr(data).encode()).hexdigest()


def test_the_served_workload_is_pinned() -> None:
    # docs/routing.md's figures (72 requests, 9,862 prefill tokens) were measured on these
    # exact turns: a change here changes them, and they must then be measured again.
    vocab = engine_config().model.vocab_size
    assert _digest(ServeSimConfig(), vocab) == (
        "7af110a4dd9c847a6b74ff61d0dcc7a1db0238784d13a8095adf3607bcb635d4"
    )
    small = ServeSimConfig(conversations=4, turns=2, system_prompts=2, system_tokens=32)
    assert _digest(small, vocab) == (
        "4cceebb670c76bee49883888c405d19f101debb199860391efb0681fecae3d71"
    )


def test_turns_follow_the_chat_workload() -> None:
    cfg = ServeSimConfig(conversations=5, turns=3, system_tokens=20, arrival_every=3, seed=2)
    vocab = 300
    workload = chat_workload(cfg.chat_config(vocab))
    turns = {t.request_id: t for t in chat_turns(cfg, vocab)}
    assert len(turns) == workload.num_requests == 15
    for conv in workload.conversations:
        c = conv.index
        first = turns[f"c{c}t0"]
        assert first.tokens == conv.turns[0].prompt and first.follows is None
        assert first.arrival_step == 3 * c
        assert first.tokens[:20] == workload.system_prompts[conv.system_prompt]
        for t in range(1, 3):
            turn, previous = conv.turns[t], conv.turns[t - 1]
            served = turns[f"c{c}t{t}"]
            assert served.follows == f"c{c}t{t - 1}"
            # the engine appends the message to the previous prompt and generated reply
            assert previous.prompt + previous.reply + served.tokens == turn.prompt
            assert served.max_new_tokens == len(turn.reply)
            assert all(tok < vocab for tok in served.tokens)


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.5) == 0.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.9) == 5.0


def test_report_fields_are_the_json_keys() -> None:
    names = {f.name for f in ServeReport.__attrs_attrs__}
    assert {"ok", "hit_rate", "cache_on_equals_cache_off", "mismatch", "hybrid"} <= names


@pytest.mark.parametrize("value", [0, -1, True])
def test_the_engine_config_refuses_a_bad_pool(value: int) -> None:
    from prefixkv.errors import InvalidConfig

    with pytest.raises(InvalidConfig):
        engine_config(num_blocks=value)
