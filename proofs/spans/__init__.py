"""Multimodal spans in Z3: admission's clamp, the prefill chunks and the tail of one
sequence (the span parts of INV-LIMIT and INV-MATCH).

The same parts as :mod:`prefixkv.proofs.kv` and :mod:`prefixkv.proofs.ckpt`: :mod:`.model`
(state, data types, the spec's decision points), :mod:`.formulas` (the ``SPAN-*``
invariants), :mod:`.transitions` (one per operation), :mod:`.obligations` (the obligations
and witness scenarios; :class:`~.obligations.SpanModel` is the whole model),
:mod:`.broken` (broken variants), :mod:`.drift` (the model against ``SpecCache``),
:mod:`.seeded` (drifted models the drift check must catch) and :mod:`.suite` (what
``prove`` runs of it).

NOTE: the model refines the KV model's admission, chunks and tail, but it shares none of
its code: it is a handful of quantifier-free terms proved through :mod:`..small`, so it is a
package of its own, and a change to the KV encoding cannot silently change it.
"""

from .broken import SPAN_VARIANTS
from .model import (
    SPAN_IDS,
    SPAN_OPERATIONS,
    AdmitArgs,
    CommitArgs,
    ContinueArgs,
    CountArgs,
    SpanBounds,
    SpanState,
    Step,
)
from .obligations import SpanModel

__all__ = [
    "SPAN_IDS",
    "SPAN_OPERATIONS",
    "SPAN_VARIANTS",
    "AdmitArgs",
    "CommitArgs",
    "ContinueArgs",
    "CountArgs",
    "SpanBounds",
    "SpanModel",
    "SpanState",
    "Step",
]
