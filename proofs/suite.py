"""What ``prove`` runs of one model: a :class:`ProofSuite`, and the records it trades.

Each model exports one suite (``prefixkv.proofs.<model>.suite.SUITE``; the kernels'
index arithmetic, :data:`prefixkv.proofs.kernel_index.SUITE`): its name, the invariants and
operations ``--invariants`` and ``--operations`` may pick for it, and four parts, each
called with the run's :class:`Selection`:

* ``obligations``: prove what the selection asks, stream each row, and return a
  :class:`Part`: whether all is proved, the model's keys of the ``--json`` document and its
  summary lines for the text table;
* ``alone`` (``--alone``, the KV model only): which invariants are not inductive alone;
* ``broken`` (``--broken``): the rows of the deliberately broken variants;
* ``drift`` (``--drift N``): the model-vs-spec drift check and the seeded drifts.

:func:`prefixkv.proofs.run.run` loops over the registry of suites, part by part, so a new
model joins ``prove`` by exporting a suite and being listed in
:data:`prefixkv.proofs.run.SUITES`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from . import small
from .driver import SeededResult
from .kv.model import Bounds
from .kv.obligations import DEFAULT_RLIMIT

__all__ = [
    "BrokenRow",
    "Emit",
    "Part",
    "ProofSuite",
    "ProveOptions",
    "Seeded",
    "Selection",
    "Show",
    "say_seeded",
    "seeded_rows",
    "small_suite",
]

Emit = Callable[[str], None]
"""Receives each line of the text table as soon as it is known."""

Show = Callable[[str, str, str, float, str], None]
"""Streams one proved row: invariant, operation, status, seconds, how (the model)."""

BrokenRow = dict[str, Any]
"""One row of the ``broken`` list of the ``--json`` document."""

Seeded = tuple[str, str, Any]
"""A seeded drift: its name, what it breaks, and the drifted model (or spec) class."""


@attrs.frozen
class ProveOptions:
    """What to run (the flags of ``prefixkv prove``, by the same names)."""

    seqs: int = Bounds.seqs
    table: int = Bounds.table
    rlimit: int = DEFAULT_RLIMIT
    seed: int = 0
    invariants: str = ""
    operations: str = ""
    no_kernels: bool = False
    no_checkpoints: bool = False
    no_spans: bool = False
    no_joint: bool = False
    no_witnesses: bool = False
    broken: bool = False
    drift: int = 0
    alone: bool = False
    verbose: bool = False


@attrs.frozen
class Selection:
    """One run's options, with ``--invariants`` and ``--operations`` resolved (every known
    one when a flag is not given), and where each proved row goes."""

    opts: ProveOptions
    invariants: tuple[str, ...]
    operations: tuple[str, ...]
    show: Show

    @property
    def bounds(self) -> Bounds:
        """The KV model's bounds (``--seqs``, ``--table``)."""
        return Bounds(seqs=self.opts.seqs, table=self.opts.table)

    def invariants_of(self, known: Sequence[str]) -> list[str]:
        """The picked invariants among ``known``, in the order they were picked."""
        return [i for i in self.invariants if i in known]

    def operations_of(self, known: Sequence[str]) -> list[str]:
        """The asked operations among ``known``, in the order they were asked."""
        return [o for o in self.operations if o in known]


@attrs.define
class Part:
    """What one part of a suite gives the run: whether everything in it holds, its keys of
    the ``--json`` document, and its lines of the text table (printed after every suite's
    proved rows)."""

    ok: bool = True
    doc: dict[str, Any] = attrs.Factory(dict)
    lines: list[str] = attrs.Factory(list)


def _no_part(_: Selection) -> Part:
    return Part()


def _no_rows(_: Selection) -> list[BrokenRow]:
    return []


@attrs.frozen
class ProofSuite:
    """One model as ``prove`` runs it (see the module doc for the parts)."""

    name: str
    invariants: tuple[str, ...]  # what --invariants may name for this model
    operations: tuple[str, ...]  # what --operations may name for this model
    obligations: Callable[[Selection], Part]
    broken: Callable[[Selection], list[BrokenRow]] = _no_rows
    drift: Callable[[Selection], Part] = _no_part
    alone: Callable[[Selection], Part] = _no_part
    seeded: tuple[Seeded, ...] = ()  # the drifted models its drift check must catch


def seeded_rows(seeded: Sequence[SeededResult], checks_key: str) -> list[dict[str, Any]]:
    """The JSON rows of seeded drifts (``checks_key``: the name the model's report uses)."""
    return [
        {"name": s.name, "description": s.description, "caught": s.caught, checks_key: s.checks}
        for s in seeded
    ]


def say_seeded(seeded: Sequence[SeededResult], unit: str = "checks", width: int = 24) -> list[str]:
    """One text line per seeded drift: caught after how many checks (or steps), or MISSED."""
    lines = []
    for s in seeded:
        verdict = f"caught after {s.checks} {unit}" if s.caught else "MISSED"
        lines.append(f"  seeded drift {s.name:<{width}} {verdict}")
    return lines


def small_suite(
    name: str,
    key: str,
    skip_flag: str,
    model: Callable[[], small.SmallModel],
    operations: tuple[str, ...],
    variants: tuple[small.Variant, ...],
    drift: Callable[[Selection], Part],
    seeded: tuple[Seeded, ...],
) -> ProofSuite:
    """The suite of a small model (:mod:`.small`): ``name`` is its group as
    ``--invariants`` names it (``SPANS``), ``key`` its key of the ``--json`` document,
    ``skip_flag`` the option that skips it; ``drift`` runs only when the model was picked."""
    parts = _SmallParts(name, key, skip_flag, model, operations, variants, drift)
    return ProofSuite(
        name=name,
        invariants=(name,),
        operations=operations,
        obligations=parts.obligations,
        broken=parts.broken,
        drift=parts.drift_if_picked,
        seeded=seeded,
    )


@attrs.frozen
class _SmallParts:
    """The parts of a small model's suite (:func:`small_suite`)."""

    name: str
    key: str
    skip_flag: str
    model: Callable[[], small.SmallModel]
    operations: tuple[str, ...]
    variants: tuple[small.Variant, ...]
    drift: Callable[[Selection], Part]

    def picked(self, sel: Selection) -> list[str]:
        """The model's asked operations; none when it is not picked or is skipped."""
        if self.name not in sel.invariants or getattr(sel.opts, self.skip_flag):
            return []
        return sel.operations_of(self.operations)

    def obligations(self, sel: Selection) -> Part:
        ops, opts = self.picked(sel), sel.opts
        if not ops:
            return Part()
        m = self.model()

        def progress(r: small.SmallRow) -> None:
            sel.show(f"{self.name}:{r.invariant}", r.operation, r.status, r.seconds, r.model)

        run = small.prove_all(
            m,
            ops,
            rlimit=opts.rlimit,
            seed=opts.seed,
            witnesses=not opts.no_witnesses,
            progress=progress,
        )
        doc = {
            self.key: {
                "bounds": m.describe(),
                "obligations": [r.as_dict() for r in run.rows],
                "non_vacuity": {
                    op: {
                        "scenario": w[0],
                        "status": w[1],
                        **({"witness": w[2]} if opts.verbose else {}),
                    }
                    for op, w in run.witnesses.items()
                },
            }
        }
        return Part(run.ok, doc, self.summary(m, run))

    def summary(self, m: small.SmallModel, run: small.ModelRun) -> list[str]:
        proved = sum(r.status == "proved" for r in run.rows)
        lines = [f"{proved}/{len(run.rows)} {self.name} obligations proved ({m.describe()})"]
        for sr in run.rows:
            if sr.status != "proved":
                lines.append(f"\n{sr.invariant} / {sr.operation}: {sr.status}\n{sr.detail}")
        for op, (scenario, status, _) in run.witnesses.items():
            if status != "sat":
                lines.append(f"  {op}: {scenario}: {status}")
        return lines

    def broken(self, sel: Selection) -> list[BrokenRow]:
        if not self.picked(sel):
            return []
        opts = sel.opts
        return [
            {
                "name": r.variant.name,
                "invariant": f"{self.name}:{r.variant.prop}",
                "step": r.variant.operation,
                "kind": r.variant.kind,
                "description": r.variant.description,
                "caught": r.caught,
                "seconds": round(r.row.seconds, 3),
                "counterexample": r.row.detail if r.caught else None,
            }
            for r in (
                small.check_variant(v, rlimit=opts.rlimit, seed=opts.seed) for v in self.variants
            )
        ]

    def drift_if_picked(self, sel: Selection) -> Part:
        return self.drift(sel) if self.picked(sel) else Part()
