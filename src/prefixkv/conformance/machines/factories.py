"""Pairs of caches for the differential machines.

A machine is built from a :data:`PairFactory`: given the pool a run drew, it returns
``(reference, candidate)``. Both must offer the :class:`~prefixkv.spec.PrefixCache` API plus
``snapshot() -> CacheState``. The reference is normally :class:`~prefixkv.spec.SpecCache`;
the candidate is the implementation under test (``prefixkv.impl``, or another engine's block
manager behind an adapter).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias, cast

import attrs

from prefixkv.spec import HASHERS, BlockHasher, SpecCache, fast_hash

if TYPE_CHECKING:
    from prefixkv.impl import PrefixCacheManager

    from ..adapters import BlockManagerAdapter

__all__ = [
    "PairFactory",
    "PoolConfig",
    "candidate_class",
    "spec_pair",
    "spec_vs_impl",
]


@attrs.frozen
class PoolConfig:
    """The pool a run drew: what both caches of a pair are built with."""

    num_blocks: int
    block_size: int
    record_events: bool = True


#: ``make_pair(config) -> (reference, candidate)``; no reference: the candidate runs alone
#: (the safety mode). A candidate may lack the operations its capabilities declare missing.
PairFactory: TypeAlias = (
    "Callable[[PoolConfig], tuple[BlockManagerAdapter | None, BlockManagerAdapter]]"
)


def candidate_class() -> type[PrefixCacheManager] | type[SpecCache]:
    """``prefixkv.impl.PrefixCacheManager``, or ``SpecCache`` while the impl cannot import.

    Resolved on every call (not at import) so that a harness can install a patched
    ``prefixkv.impl`` in ``sys.modules`` first.
    """
    try:
        module = importlib.import_module("prefixkv.impl")
        cls: type[PrefixCacheManager] = module.PrefixCacheManager
    except (ImportError, AttributeError):
        return SpecCache
    return cls


def _hasher(hasher: BlockHasher | str) -> BlockHasher:
    return HASHERS[hasher] if isinstance(hasher, str) else hasher


def spec_vs_impl(
    hasher: BlockHasher | str = fast_hash, *, heap_slack: int | None = None
) -> PairFactory:
    """SpecCache (reference) against prefixkv.impl (candidate), both with ``hasher``.

    ``heap_slack`` is passed to the impl's constructor (its test knob, the stale-entry
    slack of the eviction heap): 0 rebuilds the heap whenever stale entries outnumber cached
    blocks twice over, a negative one sooner, so that path runs on the small pools the
    machines use. It is not passed to the spec, nor when the candidate is the spec (an impl
    that cannot import).
    """
    h = _hasher(hasher)

    def make_pair(cfg: PoolConfig) -> tuple[BlockManagerAdapter, BlockManagerAdapter]:
        cls = candidate_class()
        n, bs, events = cfg.num_blocks, cfg.block_size, cfg.record_events
        ref = SpecCache(n, bs, hasher=h, record_events=events)
        cand: PrefixCacheManager | SpecCache
        if heap_slack is not None and cls is not SpecCache:
            impl = cast("type[PrefixCacheManager]", cls)  # the spec has no eviction heap
            cand = impl(n, bs, hasher=h, record_events=events, heap_slack=heap_slack)
        else:
            cand = cls(n, bs, hasher=h, record_events=events)
        return ref, cand

    make_pair.__name__ = f"spec_vs_impl_{getattr(h, '__name__', 'hash')}"
    return make_pair


def spec_pair(hasher: BlockHasher | str = fast_hash) -> PairFactory:
    """Two SpecCaches: the machine checking itself (every step must agree trivially)."""
    h = _hasher(hasher)

    def make_pair(cfg: PoolConfig) -> tuple[BlockManagerAdapter, BlockManagerAdapter]:
        def one() -> SpecCache:
            return SpecCache(
                cfg.num_blocks, cfg.block_size, hasher=h, record_events=cfg.record_events
            )

        return one(), one()

    return make_pair
