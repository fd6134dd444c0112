"""prefixkv.impl: the optimized cache managers (the scheduler that drives them is in
``prefixkv.engine``)."""

from ._checkpoints import CheckpointStore
from .cache import PrefixCacheManager
from .hybrid import HybridPrefixCacheManager

__all__ = ["CheckpointStore", "HybridPrefixCacheManager", "PrefixCacheManager"]
