"""``prefixkv bench-engine``: prefill time against the cached fraction of the prompt.

The measurement is :mod:`prefixkv.benchmarks.engine`'s; this command picks its size
(``--quick`` or the full run), the backend and the device, writes ``docs/engine.md``'s
generated section with its JSON and figure, and prints the table.
"""

from __future__ import annotations

import argparse

from prefixkv.benchmarks.engine import FULL, QUICK, run_engine_bench, write_outputs
from prefixkv.cli import Runner, emit_json
from prefixkv.outputs import to_json

from .support import add_output_flags, device_name, logger, output_dir

__all__ = ["setup"]


def setup(parser: argparse.ArgumentParser) -> Runner:
    """Add the ``bench-engine`` flags; returns its runner (see :mod:`prefixkv.cli`)."""
    add_output_flags(
        parser,
        quick="small model and prompt, seconds; writes nothing unless --out",
        out="docs directory for engine.md and bench/ (default: the source checkout's docs/ "
        "for a full run; nothing for --quick)",
    )
    parser.add_argument(
        "--backend", default="auto", choices=("auto", "torch", "interpreter", "fast")
    )
    parser.add_argument(
        "--device", type=device_name, default=None, help="cpu, cuda or cuda:N (default: auto)"
    )
    return _run


def _run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    log = logger("bench-engine", args.json)
    result = run_engine_bench(
        QUICK if args.quick else FULL, backend=args.backend, device=args.device, log=log
    )
    out = output_dir(args)
    written = [str(p) for p in write_outputs(result, out)] if out is not None else []
    if args.json:
        emit_json(
            {
                "command": "bench-engine",
                "ok": True,
                **to_json(result),
                "quick": bool(args.quick),
                "written": written,
            }
        )
        return 0
    table = Table(
        title=f"prefill vs cached fraction ({result.device}, {result.backend})",
        title_justify="left",
    )
    for col in ("cached", "computed tokens", "measured ms", "ideal ms", "measured/ideal"):
        table.add_column(col, justify="right")
    for r in result.rows:
        table.add_row(
            f"{r.actual_fraction:.1%}",
            str(r.computed_tokens),
            f"{r.median_ms:.2f}",
            f"{r.ideal_ms:.2f}",
            f"{r.ratio:.2f}",
        )
    Console().print(table)
    for p in written:
        log(f"wrote {p}")
    return 0
