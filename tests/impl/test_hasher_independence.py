"""A returned result never depends on the hasher (issue: the lost-reuse split did).

The reference is the spec under sha256, the candidate the impl under the weak hasher (four
buckets: nearly every lookup collides). Everything an engine can observe must agree: every
result (each ``Match`` with its whole ``LostReuse`` split, every ``Admission``), the
sequences, the free queue and the statistics. Block hashes, the index keys and the events
carry the hash itself, so they are not compared (and events are off).
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import SpecCache, sha256_hash
from prefixkv.spec.hashing import weak_hash

from prefixkv.conformance.machines import PoolConfig, build_machine

_OBSERVABLE = frozenset({"free_queue", "sequences", "stats"})


def _sha_vs_weak(cfg: PoolConfig) -> tuple[Any, Any]:
    ref = SpecCache(cfg.num_blocks, cfg.block_size, hasher=sha256_hash)
    cand = PrefixCacheManager(cfg.num_blocks, cfg.block_size, hasher=weak_hash)
    return ref, cand


HasherIndependent = build_machine(
    "ShaSpecVsWeakImpl",
    _sha_vs_weak,
    num_blocks=(4, 16),
    block_sizes=(1, 3),
    record_events=(False,),
    compared_fields=_OBSERVABLE,
)
TestHasherIndependent = HasherIndependent.TestCase
TestHasherIndependent.settings = settings(
    max_examples=max(10, settings().max_examples // 2), stateful_step_count=80
)
