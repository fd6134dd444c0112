"""The invariant ids: every INV-* of the design, listed once.

The runtime checker (:mod:`.invariants`), the wrapper (:mod:`.checked`), the Z3 proofs
(``prefixkv.proofs``) and the conformance kit name an invariant by a member of
:class:`InvariantId`, never by a string of their own. Being a ``StrEnum``, a member *is* its
id string (``InvariantId.REF == "INV-REF"``), so reports, JSON and the ``--prefixkv-ignore``
option keep reading and writing plain ids.

Not every invariant is a predicate on one snapshot, so not every layer can check every one.
:data:`KIND` says which kind each is; each layer then asserts (in its tests) that it covers
the registry, minus the ids it leaves to another layer for the reason given here.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["KIND", "MEANING", "NOT_PROVED", "InvariantId", "Kind"]


class InvariantId(enum.StrEnum):
    """One INV-* of the design; the value is the id itself."""

    REF = "INV-REF"
    PARTITION = "INV-PARTITION"
    INDEX = "INV-INDEX"
    ANCESTOR = "INV-ANCESTOR"
    WRITE = "INV-WRITE"
    PUBLISH = "INV-PUBLISH"
    MATCH = "INV-MATCH"
    WINDOW = "INV-WINDOW"
    CKPT = "INV-CKPT"
    LIMIT = "INV-LIMIT"
    TXN = "INV-TXN"
    STATS = "INV-STATS"
    EVENTS = "INV-EVENTS"

    @property
    def meaning(self) -> str:
        """The invariant in one line (the design's wording, shortened)."""
        return MEANING[self]


MEANING: Mapping[InvariantId, str] = MappingProxyType(
    {
        InvariantId.REF: "refcount(b) equals the number of block tables that hold b",
        InvariantId.PARTITION: "free, evictable and in-use blocks partition the pool",
        InvariantId.INDEX: "every index entry points at a published block of that identity",
        InvariantId.ANCESTOR: "the parent of a published block is published",
        InvariantId.WRITE: "a step writes KV only into blocks private to the writer",
        InvariantId.PUBLISH: "published implies computed, committed and accepted tokens only",
        InvariantId.MATCH: "a match is block-aligned, leaves a token, ends outside any span, "
        "and its identities are the request's prefix",
        InvariantId.WINDOW: "a private recompute window holds only fresh private blocks",
        InvariantId.CKPT: "checkpoints follow their lifecycle within state_budget, and a "
        "restore reads a Ready checkpoint at exactly the matched boundary",
        InvariantId.LIMIT: "under kv_token_limit a sequence holds exactly "
        "ceil(min(needed, limit) / block_size) blocks",
        InvariantId.TXN: "a failed or rejected operation changes nothing, statistics included",
        InvariantId.STATS: "0 <= hits <= queries; computed + skipped prefill tokens = scheduled",
        InvariantId.EVENTS: "a consumer applying the drained events in order mirrors exactly "
        "the published blocks",
    }
)


class Kind(enum.StrEnum):
    """What an invariant is a predicate on, which decides where it can be checked."""

    #: One snapshot of a cache: :func:`.invariants.check` evaluates it.
    STATE = "state"
    #: One snapshot of a hybrid cache (choice 7); skipped on a snapshot without state slots.
    HYBRID_STATE = "hybrid-state"
    #: A snapshot and a match result: :func:`.invariants.check_match`; the snapshot part
    #: (the sequences' hits) is also in :func:`.invariants.check`.
    MATCH = "match"
    #: Two snapshots, before and after a refused call: :func:`.invariants.check_unchanged`.
    TRANSITION = "transition"
    #: The drained event stream and a snapshot: :func:`.invariants.check_events`.
    STREAM = "stream"


KIND: Mapping[InvariantId, Kind] = MappingProxyType(
    {
        InvariantId.REF: Kind.STATE,
        InvariantId.PARTITION: Kind.STATE,
        InvariantId.INDEX: Kind.STATE,
        InvariantId.ANCESTOR: Kind.STATE,
        InvariantId.WRITE: Kind.STATE,
        InvariantId.PUBLISH: Kind.STATE,
        InvariantId.MATCH: Kind.MATCH,
        InvariantId.WINDOW: Kind.STATE,
        InvariantId.CKPT: Kind.HYBRID_STATE,
        InvariantId.LIMIT: Kind.STATE,
        InvariantId.TXN: Kind.TRANSITION,
        InvariantId.STATS: Kind.STATE,
        InvariantId.EVENTS: Kind.STREAM,
    }
)

#: Invariants the Z3 proofs leave to the tests, and why.
NOT_PROVED: Mapping[InvariantId, str] = MappingProxyType(
    {
        InvariantId.EVENTS: "a property of the event stream a consumer drains, not of the "
        "cache's transition relation; the state machines check it after every step "
        "(tests/events/test_inv_events.py)",
    }
)
