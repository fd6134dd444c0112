"""prefixkv.impl: the optimized cache manager (and, later, the scheduler and engine)."""

from .cache import PrefixCacheManager

__all__ = ["PrefixCacheManager"]
