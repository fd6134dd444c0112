"""prefixkv.spec: the executable specification of a paged KV prefix cache.

Plain data and obvious code. Imports nothing heavy (no torch), so engines can depend on the
contract and the invariant checker alone.

The hashes that collide on purpose (for tests and the conformance kit) are not exported
here: import them from :mod:`prefixkv.spec.hashing`.
"""

from .cache import SpecCache
from .checked import CheckedCache, checked
from .checkpoint import CheckpointStatus, SlotRole, StateRef
from .errors import (
    CacheBusy,
    DuplicateSequence,
    InvalidOperation,
    InvalidRequest,
    OutOfBlocks,
    OutOfStateSlots,
    PrefixCacheError,
    UnknownSequence,
    WrongSlotRole,
)
from .event_mirror import EventMirror, EventStreamError
from .events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CheckpointRemoved,
    CheckpointStored,
    KVEvent,
)
from .hashing import HASHERS
from .hybrid import HybridSpecCache, StateSlotPool
from .identity import BlockHasher, BlockIdentity, fast_hash, sha256_hash
from .invariant_ids import InvariantId
from .invariants import InvariantViolation, check, check_events, check_match, violations
from .multimodal import MultimodalSpan
from .namespace import Namespace
from .protocol import EngineSteps, HybridPrefixCache, Inspectable, PrefixCache
from .request import Request, SeqId
from .results import Admission, CacheStats, LostReuse, Match
from .state import BlockView, CacheState, CheckpointView, SeqView, StateSlotsView
from .steps import BatchOutcome, DecodeStep

__all__ = [
    "HASHERS",
    "Admission",
    "AllBlocksCleared",
    "BatchOutcome",
    "BlockHasher",
    "BlockIdentity",
    "BlockRemoved",
    "BlockStored",
    "BlockView",
    "CacheBusy",
    "CacheState",
    "CacheStats",
    "CheckedCache",
    "CheckpointRemoved",
    "CheckpointStatus",
    "CheckpointStored",
    "CheckpointView",
    "DecodeStep",
    "DuplicateSequence",
    "EngineSteps",
    "EventMirror",
    "EventStreamError",
    "HybridPrefixCache",
    "HybridSpecCache",
    "Inspectable",
    "InvalidOperation",
    "InvalidRequest",
    "InvariantId",
    "InvariantViolation",
    "KVEvent",
    "LostReuse",
    "Match",
    "MultimodalSpan",
    "Namespace",
    "OutOfBlocks",
    "OutOfStateSlots",
    "PrefixCache",
    "PrefixCacheError",
    "Request",
    "SeqId",
    "SeqView",
    "SlotRole",
    "SpecCache",
    "StateRef",
    "StateSlotPool",
    "StateSlotsView",
    "UnknownSequence",
    "WrongSlotRole",
    "check",
    "check_events",
    "check_match",
    "checked",
    "fast_hash",
    "sha256_hash",
    "violations",
]
