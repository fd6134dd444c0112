"""The ``prefixkv`` command line: a small registry of subcommands, and ``main``.

Each subcommand lives in its own thin module of :mod:`prefixkv.commands` and is registered
here by name, with a one-line help and the dotted path of one *setup function*::

    def setup(parser: argparse.ArgumentParser) -> Runner:
        parser.add_argument(...)          # the command's own flags
        return run                        # run(args) -> exit status

The registry imports a command's module only when that command is invoked, so
``prefixkv --help`` stays fast, and a command whose optional dependencies are missing
(Z3 for ``prove``, torch for the engine demo) fails alone, with a message, instead of
breaking every other command. To add a command, write its module in
:mod:`prefixkv.commands` and add one line to :data:`_BUILTIN` (or call :func:`register`
from a plugin before :func:`main`).

NOTE: the registry and ``main`` stay here, not in ``prefixkv.commands``: this module is the
stable entry point (the console script, ``python -m prefixkv``, plugins that call
:func:`register`), and the command modules import only its small public surface
(:func:`emit_json`, :class:`CommandError`, the exit codes).

Conventions every command follows, enforced here rather than trusted to each module:

* ``--json`` is added to every command (unless its setup function declares it already): the
  result goes to stdout as one JSON document and nothing else goes to stdout (progress and
  logs go to stderr).
* The exit status is 0 on success and non-zero on failure: 1 when the command fails
  (any :class:`~prefixkv.errors.PrefixKVError` escaping it: a cache error, an invariant
  violation, a bad configuration; reported in one line), a :class:`CommandError`'s own
  ``exit_code``, 2 for bad usage (argparse's convention), 130 when interrupted.
* With ``--json`` anywhere on the command line, *every* failure, a usage error included,
  also prints one JSON object on stdout, ``{"command": ..., "ok": false, "error": ...,
  "exit_code": ...}``, so a script that parses stdout always gets JSON. The exit status is
  the same as without ``--json``, and the human-readable message still goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TextIO

import attrs

from prefixkv.errors import InvalidConfig, PrefixKVError

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "CommandError",
    "Runner",
    "Setup",
    "SubCommand",
    "commands",
    "emit_json",
    "main",
    "register",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class CommandError(PrefixKVError):
    """A command failed in an expected way; ``main`` prints the message and exits with
    ``exit_code`` (1 unless the command documents another)."""

    def __init__(self, message: str, *, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


#: Runs a parsed command; returns the process exit status.
Runner = Callable[[argparse.Namespace], int]
#: Adds a command's flags to its parser and returns the function that runs it.
Setup = Callable[[argparse.ArgumentParser], Runner]


@attrs.frozen
class SubCommand:
    """A registered subcommand. ``target`` is ``"module:function"`` or the setup function."""

    name: str
    help: str
    target: str | Setup

    def load(self) -> Setup:
        if not isinstance(self.target, str):
            return self.target
        module_name, _, attr = self.target.partition(":")
        module = importlib.import_module(module_name)
        setup: Setup = getattr(module, attr)
        return setup


_REGISTRY: dict[str, SubCommand] = {}


def register(name: str, help: str, target: str | Setup) -> SubCommand:
    """Add (or replace) the subcommand ``name``; returns its registry entry."""
    if not name or name.startswith("-") or any(ch.isspace() for ch in name):
        raise InvalidConfig(f"invalid command name {name!r}")
    command = SubCommand(name=name, help=help, target=target)
    _REGISTRY[name] = command
    return command


def commands() -> tuple[SubCommand, ...]:
    """The registered subcommands, in registration order."""
    return tuple(_REGISTRY.values())


# One line per built-in command; each module is in prefixkv.commands (one per command).
# NOTE: ``prove`` stays registered at the proofs' own command line until its module moves.
_BUILTIN: tuple[tuple[str, str, str], ...] = (
    (
        "simulate",
        "replay a multi-turn chat workload through the cache and report reuse",
        "prefixkv.commands.simulate:setup",
    ),
    (
        "bench",
        "benchmark the cache manager against the spec and per block touched",
        "prefixkv.commands.bench:setup",
    ),
    (
        "serve-sim",
        "serve a chat workload through scheduler, tiny model and cache; check cache on == off",
        "prefixkv.commands.serve_sim:setup",
    ),
    (
        "audit-events",
        "audit any engine's KV-event stream over ZeroMQ: order, removals, stores, clears, gaps",
        "prefixkv.commands.audit_events:setup",
    ),
    (
        "bench-engine",
        "benchmark prefill time against the cached fraction of the prompt (reference engine)",
        "prefixkv.commands.bench_engine:setup",
    ),
    (
        "bench-kernels",
        "benchmark the Triton kernels against the GPU's copy and matmul ceilings and SDPA",
        "prefixkv.commands.bench_kernels:setup",
    ),
    (
        "prove",
        "prove the spec's invariants inductive with Z3 (and the kernels' index arithmetic)",
        "prefixkv.commands.prove:setup",
    ),
)
for _name, _help, _target in _BUILTIN:
    register(_name, _help, _target)


def emit_json(payload: Any, stream: TextIO | None = None) -> None:
    """Write one JSON document (and a newline) to stdout: the ``--json`` output format."""
    out = sys.stdout if stream is None else stream
    json.dump(payload, out, indent=2, sort_keys=False, default=str)
    out.write("\n")
    out.flush()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("prefixkv")
    except Exception:  # not installed as a distribution (e.g. run from a source tree)
        return "unknown"


def _selected(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line, found before parsing.

    Only the top-level parser's own flags (``-h``, ``--version``) may precede it, so the
    first word that is not a flag is the command.
    """
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


def _fail(name: str | None, message: str, as_json: bool, code: int = EXIT_FAILURE) -> int:
    if as_json:
        emit_json({"command": name, "ok": False, "error": message, "exit_code": code})
    print(f"prefixkv {name or ''}: error: {message}".replace(" :", ":"), file=sys.stderr)
    return code


class _UsageError(Exception):
    """argparse rejected the command line (raised instead of printing and exiting)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are exceptions, so ``main`` can report them as
    JSON under ``--json``. Subcommand parsers are of this class too (argparse builds them
    with the parent's class). ``--help`` and ``--version`` still print and exit 0."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(self, message)


def _ensure_json_flag(parser: argparse.ArgumentParser) -> None:
    """Give the command ``--json`` unless its setup function already declared it."""
    # A conflict means the command declared --json itself: keep its definition.
    with contextlib.suppress(argparse.ArgumentError):
        parser.add_argument(
            "--json",
            action="store_true",
            help="print one JSON document on stdout (and nothing else there)",
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: ``sys.argv[1:]``), run the command, return its exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    # NOTE: decided before parsing, from the raw words: a usage error must be reported as
    # JSON even when the parser never got as far as the --json flag.
    wants_json = "--json" in args_list
    parser = _Parser(
        prog="prefixkv",
        description="prefixkv: a reference prefix cache for LLM serving engines.",
    )
    parser.add_argument("--version", action="version", version=f"prefixkv {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = _selected(args_list)
    load_error: str | None = None
    for command in commands():
        sub_parser = sub.add_parser(command.name, help=command.help, description=command.help)
        if command.name != chosen:
            continue
        try:
            runner = command.load()(sub_parser)
        except ImportError as exc:
            # A missing optional dependency: report it, but still parse the command line so
            # that a usage error or --help behaves as usual.
            load_error = f"cannot load the {command.name!r} command: {exc}"
        else:
            sub_parser.set_defaults(_run=runner)
        _ensure_json_flag(sub_parser)
    try:
        args = parser.parse_args(args_list)
    except _UsageError as exc:
        return _usage_error(chosen if chosen in _REGISTRY else None, exc, wants_json)
    except SystemExit as exc:  # --help / --version (0)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    name: str = args.command
    as_json: bool = bool(getattr(args, "json", False)) or wants_json
    if load_error is not None:
        return _fail(name, load_error, as_json)
    run: Runner = args._run
    try:
        return int(run(args))
    except KeyboardInterrupt:
        return _fail(name, "interrupted", as_json, 130)
    except _UsageError as exc:  # a command that calls parser.error() while it runs
        return _usage_error(name, exc, as_json)
    except SystemExit as exc:  # a command that rejects its arguments late, argparse-style
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or EXIT_OK
            if code != EXIT_OK and as_json:
                emit_json({"command": name, "ok": False, "error": None, "exit_code": code})
            return code
        return _fail(name, str(exc.code), as_json, EXIT_USAGE)
    except CommandError as exc:
        return _fail(name, f"{type(exc).__name__}: {exc}", as_json, exc.exit_code)
    except (PrefixKVError, OSError) as exc:
        # Expected failures of a run, every error prefixkv raises on purpose (a cache
        # error, an invariant violation, a bad configuration): report them in one line.
        return _fail(name, f"{type(exc).__name__}: {exc}", as_json)
    except Exception as exc:
        # A bug in prefixkv: the traceback goes to stderr; stdout stays JSON under --json.
        if not as_json:
            raise
        traceback.print_exc()
        return _fail(name, f"internal error: {type(exc).__name__}: {exc}", True)


def _usage_error(name: str | None, exc: _UsageError, as_json: bool) -> int:
    """Report a usage error as argparse would (usage and message on stderr, exit 2), and
    under ``--json`` also as one JSON object on stdout."""
    exc.parser.print_usage(sys.stderr)
    message = f"{exc.parser.prog}: error: {exc}"
    if as_json:
        emit_json({"command": name, "ok": False, "error": message, "exit_code": EXIT_USAGE})
    print(message, file=sys.stderr)
    return EXIT_USAGE
