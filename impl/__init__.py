"""prefixkv.impl: the optimized cache managers (the scheduler that drives them is in
``prefixkv.engine``)."""

from .cache import PrefixCacheManager
from .hybrid import HybridPrefixCacheManager

__all__ = ["HybridPrefixCacheManager", "PrefixCacheManager"]
