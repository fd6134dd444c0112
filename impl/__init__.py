"""prefixkv.impl: the optimized cache manager (and, later, the scheduler and engine)."""

from .cache import PrefixCacheManager
from .hybrid import HybridPrefixCacheManager

__all__ = ["HybridPrefixCacheManager", "PrefixCacheManager"]
