"""prefixkv.engine: the reference engine that serves tiny models through the prefix cache.

The scheduler (:mod:`prefixkv.impl.scheduler`) decides each step through the public cache
API; this package adds what needs torch: a tiny decoder with seeded weights
(:mod:`.model`), the paged KV tensors (:mod:`.kv_pool`), the compute backends over the
kernels (:mod:`.backend`), a stub multimodal encoder, an n-gram drafter, the runner, the
engine loop and the cache-on == cache-off check (:mod:`.equality`).
"""

from __future__ import annotations

from .config import BACKENDS, EngineConfig, ModelConfig
from .engine import Engine, RequestResult, RunResult, Turn
from .equality import TOLERANCE, EqualityReport, check_equality, compare_runs
from .errors import BackendUnavailable, EngineError, EqualityMismatch
from .multimodal import StubEncoder, image_item

__all__ = [
    "BACKENDS",
    "TOLERANCE",
    "BackendUnavailable",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EqualityMismatch",
    "EqualityReport",
    "ModelConfig",
    "RequestResult",
    "RunResult",
    "StubEncoder",
    "Turn",
    "check_equality",
    "compare_runs",
    "image_item",
]
