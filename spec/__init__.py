"""prefixkv.spec: the executable specification of a paged KV prefix cache.

Plain data and obvious code. Imports nothing heavy (no torch), so engines can depend on the
contract and the invariant checker alone.
"""

from .cache import SpecCache
from .checked import CheckedCache, checked
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
from .hybrid import HybridSpecCache, StateSlotPool
from .identity import (
    HASHERS,
    BlockHasher,
    BlockIdentity,
    fast_hash,
    sha256_hash,
    tokens_only_hash,
    weak_hash,
)
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
    "SpecCache",
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
    "tokens_only_hash",
    "violations",
    "weak_hash",
]
