"""The adapter factories prefixkv ships: its own two caches, as conformance candidates.

They need no wrapping (both already speak the adapter protocol), so these factories only
fix the constructor's signature. They serve as the known-good baseline of the kit::

    pytest --prefixkv-adapter=prefixkv.conformance.reference_adapters:impl_adapter

and as the template of an adapter factory for another block manager.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefixkv.spec import SpecCache, fast_hash

from .adapters import adapter
from .capabilities import Capabilities

if TYPE_CHECKING:
    from prefixkv.impl import HybridPrefixCacheManager, PrefixCacheManager

__all__ = ["hybrid_impl_adapter", "impl_adapter", "spec_adapter"]


@adapter(capabilities=Capabilities())
def impl_adapter(num_blocks: int, block_size: int, *, record_events: bool) -> PrefixCacheManager:
    """``prefixkv.impl.PrefixCacheManager``: every capability, exact against the spec."""
    from prefixkv.impl import PrefixCacheManager

    return PrefixCacheManager(num_blocks, block_size, hasher=fast_hash, record_events=record_events)


@adapter(capabilities=Capabilities())
def spec_adapter(num_blocks: int, block_size: int, *, record_events: bool) -> SpecCache:
    """``prefixkv.spec.SpecCache`` itself: the spec conforms to the spec, trivially in exact
    mode and non-trivially in the policy-agnostic mode (``-exact``)."""
    return SpecCache(num_blocks, block_size, hasher=fast_hash, record_events=record_events)


@adapter(capabilities=Capabilities(checkpoints=True, routed_experts=True))
def hybrid_impl_adapter(
    num_blocks: int,
    block_size: int,
    *,
    record_events: bool,
    max_num_seqs: int,
    state_budget: int,
    decode_state_interval: int,
) -> HybridPrefixCacheManager:
    """``prefixkv.impl.HybridPrefixCacheManager``: checkpoints and routed experts, exact
    against ``HybridSpecCache``."""
    from prefixkv.impl import HybridPrefixCacheManager

    return HybridPrefixCacheManager(
        num_blocks,
        block_size,
        max_num_seqs=max_num_seqs,
        state_budget=state_budget,
        decode_state_interval=decode_state_interval,
        hasher=fast_hash,
        record_events=record_events,
    )
