"""prefixkv.proofs: Z3 proofs about the spec and the kernels' index arithmetic.

* :mod:`.encoding`: the spec's transition system in Z3 (state, one transition per operation).
* :mod:`.obligations`: every invariant inductive over every operation, plus non-vacuity.
* :mod:`.broken`: deliberately broken encodings, each refuted by a printed counterexample.
* :mod:`.drift`: the model and the Python spec agree step by step on concrete states.
* :mod:`.checkpoints`: INV-CKPT, the checkpoint lifecycle of ``HybridSpecCache``: its own
  model, obligations, non-vacuity and broken variants; :mod:`.ckpt_drift` checks it
  against the spec.
* :mod:`.spans`: multimodal spans in admission's match, the chunks and the tail (the span
  parts of INV-LIMIT and INV-MATCH); :mod:`.span_drift` checks it against the spec.
* :mod:`.joint`: the KV and checkpoint transition systems composed over one node set:
  restore safety over every interleaving, and routed experts' non-interference;
  :mod:`.joint_drift` checks it on the hybrid spec's reachable states.
* :mod:`.small`: how the small models state, prove and break their obligations.
* :mod:`.kernel_index`: ``prefixkv.kernels.index_math`` in bit-vectors and integers.
* :mod:`.cli`: ``python -m prefixkv.proofs`` (``add_arguments``/``run`` for the project CLI).

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
