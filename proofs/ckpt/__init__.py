"""INV-CKPT in Z3: the recurrent-state checkpoint lifecycle of ``HybridSpecCache``.

The same parts as :mod:`prefixkv.proofs.kv`: :mod:`.model` (state, data types, the spec's
decision points), :mod:`.formulas` (INV-CKPT's clauses), :mod:`.transitions` (one per
operation), :mod:`.obligations` (the prover), :mod:`.broken` (broken variants),
:mod:`.drift` (the model against ``HybridSpecCache``), :mod:`.seeded` (drifted models the
drift check must catch) and :mod:`.suite` (what ``prove`` runs of it).
"""

from .broken import CKPT_VARIANTS, CkptVariant, CkptVariantResult, check_ckpt_variant
from .model import (
    CKPT_IDS,
    CKPT_OPERATIONS,
    COUNTERS,
    DEFAULT_RLIMIT,
    LIST_FIELDS,
    PINNED,
    READY,
    SEQ_OPS,
    STRENGTHENINGS,
    CkptBounds,
    CState,
    Step,
)
from .obligations import CkptProver, CkptRow, applies, format_cstate, read_state
from .transitions import CkptModel

__all__ = [
    "CKPT_IDS",
    "CKPT_OPERATIONS",
    "CKPT_VARIANTS",
    "COUNTERS",
    "DEFAULT_RLIMIT",
    "LIST_FIELDS",
    "PINNED",
    "READY",
    "SEQ_OPS",
    "STRENGTHENINGS",
    "CState",
    "CkptBounds",
    "CkptModel",
    "CkptProver",
    "CkptRow",
    "CkptVariant",
    "CkptVariantResult",
    "Step",
    "applies",
    "check_ckpt_variant",
    "format_cstate",
    "read_state",
]
