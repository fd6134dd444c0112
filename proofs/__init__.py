"""prefixkv.proofs: Z3 proofs about the spec and the kernels' index arithmetic (a library;
the command is ``prefixkv prove``, :mod:`prefixkv.commands.prove`).

Two parallel trees, one per transition system of the spec, with the same parts each:

============================  =========================  ==============================
part                          KV cache (:mod:`.kv`)      checkpoints (:mod:`.ckpt`)
============================  =========================  ==============================
state, data types, the spec's ``kv.model``               ``ckpt.model``
decision points
invariants as formulas        ``kv.formulas``            ``ckpt.formulas``
one transition per operation  ``kv.transitions``         ``ckpt.transitions``
proof obligations             ``kv.obligations``         ``ckpt.obligations``
broken variants               ``kv.broken``              ``ckpt.broken``
drift check against the spec  ``kv.drift``               ``ckpt.drift``
============================  =========================  ==============================

NOTE: the two small models go where what they prove lives. The span model
(:mod:`.spans`) proves the span parts of INV-LIMIT and INV-MATCH: it refines the KV model's
admission, chunks and tail and is checked against ``SpecCache``, but shares no code with
the KV encoding, so it is a package of its own with the same parts. The joint model
(:mod:`.joint`: ``model``, ``drift``) composes the KV and checkpoint systems over one node
set; it belongs to neither tree, so it is a package of its own beside them.

Shared by all: :mod:`.small` (how a small model states, proves and breaks an obligation),
:mod:`.driver` (the drift runs and seeded drifts), :mod:`.terms` (the typed names of Z3
terms), :mod:`.run` (run every model's obligations, variants and drift checks: the rows of
``prove --json``) and :mod:`.kernel_index` (``prefixkv.kernels.index_math`` in bit-vectors).

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
