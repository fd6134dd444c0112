"""The scheduler half of the engine package imports without torch.

``prefixkv.engine`` holds both the torch-free scheduler and the torch engine; its exports
are lazy so that the simulator, the scheduler tests and any engine that brings its own
model can use the scheduler without loading torch. Checked in a fresh interpreter, since
this test process has torch loaded already (the engine conftest imports it).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import prefixkv.engine as engine

TORCH_FREE = (
    "prefixkv.engine",
    "prefixkv.engine.scheduler",
    "prefixkv.engine.policy",
    "prefixkv.engine.step",
    "prefixkv.engine.generation",
    "prefixkv.engine.config",
    "prefixkv.engine.errors",
)


def _loads_torch(code: str) -> bool:
    probe = f"{code}\nimport sys\nprint('torch' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1] == "True"


@pytest.mark.parametrize("module", TORCH_FREE)
def test_scheduler_modules_import_without_torch(module: str) -> None:
    assert not _loads_torch(f"import {module}")


def test_torch_free_exports_resolve_without_torch() -> None:
    code = (
        "from prefixkv.engine import Scheduler, SchedulerConfig, GenerationRequest, StepPlan\n"
        "from prefixkv.engine import EngineConfig, EngineError"
    )
    assert not _loads_torch(code)


def test_the_torch_engine_does_load_torch() -> None:
    # the probe itself can see torch: without this, a broken probe would pass the tests above
    assert _loads_torch("from prefixkv.engine import Engine")


def test_every_export_resolves() -> None:
    for name in engine.__all__:
        assert getattr(engine, name) is not None, name
    assert set(engine.__all__) <= set(dir(engine))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = engine.nope  # type: ignore[attr-defined]
