"""The KV and checkpoint models composed: restore safety and routed experts.

The same parts as :mod:`prefixkv.proofs.kv` and :mod:`prefixkv.proofs.ckpt`: :mod:`.model`
(state, data types, terms), :mod:`.formulas` (the ``J-*`` invariants), :mod:`.transitions`
(the union of both transition sets, and the hybrid match), :mod:`.obligations` (the
obligations, RESTORE-SAFE, EXPERTS and witness scenarios;
:class:`~.obligations.JointModel` is the whole model), :mod:`.broken` (broken variants),
:mod:`.drift` (the model on ``HybridSpecCache``'s reachable states, and the routed-experts
lockstep), :mod:`.seeded` (drifted specs those checks must catch) and :mod:`.suite` (what
``prove`` runs of it).

NOTE: the joint model composes the KV and checkpoint systems over one node set; it belongs
to neither tree and shares neither's code (it is proved through :mod:`..small`), so it is a
package of its own beside them.
"""

from .broken import JOINT_VARIANTS
from .model import (
    FREE,
    JOINT_IDS,
    JOINT_OPERATIONS,
    PINNED,
    READY,
    RESTORE_OPS,
    STATE_IDS,
    JointBounds,
    JState,
)
from .obligations import JointModel

__all__ = [
    "FREE",
    "JOINT_IDS",
    "JOINT_OPERATIONS",
    "JOINT_VARIANTS",
    "PINNED",
    "READY",
    "RESTORE_OPS",
    "STATE_IDS",
    "JState",
    "JointBounds",
    "JointModel",
]
