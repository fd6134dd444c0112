"""``prefixkv audit-events``: subscribe to any engine's KV events and check the stream.

The checks are :mod:`prefixkv.events.audit`'s; this command is the subscriber around them: a
SUB socket on the engine's publisher and a DEALER on its replay endpoint (vLLM's and
prefixkv's publishers serve one), a live summary on stderr, a JSON report, and an
exit status of 1 when an invariant broke. It always ends: at ``--duration``, after
``--max-batches``, or on Ctrl-C, and a replay that does not answer within
``--replay-timeout`` is reported as a gap, never waited on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from prefixkv.cli import EXIT_FAILURE, CommandError, Runner, emit_json
from prefixkv.spec.contract import MAX_NUM_BLOCKS

from .support import int_at_least, int_in, seconds

__all__ = ["setup"]


def setup(parser: argparse.ArgumentParser) -> Runner:
    """Add the ``audit-events`` flags; returns its runner (see :mod:`prefixkv.cli`).

    Args:
        parser: the subcommand's parser.

    Returns:
        The runner.
    """
    parser.add_argument(
        "endpoint", help="the engine's event publisher, e.g. tcp://127.0.0.1:5557 (vLLM's default)"
    )
    parser.add_argument(
        "--replay",
        metavar="ENDPOINT",
        help="the engine's replay endpoint (vLLM: --kv-events-config replay_endpoint); "
        "without it, every gap is reported",
    )
    parser.add_argument("--topic", default="", help="the publisher's topic (default: every topic)")
    parser.add_argument(
        "--duration",
        type=seconds,
        metavar="SECONDS",
        help="stop after this long (default: until --max-batches or Ctrl-C)",
    )
    parser.add_argument(
        "--max-batches",
        type=int_at_least(1),
        metavar="N",
        help="stop after auditing N batches",
    )
    parser.add_argument(
        "--replay-timeout",
        type=seconds,
        default=2.0,
        metavar="SECONDS",
        help="how long a replay may take before its gap is reported (default: 2)",
    )
    parser.add_argument(
        "--num-blocks",
        type=int_in(1, MAX_NUM_BLOCKS),
        metavar="N",
        help="the engine's pool size (blocks per medium and KV cache group): enables the "
        "capacity check",
    )
    parser.add_argument(
        "--refcount",
        action="store_true",
        help="the engine declares a refcount model: a store of a live block takes a "
        "reference, each removal drops one",
    )
    parser.add_argument("--report", type=Path, metavar="PATH", help="write the JSON report to PATH")
    parser.add_argument("--quiet", action="store_true", help="no live summary on stderr")
    return _run


def _run(args: argparse.Namespace) -> int:
    if args.duration is None and args.max_batches is None and not sys.stderr.isatty():
        # NOTE: unattended (no terminal to Ctrl-C from), an unbounded audit could run forever.
        raise CommandError("give --duration or --max-batches (no terminal to stop it from)")
    from prefixkv.events.audit import StreamAudit

    audit = StreamAudit(
        topic=args.topic.encode() or None, num_blocks=args.num_blocks, refcount=args.refcount
    )
    started = time.monotonic()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the audit; the report comes
        _subscribe(args, audit)
    report: dict[str, Any] = {
        "command": "audit-events",
        "endpoint": args.endpoint,
        "replay_endpoint": args.replay,
        "seconds": round(time.monotonic() - started, 3),
        **audit.report(),
    }
    if args.report is not None:
        try:
            args.report.write_text(json.dumps(report, indent=2) + "\n")
        except OSError as exc:
            raise CommandError(f"cannot write the report to {args.report}: {exc}") from None
    if args.json:
        emit_json(report)
    else:
        _print(report)
    if not report["ok"]:
        broken = ", ".join(f"{k} ({n})" for k, n in report["violations_by_check"].items() if n)
        print(f"prefixkv audit-events: error: invariants broken: {broken}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


def _subscribe(args: argparse.Namespace, audit: Any) -> None:
    import zmq

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    replay: Any = None
    try:
        try:
            sub.setsockopt(zmq.SUBSCRIBE, args.topic.encode())
            sub.connect(args.endpoint)
            if args.replay:
                replay = _dealer(ctx, args.replay)
        except zmq.ZMQError as exc:
            raise CommandError(f"cannot subscribe to {args.endpoint}: {exc}") from None
        deadline = None if args.duration is None else time.monotonic() + args.duration
        with _live(args, audit) as refresh:
            while args.max_batches is None or audit.batches < args.max_batches:
                wait = 200 if deadline is None else min(200, (deadline - time.monotonic()) * 1000)
                if wait <= 0:
                    break
                if sub.poll(int(wait)):
                    frames = sub.recv_multipart()
                    start = audit.on_pub(frames)
                    if start is not None:
                        replay = _catch_up(ctx, args, audit, replay, start, frames, deadline)
                refresh()
    finally:
        sub.close()
        if replay is not None:
            replay.close()
        ctx.term()


def _dealer(ctx: Any, endpoint: str) -> Any:
    import zmq

    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _catch_up(
    ctx: Any,
    args: argparse.Namespace,
    audit: Any,
    replay: Any,
    start: int,
    frames: list[bytes],
    deadline: float | None,
) -> Any:
    """Replay from ``start``; returns the DEALER to use next (a fresh one after a timeout)."""
    if replay is None:
        audit.finish_replay(frames, "no replay endpoint given")
        return None
    audit.begin_replay()
    replay.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
    until = time.monotonic() + args.replay_timeout
    if deadline is not None:
        until = min(until, deadline)
    while True:
        left = until - time.monotonic()
        if left <= 0 or not replay.poll(max(1, int(left * 1000))):
            audit.finish_replay(frames, f"no replay within {args.replay_timeout:g} s")
            # NOTE: a late answer must not be read as the reply to the next request.
            replay.close()
            return _dealer(ctx, args.replay)
        if not audit.on_replayed(replay.recv_multipart()):
            audit.finish_replay(frames)
            return replay


class _live:
    """A rich live summary on stderr, refreshed at most 4 times a second (off when quiet)."""

    def __init__(self, args: argparse.Namespace, audit: Any) -> None:
        self._audit = audit
        self._on = not (args.quiet or args.json)
        self._last = 0.0
        self._live: Any = None

    def __enter__(self) -> Any:
        if self._on:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(
                self._table(), console=Console(stderr=True), refresh_per_second=4, transient=True
            )
            self._live.__enter__()
        return self._refresh

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def _refresh(self) -> None:
        now = time.monotonic()
        if self._live is not None and now - self._last >= 0.25:
            self._last = now
            self._live.update(self._table())

    def _table(self) -> Any:
        from rich.table import Table

        a = self._audit
        table = Table(title="KV-event audit", show_header=False)
        table.add_row("batches", f"{a.batches} (last seq {a.last_seq})")
        table.add_row("events", ", ".join(f"{k} {n}" for k, n in sorted(a.events.items())))
        table.add_row("live blocks", f"{a.live} (peak {a.peak_live})")
        table.add_row("replays", f"{a.replays} ({a.replayed} batches)")
        for check, n in a.counts.items():
            table.add_row(check, "[green]ok[/green]" if n == 0 else f"[red]{n} broken[/red]")
        return table


def _print(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"KV-event audit of {report['endpoint']}")
    table.add_column("check")
    table.add_column("violations", justify="right")
    for check, n in report["violations_by_check"].items():
        table.add_row(check, "[green]0[/green]" if n == 0 else f"[red]{n}[/red]")
    console.print(table)
    events = ", ".join(f"{k} {n}" for k, n in report["events"].items()) or "none"
    console.print(
        f"{report['batches']} batches in {report['seconds']} s ({events}); "
        f"{report['live_blocks']} blocks live; {report['replays']} replays"
    )
    if report["joined_at"] is not None:
        console.print(f"joined the stream at batch {report['joined_at']}")
    if report["unverified_since"] is not None:
        console.print(
            f"[yellow]index unverified since batch {report['unverified_since']}: "
            f"{report['suspended_checks']} block checks suspended[/yellow]"
        )
    for v in report["violations"][:20]:
        cause = f" [{v['cause']}]" if "cause" in v else ""
        console.print(f"[red]{v['check']}[/red]{cause} at batch {v['seq']}: {v['message']}")
    if len(report["violations"]) > 20:
        console.print(f"... {len(report['violations']) - 20} more in the JSON report")
