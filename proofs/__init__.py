"""prefixkv.proofs: Z3 proofs about the spec and the kernels' index arithmetic (a library;
the command is ``prefixkv prove``, :mod:`prefixkv.commands.prove`).

Four models, one package each: :mod:`.kv` (the KV block cache), :mod:`.ckpt` (the
recurrent-state checkpoints), :mod:`.spans` (multimodal spans in one sequence's life) and
:mod:`.joint` (the KV and checkpoint systems composed). Each has the same modules:

* ``model``: state, data types, the spec's decision points;
* ``formulas``: the invariants as formulas;
* ``transitions``: one transition per operation;
* ``obligations``: the proof obligations and the witnesses that they are not vacuous;
* ``broken``: deliberately broken variants, each refuted by a counterexample;
* ``drift``: the model checked against the executable spec;
* ``seeded``: drifted models (or specs) the drift check must catch;
* ``suite``: what ``prove`` runs of the model.

Each ``suite`` module exports the model's :class:`~.suite.ProofSuite` (``SUITE``), and
:func:`.run.run` is a loop over them (:data:`.run.SUITES`): the rows of ``prove --json``.

NOTE: the modules that are not a model's part sit beside the packages, each for a reason:

* :mod:`.small` states, proves and breaks the obligations of the two quantifier-free models
  (spans, joint): shared by two packages, it belongs to neither;
* :mod:`.driver` runs every model's drift check and seeded drifts, and :mod:`.terms` names
  the Z3 term types: shared by all four;
* :mod:`.suite` is the record every model exports, and :mod:`.run` the loop over them;
* :mod:`.kernel_index` proves ``prefixkv.kernels.index_math`` in bit-vectors by running the
  kernels' own functions on symbolic values: no state, no transitions and no model that
  could drift, so it is one module with a suite of obligations and broken variants;
* ``kv.concrete`` (concrete states, and the bridge to ``SpecCache``) and ``kv.calls`` (the
  drift check's random spec calls) are the KV model's alone: only its pool is symbolic, so
  only it needs concrete states to search and sample, and calls drawn for them.

Importing this package imports z3 and the spec, never torch.
"""

from .kv.model import OPS, Bounds
from .kv.obligations import INVARIANT_IDS, OPERATIONS, STRENGTHENINGS, Prover
from .kv.transitions import Encoding

__all__ = [
    "INVARIANT_IDS",
    "OPERATIONS",
    "OPS",
    "STRENGTHENINGS",
    "Bounds",
    "Encoding",
    "Prover",
    "prove",
]


def prove(bounds: Bounds | None = None) -> bool:
    """Whether every state obligation is proved under ``bounds`` (the default run's)."""
    rows = Prover(Encoding(bounds or Bounds())).rows()
    return all(r.status == "proved" for r in rows)
