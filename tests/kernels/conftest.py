"""Kernel tests: CPU under the Triton interpreter when there is no GPU, real sizes on CUDA.

``TRITON_INTERPRET=1`` must be in the environment before triton is imported, so it is set
here, at conftest import, before any test module imports the kernels. With CUDA present
the interpreter stays off and the same tests run compiled on the GPU at real sizes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

INTERPRETING = os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


@pytest.fixture(
    scope="session",
    params=[pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)],
)
def device(request: pytest.FixtureRequest) -> torch.device:
    """The device a kernel test runs on: ``cpu`` (interpreter, tiny shapes) or ``cuda``.

    Session-scoped so Hypothesis ``@given`` tests can take it. CPU tensors only work under
    the interpreter, which is off when a GPU is present: then the CUDA run covers the test.
    """
    if request.param == "cuda":
        if not HAS_CUDA:
            pytest.skip("no CUDA device")
        return torch.device("cuda")
    if not INTERPRETING:
        pytest.skip("CPU kernels need TRITON_INTERPRET=1; the CUDA run covers this test")
    return torch.device("cpu")


@pytest.fixture(autouse=True, scope="session")
def _no_debug_env() -> Iterator[None]:
    """Tests choose debug mode explicitly; an exported PREFIXKV_KERNEL_DEBUG must not leak.

    Session-scoped (not monkeypatch) so that Hypothesis tests see no function-scoped fixture.
    """
    saved = os.environ.pop("PREFIXKV_KERNEL_DEBUG", None)
    yield
    if saved is not None:
        os.environ["PREFIXKV_KERNEL_DEBUG"] = saved
