"""The one chat workload: deterministic, shaped as configured, validated, and pinned."""

from __future__ import annotations

import hashlib

import attrs
import pytest

from prefixkv.errors import InvalidConfig
from prefixkv.workloads import ChatConfig, ChatWorkload, chat_workload, interleave


def test_workload_is_deterministic() -> None:
    cfg = ChatConfig(conversations=7, turns=3, system_tokens=64, seed=11)
    a, b = chat_workload(cfg), chat_workload(cfg)
    assert a == b
    assert a.schedule() == b.schedule()
    other = chat_workload(ChatConfig(conversations=7, turns=3, system_tokens=64, seed=12))
    assert other.system_prompts != a.system_prompts


def test_workload_shape() -> None:
    cfg = ChatConfig(conversations=9, turns=4, system_prompts=3, system_tokens=128)
    w = chat_workload(cfg)
    assert len(w.system_prompts) == 3 and all(len(s) == 128 for s in w.system_prompts)
    assert w.num_requests == 36
    for conv in w.conversations:
        system = w.system_prompts[conv.system_prompt]
        previous = None
        for turn in conv.turns:
            assert turn.prompt[: len(system)] == system
            lo, hi = cfg.reply_tokens
            assert lo <= len(turn.reply) <= hi
            if previous is not None:
                # every turn re-sends the whole history: previous prompt and reply
                history = previous.prompt + previous.reply
                assert turn.prompt[: len(history)] == history
                lo, hi = cfg.user_tokens
                assert lo <= len(turn.prompt) - len(history) <= hi
            previous = turn
    assert w.blocks_touched(16) == sum(-(-t.num_tokens // 16) for t in w.turns())


def test_schedule_keeps_turn_order_and_interleaves() -> None:
    w = chat_workload(ChatConfig(conversations=20, turns=4, system_tokens=16))
    order = [(t.conversation, t.turn) for t in w.schedule()]
    assert sorted(order) == [(c, t) for c in range(20) for t in range(4)]
    seen: dict[int, int] = {}
    for c, t in order:
        assert t == seen.get(c, -1) + 1
        seen[c] = t
    assert order != sorted(order)  # actually shuffled
    assert interleave([2, 0, 1], seed=5) == interleave([2, 0, 1], seed=5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"conversations": 0},
        {"turns": True},
        {"system_tokens": -1},
        {"vocab_size": 1.5},
        {"user_tokens": (5, 2)},
        {"reply_tokens": (0, 3)},
        {"user_tokens": [1, 2]},
        {"image_rate": 1.5},
        {"image_rate": False},
        {"draw_replies": 1},
    ],
)
def test_workload_config_rejects_bad_values(kwargs: dict[str, object]) -> None:
    with pytest.raises(InvalidConfig) as info:
        ChatConfig(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)  # what a caller would already catch


def _digest(workload: ChatWorkload) -> str:
    """The tokens, spans and order of a workload (not its config)."""
    data = (workload.system_prompts, workload.conversations, workload.schedule())
    return hashlib.sha256(repr(data).encode()).hexdigest()[:16]


def test_the_benchmark_workload_is_pinned() -> None:
    # The figures of docs/simulate.md and docs/benchmarks.md were measured on these exact
    # tokens: a change here changes them, and they must then be measured again.
    assert _digest(chat_workload()) == "5f5a99448a315825"
    small = ChatConfig(
        conversations=12,
        turns=3,
        system_prompts=2,
        system_tokens=64,
        user_tokens=(8, 24),
        reply_tokens=(4, 12),
        image_tokens=8,
        image_pool=4,
    )
    assert _digest(chat_workload(small)) == "b616aeaf68e3b7fa"


def test_served_replies_are_lengths_only() -> None:
    """Without drawn replies each reply is placeholders of a drawn length (the serving model
    samples its own), and the workload keeps its shape: the history is re-sent each turn."""
    cfg = ChatConfig(conversations=6, turns=3, system_tokens=40, seed=9, image_tokens=5)
    drawn, served = chat_workload(cfg), chat_workload(attrs.evolve(cfg, draw_replies=False))
    # the same draws up to the first reply
    assert drawn.system_prompts == served.system_prompts
    assert drawn.conversations[0].turns[0].prompt == served.conversations[0].turns[0].prompt
    assert drawn.conversations[0].turns[0].spans == served.conversations[0].turns[0].spans
    for conv in served.conversations:
        previous = None
        for turn in conv.turns:
            assert set(turn.reply) == {cfg.vocab_size}
            assert cfg.reply_tokens[0] <= len(turn.reply) <= cfg.reply_tokens[1]
            if previous is not None:
                history = previous.prompt + previous.reply
                assert turn.prompt[: len(history)] == history
                assert turn.spans[: len(previous.spans)] == previous.spans
            previous = turn
    assert served.num_requests == drawn.num_requests
