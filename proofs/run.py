"""Run the proofs: every model's obligations, broken variants and drift checks.

The library half of ``prefixkv prove`` (the command, :mod:`prefixkv.commands.prove`, parses
the flags into :class:`ProveOptions` and prints). :func:`run` returns a :class:`ProofReport`:
the JSON document of every row, and whether everything was proved; while it runs it hands
each line of the human-readable table to ``emit``, so a caller can stream it.

:func:`run` is a loop over :data:`SUITES`, one :class:`~prefixkv.proofs.suite.ProofSuite` per
model, part by part: every suite's obligations (their rows streamed as they are proved,
then every suite's summary), then ``--alone``, ``--broken`` and ``--drift``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import attrs
from prefixkv.spec.invariant_ids import InvariantId

from prefixkv.errors import InvalidConfig

from . import kernel_index
from .ckpt import suite as ckpt_suite
from .joint import suite as joint_suite
from .kv import obligations
from .kv import suite as kv_suite
from .spans import suite as spans_suite
from .suite import BrokenRow, Emit, Part, ProofSuite, ProveOptions, Selection

__all__ = [
    "PROVED",
    "SUITES",
    "InvalidSelection",
    "ProofReport",
    "ProveOptions",
    "run",
]

#: Every invariant ``prove`` has obligations for (``--invariants`` picks among them); the
#: registry's other ids are in ``prefixkv.spec.invariant_ids.NOT_PROVED``, with the reason.
PROVED = (*obligations.PROPERTY_IDS, InvariantId.CKPT)

SUITES: tuple[ProofSuite, ...] = (
    kv_suite.SUITE,
    ckpt_suite.SUITE,
    spans_suite.SUITE,
    joint_suite.SUITE,
    kernel_index.SUITE,
)
"""Every model ``prove`` runs, in the order of its rows and of the ``--json`` document."""


class InvalidSelection(InvalidConfig):
    """An unknown invariant or operation, or bounds the model cannot run with."""


@attrs.frozen
class ProofReport:
    """The outcome of :func:`run`: ``doc`` is the ``--json`` document (``ok`` included)."""

    ok: bool
    doc: dict[str, Any]

    @property
    def seconds(self) -> float:
        return float(self.doc["seconds"])


def _csv(value: str, allowed: Sequence[str], what: str) -> tuple[str, ...]:
    items = [x.strip() for x in value.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad:
        raise InvalidSelection(
            f"unknown {what}: {', '.join(bad)} (choose from {', '.join(allowed)})"
        )
    return tuple(items or allowed)


def _select(opts: ProveOptions, suites: Sequence[ProofSuite], emit: Emit | None) -> Selection:
    """The run's :class:`Selection`; raises :class:`InvalidSelection` on a bad choice."""
    if opts.seqs < 2 or opts.table < 1:
        raise InvalidSelection("--seqs must be >= 2 and --table >= 1")
    invariants = [i for s in suites for i in s.invariants]
    operations = list(dict.fromkeys(o for s in suites for o in s.operations))

    def show(inv: str, op: str, status: str, seconds: float, via: str) -> None:
        if emit is not None:
            emit(f"{inv:<24}{op:<42}{status:<16}{seconds:>7.2f}s  {via}")

    return Selection(
        opts,
        _csv(opts.invariants, invariants, "invariant"),
        _csv(opts.operations, operations, "operation"),
        show,
    )


def _broken(sel: Selection, suites: Sequence[ProofSuite]) -> Part:
    rows: list[BrokenRow] = [row for s in suites for row in s.broken(sel)]
    lines = [f"\n{'broken variant':<34}{'invariant':<24}{'kind':<18}result"]
    for item in rows:
        verdict = "counterexample" if item["caught"] else "NOT CAUGHT"
        lines.append(f"{item['name']:<34}{item['invariant']:<24}{item['kind']:<18}{verdict}")
        if sel.opts.verbose and item["counterexample"]:
            lines.append(item["counterexample"] + "\n")
    return Part(all(r["caught"] for r in rows), {"broken": rows}, lines)


def _later(part: Callable[[], Part]) -> Iterator[Part]:
    """``part``'s one :class:`Part`, made when the loop reaches it."""
    yield part()


def run(
    opts: ProveOptions, emit: Emit | None = None, suites: Sequence[ProofSuite] = SUITES
) -> ProofReport:
    """Run what ``opts`` asks for of every suite.

    Args:
        opts: the options (the flags of ``prefixkv prove``).
        emit: receives each line of the text table as soon as it is known (none: no text).
        suites: the models to run, in order (every model's by default).

    Returns:
        The report: whether everything held, and the ``--json`` document.

    Raises:
        InvalidSelection: an unknown invariant or operation, or bounds out of range.
    """
    t0 = time.perf_counter()
    sel = _select(opts, suites, emit)
    doc: dict[str, Any] = {
        "bounds": sel.bounds.describe(),
        "rlimit": opts.rlimit,
        "seed": opts.seed,
    }
    if emit is not None:
        emit(f"prefixkv proofs: {doc['bounds']}; rlimit {opts.rlimit}, seed {opts.seed}")
        emit(f"{'invariant':<24}{'operation':<42}{'result':<16}{'time':>8}  via")
    # Each phase's parts, in the order they are printed: the obligations all at once (their
    # rows stream while they are proved, the summaries follow), the others as they finish.
    phases: list[Iterable[Part]] = [[s.obligations(sel) for s in suites]]
    if opts.alone:
        phases.append(s.alone(sel) for s in suites)
    if opts.broken:
        phases.append(_later(lambda: _broken(sel, suites)))
    if opts.drift:
        phases.append(s.drift(sel) for s in suites)
    ok = True
    for part in (part for phase in phases for part in phase):
        ok &= part.ok
        doc.update(part.doc)
        if emit is not None:
            for line in part.lines:
                emit(line)
    doc["ok"] = bool(ok)
    doc["seconds"] = round(time.perf_counter() - t0, 3)
    return ProofReport(bool(ok), doc)
