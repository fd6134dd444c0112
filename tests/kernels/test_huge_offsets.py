"""The kernels at element offsets past 2^31, run for real on the CPU (see ``huge_offsets``).

The launch-decision tests check that ``USE_INT64`` is set; these check that the kernel
bodies then really widen every index: each case writes, gathers, copies or attends at
offsets past 2^31 in tensors backed by sparse address space, and must be exact. A wrapped
int32 offset shows as a wrong result or a segfault, so each case runs in its own process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from huge_offsets import CASES

HERE = Path(__file__).resolve().parent


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs sparse anonymous mappings (Linux)"
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_is_exact_past_2_31_elements(case: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "huge_offsets", case],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    detail = f"exit {proc.returncode}: {proc.stdout[-500:]} {proc.stderr[-2000:]}"
    assert proc.returncode == 0 and proc.stdout.strip() == "exact", detail
