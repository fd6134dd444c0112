"""``prefixkv bench-kernels``: the Triton kernels against the GPU's own ceilings and SDPA.

The measurements are :mod:`prefixkv.kernels.bench`'s and the report
:mod:`prefixkv.benchmarks.kernels`'s: ``<out>/bench/kernels.json``, ``kernels.md`` and
``kernels_*.png``. Without CUDA the command exits with status 2 and the message "no CUDA
device". ``--dry-run`` runs every code path on the CPU under the Triton interpreter at toy
sizes (timings meaningless), so the benchmark cannot rot unnoticed on machines without a
GPU; it writes files only with ``--out``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from prefixkv.benchmarks.kernels import markdown_report, write_outputs
from prefixkv.cli import CommandError, Runner, emit_json
from prefixkv.outputs import default_docs_dir

__all__ = ["EXIT_NO_CUDA", "setup"]

#: The exit status without a GPU (or without torch): nothing was measured.
EXIT_NO_CUDA = 2


def setup(parser: argparse.ArgumentParser) -> Runner:
    """Add the ``bench-kernels`` flags; returns its runner (see :mod:`prefixkv.cli`)."""
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write bench/kernels.{json,md} and plots under this folder "
        "(default: the source checkout's docs/ for a GPU run, nothing for --dry-run)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="toy sizes on the CPU under TRITON_INTERPRET=1; checks code paths only",
    )
    return _run


def _run(args: argparse.Namespace) -> int:
    if args.dry_run:
        # must precede the first triton import, which the kernel modules do
        os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        import torch
    except ImportError:
        raise CommandError(
            "torch is not installed (pip install 'prefixkv[kernels]')", exit_code=EXIT_NO_CUDA
        ) from None
    if not args.dry_run and not torch.cuda.is_available():
        raise CommandError(
            "no CUDA device: the kernel benchmark needs a GPU "
            "(use --dry-run to exercise the code paths on the CPU)",
            exit_code=EXIT_NO_CUDA,
        )
    if args.dry_run and os.environ.get("TRITON_INTERPRET", "") in ("", "0"):
        raise CommandError("--dry-run needs TRITON_INTERPRET=1 set before triton is imported")
    from prefixkv.kernels.bench import DRY_SIZES, GPU_SIZES, run

    device = torch.device("cpu" if args.dry_run else "cuda")
    results = run(device, DRY_SIZES if args.dry_run else GPU_SIZES, dry_run=args.dry_run)
    out: Path | None = args.out
    if out is None and not args.dry_run:
        out = default_docs_dir()
    written = write_outputs(results, out / "bench") if out is not None else []
    if args.json:
        emit_json(
            {
                "command": "bench-kernels",
                "ok": True,
                **results,
                "written": [str(p) for p in written],
            }
        )
        return 0
    for path in written:
        print(f"wrote {path}")
    print(markdown_report(results))
    return 0
