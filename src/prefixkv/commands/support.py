"""What several commands share: integer flags, where outputs go, progress and logs on stderr.

NOTE: everything here writes to stderr, never stdout: under ``--json`` stdout carries one
JSON document and nothing else (:mod:`prefixkv.cli`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefixkv.errors import InvalidConfig, require_int
from prefixkv.outputs import default_docs_dir

__all__ = [
    "MAX_WORKLOAD_TOKENS",
    "PLOT_SUFFIXES",
    "add_output_flags",
    "check_workload_size",
    "device_name",
    "int_at_least",
    "int_in",
    "logger",
    "output_dir",
    "plot_path",
    "progress",
    "seconds",
]

#: The files ``--plot`` can write (matplotlib's Agg backend saves each).
PLOT_SUFFIXES = (".png", ".pdf", ".svg")

_DEVICE = re.compile(r"cpu|cuda(:[0-9]{1,3})?")


def int_in(minimum: int, maximum: int | None) -> Callable[[str], int]:
    """An argparse ``type``: the flag's text as an int in ``minimum..maximum``.

    A bad value is a usage error (exit 2) with the validator's message, not argparse's
    generic "invalid value".

    NOTE: every size flag has an upper bound: a workload, a pool or a model is built whole
    before anything runs, so a flag past what the machine holds would grow until it is
    killed, with no output, instead of failing at once.

    Args:
        minimum: the smallest value allowed.
        maximum: the largest value allowed (None: no bound, for a flag that is no size).

    Returns:
        The parser argparse calls with the flag's text.
    """

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        try:
            value = require_int(value, "the value", minimum=minimum)
        except InvalidConfig as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"the value must be <= {maximum:,}, got {text}")
        return value

    parse.__name__ = f"int >= {minimum}" if maximum is None else f"int in {minimum}..{maximum}"
    return parse


def seconds(text: str) -> float:
    """An argparse ``type``: a finite number of seconds > 0 (a timeout or a duration; an
    infinite one would let a bounded run never end).

    Args:
        text: the flag's value.

    Returns:
        The number of seconds.
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


#: The most prompt tokens a generated workload may hold in all (every turn's prompt is
#: materialized whole: 2**26 tokens are 512 MiB of references, before the replies).
MAX_WORKLOAD_TOKENS = 2**26


def check_workload_size(
    conversations: int, turns: int, first_prompt: int, per_turn: int, flags: str
) -> None:
    """Refuse, as a usage error, a workload whose prompts would hold more than
    :data:`MAX_WORKLOAD_TOKENS` tokens: turn ``t`` of a conversation carries the whole
    history, at most ``first_prompt + t * per_turn`` tokens.

    Args:
        conversations: conversations in the workload.
        turns: turns per conversation.
        first_prompt: the most tokens a first turn's prompt has (system prompt, image).
        per_turn: the most tokens a turn adds (user turn and reply).
        flags: the flags that set these, for the message.

    Raises:
        CommandError: with exit status 2 (bad usage) when the workload is too large.
    """
    from prefixkv.cli import EXIT_USAGE, CommandError

    tokens = conversations * (turns * first_prompt + per_turn * turns * (turns + 1) // 2)
    if tokens > MAX_WORKLOAD_TOKENS:
        raise CommandError(
            f"{flags}: the workload's prompts would hold up to {tokens:,} tokens, more than "
            f"{MAX_WORKLOAD_TOKENS:,} (it is generated whole before the run)",
            exit_code=EXIT_USAGE,
        )


def plot_path(text: str) -> Path:
    """An argparse ``type``: where ``--plot`` writes its figure, as the file it will be.

    A path without a suffix gets ``.png`` (what the figure is saved as); a folder that
    exists gets ``figure.png`` inside it; a suffix the figure cannot be saved as is a usage
    error. The command reports the returned path, which is the file it writes.

    Args:
        text: the flag's value.

    Returns:
        The file the figure is written to.
    """
    path = Path(text)
    if not text or not path.name:
        raise argparse.ArgumentTypeError("give the PNG file to write")
    if path.is_dir():
        return path / "figure.png"
    if not path.suffix:
        return path.with_name(path.name + ".png")
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a figure is written as one of {', '.join(PLOT_SUFFIXES)}"
        )
    return path


def device_name(text: str) -> str:
    """An argparse ``type``: ``cpu``, ``cuda`` or ``cuda:N``, checked before anything runs.

    Args:
        text: the flag's value.

    Returns:
        The device, as torch names it.
    """
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: the flag's text as an int ``>= minimum``, with no upper bound
    (for a flag that is no size: a seed, a count of batches; sizes use :func:`int_in`)."""
    return int_in(minimum, None)


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
