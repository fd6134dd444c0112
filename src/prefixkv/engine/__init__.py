"""prefixkv.engine: the reference engine that serves tiny models through the prefix cache.

Two halves, one concept:

* the scheduler, torch-free: it decides each step through the public cache API
  (:mod:`.scheduler`), with its choices as pure functions (:mod:`.policy`), the planned
  step (:mod:`.step`) and the per-request state (:mod:`.generation`);
* what needs torch: a tiny decoder with seeded weights (:mod:`.model`), the paged KV
  tensors (:mod:`.kv_pool`), the compute backends over the kernels (:mod:`.backend`), a
  stub multimodal encoder, an n-gram drafter, the runner, the engine loop and the
  cache-on == cache-off check (:mod:`.equality`).

NOTE: the names below are loaded lazily (PEP 562), as in ``prefixkv.kernels``, so that
``import prefixkv.engine.scheduler`` (what the simulator and the scheduler tests use) never
imports torch; ``tests/engine/test_torch_free.py`` checks it in a fresh interpreter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "BACKENDS": "config",
    "EngineConfig": "config",
    "ModelConfig": "config",
    "Engine": "engine",
    "RequestResult": "engine",
    "RunResult": "engine",
    "Turn": "engine",
    "TOLERANCE": "equality",
    "EqualityReport": "equality",
    "check_equality": "equality",
    "compare_runs": "equality",
    "BackendUnavailable": "errors",
    "EngineError": "errors",
    "EqualityMismatch": "errors",
    "StubEncoder": "multimodal",
    "image_item": "multimodal",
    "Scheduler": "scheduler",
    "SchedulerStats": "scheduler",
    "SchedulerConfig": "policy",
    "GenerationRequest": "generation",
    "MultimodalItem": "generation",
    "StepPlan": "step",
    "StepOutput": "step",
}

__all__ = [
    "BACKENDS",
    "TOLERANCE",
    "BackendUnavailable",
    "Engine",
    "EngineConfig",
    "EngineError",
    "EqualityMismatch",
    "EqualityReport",
    "GenerationRequest",
    "ModelConfig",
    "MultimodalItem",
    "RequestResult",
    "RunResult",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "StepOutput",
    "StepPlan",
    "StubEncoder",
    "Turn",
    "check_equality",
    "compare_runs",
    "image_item",
]

if TYPE_CHECKING:
    from .config import BACKENDS, EngineConfig, ModelConfig
    from .engine import Engine, RequestResult, RunResult, Turn
    from .equality import TOLERANCE, EqualityReport, check_equality, compare_runs
    from .errors import BackendUnavailable, EngineError, EqualityMismatch
    from .generation import GenerationRequest, MultimodalItem
    from .multimodal import StubEncoder, image_item
    from .policy import SchedulerConfig
    from .scheduler import Scheduler, SchedulerStats
    from .step import StepOutput, StepPlan


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
