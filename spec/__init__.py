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
    PrefixCacheError,
    UnknownSequence,
)
from .events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent
from .identity import (
    HASHERS,
    BlockHasher,
    BlockIdentity,
    fast_hash,
    sha256_hash,
    tokens_only_hash,
    weak_hash,
)
from .invariants import InvariantViolation, check, check_match, violations
from .multimodal import MultimodalSpan
from .namespace import Namespace
from .protocol import Inspectable, PrefixCache
from .request import Request, SeqId
from .results import Admission, CacheStats, LostReuse, Match
from .state import BlockView, CacheState, SeqView

__all__ = [
    "HASHERS",
    "Admission",
    "AllBlocksCleared",
    "BlockHasher",
    "BlockIdentity",
    "BlockRemoved",
    "BlockStored",
    "BlockView",
    "CacheBusy",
    "CacheState",
    "CacheStats",
    "CheckedCache",
    "DuplicateSequence",
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
    "PrefixCache",
    "PrefixCacheError",
    "Request",
    "SeqId",
    "SeqView",
    "SpecCache",
    "UnknownSequence",
    "check",
    "check_match",
    "checked",
    "fast_hash",
    "sha256_hash",
    "tokens_only_hash",
    "violations",
    "weak_hash",
]
