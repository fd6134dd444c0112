"""Configuration of the tiny models and the engine that serves them."""

from __future__ import annotations

import attrs

from prefixkv.errors import InvalidConfig, require_int

from .policy import SchedulerConfig

__all__ = ["BACKENDS", "DTYPES", "EngineConfig", "ModelConfig"]

#: ``auto`` picks ``fast`` on CUDA and ``torch`` on the CPU.
BACKENDS = ("auto", "torch", "interpreter", "fast")
DTYPES = ("float32", "float16", "bfloat16")


def _count(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    require_int(value, attribute.name, minimum=0)


def _positive(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    require_int(value, attribute.name, minimum=1)


@attrs.frozen
class ModelConfig:
    """A tiny decoder-only transformer: GQA attention with RoPE, SwiGLU MLP, RMSNorm.

    Weights are drawn from ``seed``; nothing is downloaded. ``version`` names the weights in
    the cache namespace, so two seeds never share KV.
    """

    vocab_size: int = attrs.field(default=256, validator=_positive)
    hidden_size: int = attrs.field(default=64, validator=_positive)
    num_layers: int = attrs.field(default=2, validator=_positive)
    num_heads: int = attrs.field(default=4, validator=_positive)
    num_kv_heads: int = attrs.field(default=2, validator=_positive)
    head_dim: int = attrs.field(default=16, validator=_positive)
    intermediate_size: int = attrs.field(default=128, validator=_positive)
    rope_theta: float = 10_000.0
    seed: int = 0
    dtype: str = attrs.field(default="float32", validator=attrs.validators.in_(DTYPES))
    name: str = "tiny-decoder"
    hybrid: bool = False
    """Layer 0 becomes a recurrent layer (causal conv + linear recurrence, see ``hybrid``)."""
    conv_width: int = attrs.field(default=4, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise InvalidConfig(
                f"num_heads={self.num_heads} must be a multiple of num_kv_heads="
                f"{self.num_kv_heads} (grouped-query attention)"
            )
        if self.head_dim % 2:
            raise InvalidConfig(f"RoPE needs an even head_dim, got {self.head_dim}")
        if self.hybrid and self.num_layers < 2:
            raise InvalidConfig("a hybrid model needs a recurrent and an attention layer")

    @property
    def num_attention_layers(self) -> int:
        return self.num_layers - 1 if self.hybrid else self.num_layers

    @property
    def version(self) -> str:
        return (
            f"{self.name}@v{self.vocab_size}.h{self.hidden_size}.l{self.num_layers}."
            f"q{self.num_heads}.kv{self.num_kv_heads}.d{self.head_dim}.s{self.seed}.{self.dtype}"
            + (f".hybrid-w{self.conv_width}" if self.hybrid else "")
        )


@attrs.frozen
class EngineConfig:
    """The engine: model, KV pool, scheduler, compute backend, cache on or off.

    ``num_draft_tokens`` > 0 turns on speculative decoding with the n-gram drafter; its
    requests are admitted with ``recompute_blocks`` (the private recompute window, choice 6).

    A hybrid model gets a :class:`~prefixkv.impl.HybridPrefixCacheManager`: one runtime
    state slot per ``scheduler.max_num_seqs``, ``state_budget`` checkpoint slots beyond
    them, and a decode checkpoint every ``decode_state_interval`` tokens (0: prefill
    checkpoints only; else a multiple of ``block_size``). Ignored for attention-only models.
    """

    model: ModelConfig = attrs.field(factory=ModelConfig)
    num_blocks: int = attrs.field(default=256, validator=_positive)
    block_size: int = attrs.field(default=4, validator=_positive)
    scheduler: SchedulerConfig = attrs.field(factory=SchedulerConfig)
    backend: str = attrs.field(default="auto", validator=attrs.validators.in_(BACKENDS))
    device: str | None = None
    cache_enabled: bool = True
    ngram: int = attrs.field(default=3, validator=_positive)
    record_logits: bool = False
    record_events: bool = False
    """Queue the cache's KV events for ``cache.take_events()`` (a replica that publishes them)."""
    state_budget: int = attrs.field(default=32, validator=_count)
    decode_state_interval: int = attrs.field(default=0, validator=_count)
    cpu_threads: int | None = 1
    """NOTE: torch's intra-op threads on the CPU. Tiny matmuls gain nothing from them, and on
    a loaded two-core machine their spin-waits made a workload ~70x slower (0.12 s with one
    thread, 9 s with two). ``None`` leaves torch's setting alone. Process-wide."""
