"""What several commands share: integer flags, where outputs go, progress and logs on stderr.

NOTE: everything here writes to stderr, never stdout: under ``--json`` stdout carries one
JSON document and nothing else (:mod:`prefixkv.cli`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefixkv.errors import InvalidConfig, require_int
from prefixkv.outputs import default_docs_dir

__all__ = ["add_output_flags", "int_at_least", "logger", "output_dir", "progress"]


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: the flag's text as an int ``>= minimum``.

    A bad value is a usage error (exit 2) with the validator's message, not argparse's
    generic "invalid value".
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        try:
            return require_int(value, "the value", minimum=minimum)
        except InvalidConfig as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = f"int >= {minimum}"
    return parse


def add_output_flags(parser: argparse.ArgumentParser, *, quick: str, out: str) -> None:
    """``--quick``, ``--out DIR`` and ``--no-write``: a full run writes the docs, a quick one
    nothing unless told where."""
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--out", type=Path, metavar="DIR", help=out)
    parser.add_argument("--no-write", action="store_true", help="print only, write no files")


def output_dir(args: argparse.Namespace) -> Path | None:
    """Where the flags of :func:`add_output_flags` say results go (None: nowhere)."""
    if args.no_write:
        return None
    out: Path | None = args.out
    if out is None and not args.quick:
        return default_docs_dir()
    return out


def logger(command: str, quiet: bool) -> Callable[[str], None]:
    """A ``log(message)`` that prints ``command: message`` dimly on stderr (nothing if quiet)."""
    from rich.console import Console

    err = Console(stderr=True)

    def log(message: str) -> None:
        if not quiet:
            err.print(f"[dim]{command}:[/dim] {message}", highlight=False)

    return log


def progress(quiet: bool) -> Any:
    """A transient rich progress bar on stderr (disabled when ``quiet``)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    return Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=quiet,
        transient=True,
    )
