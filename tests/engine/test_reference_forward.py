"""The paged engine against a dense forward: same greedy tokens, logits within tolerance.

Cache on == cache off cannot see a bug that both runs share (a wrong RoPE position, a KV
write to the wrong slot that is read back from the same wrong slot...). Here the reference
is the model run densely over the whole sequence (plain causal attention, no cache, no
block tables), recomputed from scratch for every generated token.
"""

from __future__ import annotations

import pytest
import torch

from prefixkv.engine import Engine, EngineConfig, ModelConfig, Turn, image_item
from prefixkv.engine.generation import MultimodalItem
from prefixkv.engine.layers import DecoderLayer, apply_rope
from prefixkv.engine.model import TinyDecoder
from prefixkv.engine.multimodal import StubEncoder
from prefixkv.engine.policy import SchedulerConfig


@torch.no_grad()
def dense_logits(model: TinyDecoder, embeds: torch.Tensor) -> torch.Tensor:
    cfg = model.cfg
    n = embeds.shape[0]
    pos = torch.arange(n)
    x = embeds
    if model.recurrent is not None:
        x, _ = model.recurrent(x, None)  # the whole sequence in one scan, from a zero state
    for layer in model.layers:
        assert isinstance(layer, DecoderLayer)
        h = layer.attn_norm(x)
        qkv = layer.attn.qkv(h)
        q_end = cfg.num_heads * cfg.head_dim
        k_end = q_end + cfg.num_kv_heads * cfg.head_dim
        q = apply_rope(qkv[:, :q_end].reshape(n, cfg.num_heads, cfg.head_dim), pos, cfg.rope_theta)
        k = apply_rope(
            qkv[:, q_end:k_end].reshape(n, cfg.num_kv_heads, cfg.head_dim), pos, cfg.rope_theta
        )
        v = qkv[:, k_end:].reshape(n, cfg.num_kv_heads, cfg.head_dim)
        rep = cfg.num_heads // cfg.num_kv_heads
        o = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1),
            k.repeat_interleave(rep, 1).transpose(0, 1),
            v.repeat_interleave(rep, 1).transpose(0, 1),
            is_causal=True,
        ).transpose(0, 1)
        x = x + layer.attn.out(o.reshape(n, q_end))
        x = x + layer.mlp(layer.mlp_norm(x))
    return model.lm_head(model.norm(x)).float()


def dense_generate(
    model: TinyDecoder, prompt: list[int], steps: int, items: tuple[MultimodalItem, ...] = ()
) -> tuple[list[int], list[torch.Tensor]]:
    enc = StubEncoder(model.cfg.hidden_size, model.cfg.seed)
    tokens, logits = list(prompt), []
    for _ in range(steps):
        embeds = model.embed(torch.tensor(tokens))
        for it in items:
            embeds[it.span.start : it.span.end] = enc.encode(it)
        row = dense_logits(model, embeds)[-1]
        logits.append(row)
        tokens.append(int(row.argmax()))
    return tokens[len(prompt) :], logits


@pytest.mark.parametrize("hybrid", [False, True], ids=["attention", "hybrid"])
def test_engine_matches_the_dense_forward(hybrid: bool) -> None:
    system = list(range(20, 45))
    img = image_item(10, 6, b"kitten")
    turns = [
        Turn("a", [*system, 1, 2], 6),
        Turn("b", [*system, 3], 6, arrival_step=2, kv_token_limit=8),
        Turn("c", [*system, 4, 5, 6], 5, arrival_step=2, multimodal=[img]),
        Turn("d", [7, 8], 4, follows="a"),
    ]
    for sched in (
        SchedulerConfig(),
        SchedulerConfig(num_draft_tokens=2, max_num_batched_tokens=24, min_prefill_tokens=8),
    ):
        engine = Engine(
            EngineConfig(
                model=ModelConfig(hybrid=hybrid), num_blocks=64, scheduler=sched, record_logits=True
            )
        )
        result = engine.run(turns)
        assert result.cache.prefill_tokens_skipped > 0
        if hybrid:  # the hits restored the recurrent state from checkpoints
            assert result.cache.checkpoints_restored > 0
        for rid in "abcd":
            g = engine.scheduler.generation(rid)
            want, want_logits = dense_generate(
                engine.model,
                list(g.request.prompt),
                g.request.max_new_tokens,
                g.request.multimodal,
            )
            assert list(result.requests[rid].output) == want, rid
            for x, y in zip(result.logits[rid], want_logits, strict=True):
                torch.testing.assert_close(x, y, atol=1e-3, rtol=1e-3)
