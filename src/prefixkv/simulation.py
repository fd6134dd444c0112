"""Replay a multi-turn chat workload through a cache, the way an engine drives it.

The driver behind ``prefixkv simulate``, the "see it work" demo. It drives the cache
exactly as a serving engine would (the decode protocol of ``docs/design.md``), on the
synthetic chat workload of :mod:`prefixkv.workloads`, and reports what the cache saved:
the hit rate, the prefill tokens computed and skipped, evictions, blocks published and the
peak pool utilization.

Driving a cache, per request::

    adm = cache.admit(Request(seq_id, prompt, ns))          # cached + scheduled prompt slots
    cache.commit(seq_id, adm.num_scheduled_tokens, [r0])    # prefill written, r0 sampled
    for t in reply[1:]:                                     # decode, one token at a time
        cache.append(seq_id, 1); cache.commit(seq_id, 1, [t])

Finished sequences stay live for a while (``--live``: the most recently finished ones), as
they would while a server streams their replies or keeps them for a follow-up; older ones are
freed in one batch. When the pool runs dry, the oldest finished sequences are freed early.
"""

from __future__ import annotations

import functools
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs

from prefixkv.errors import InvalidConfig, require_int
from prefixkv.spec import (
    HASHERS,
    HybridPrefixCache,
    HybridSpecCache,
    Inspectable,
    Namespace,
    OutOfBlocks,
    PrefixCache,
    Request,
    SeqId,
    SpecCache,
)
from prefixkv.spec.invariants import check
from prefixkv.workloads import ChatConfig, ChatTurn, ChatWorkload, chat_workload

__all__ = [
    "IMPL_PRESET",
    "SPEC_PRESET",
    "WORKLOADS",
    "Drive",
    "HybridModel",
    "Preset",
    "SimulationResult",
    "SimulationSetup",
    "make_cache",
    "replay",
    "resolve",
    "simulate",
]

_T = TypeVar("_T")

#: Every simulated request uses this namespace (one model, no adapter, no tenant salt).
NAMESPACE = Namespace("prefixkv-sim@1")


@attrs.frozen
class Drive:
    """How the engine drives each request, beyond admit / commit / decode.

    * ``kv_token_limit``: prefill in chunks of at most this many tokens (choice 8):
      ``admit`` schedules the first chunk, ``continue_prefill`` each next one.
    * ``recompute_blocks``: the private recompute window of every request (choice 6).
    * ``draft_tokens``: speculative decoding: each step reserves the pending token plus
      this many drafts, commits the accepted ones plus a bonus token and rolls the rest back.
      Each draft is accepted with probability ``acceptance`` until the first rejection.
    """

    kv_token_limit: int | None = None
    recompute_blocks: int = 0
    draft_tokens: int = 0
    acceptance: float = 0.7
    seed: int = 0


@attrs.frozen
class HybridModel:
    """A hybrid (attention + recurrent) model: its recurrent-state slot pool (choice 7).

    ``max_num_seqs`` runtime slots (live sequences, finished ones kept live included),
    ``state_budget`` checkpoint slots beyond them, and a decode checkpoint every
    ``decode_state_interval`` tokens.
    """

    max_num_seqs: int
    state_budget: int
    decode_state_interval: int


@attrs.frozen
class Preset:
    """Defaults for one cache kind: the workload shape, the pool and how it is driven."""

    workload: ChatConfig
    num_blocks: int
    block_size: int
    live: int
    drive: Drive = Drive()
    hybrid: HybridModel | None = None


#: The impl runs the benchmark's chat workload on a pool small enough to evict.
IMPL_PRESET = Preset(workload=ChatConfig(), num_blocks=4096, block_size=16, live=32)

#: The spec deep-copies its whole state on every operation, so it gets a toy workload.
SPEC_PRESET = Preset(
    workload=ChatConfig(
        conversations=12,
        turns=3,
        system_prompts=2,
        system_tokens=64,
        user_tokens=(8, 24),
        reply_tokens=(4, 12),
    ),
    num_blocks=160,
    block_size=4,
    live=4,
)

_IMAGES: dict[str, Any] = {"image_tokens": 256, "image_pool": 16, "image_rate": 0.5}
_SPECULATIVE = Drive(recompute_blocks=1, draft_tokens=3, acceptance=0.7)

#: ``--workload``: ``(impl preset, spec preset)`` per workload.
WORKLOADS: dict[str, tuple[Preset, Preset]] = {
    "chat": (IMPL_PRESET, SPEC_PRESET),
    # Images in half of the user turns, shared across conversations; chunked prefill.
    "multimodal": (
        attrs.evolve(
            IMPL_PRESET,
            workload=attrs.evolve(IMPL_PRESET.workload, **_IMAGES),
            drive=Drive(kv_token_limit=512),
        ),
        attrs.evolve(
            SPEC_PRESET,
            workload=attrs.evolve(SPEC_PRESET.workload, image_tokens=8, image_pool=4),
            drive=Drive(kv_token_limit=16),
        ),
    ),
    # MTP-style speculative decoding: 3 drafts a step, a one-block recompute window.
    "speculative": (
        attrs.evolve(IMPL_PRESET, drive=_SPECULATIVE),
        attrs.evolve(SPEC_PRESET, drive=_SPECULATIVE),
    ),
    # A hybrid model: hits only where a recurrent-state checkpoint was saved (each prefill
    # chunk's last full block, every 4 blocks of decode); chunked prefill, 2 drafts a step.
    "hybrid": (
        attrs.evolve(
            IMPL_PRESET,
            drive=Drive(kv_token_limit=256, draft_tokens=2),
            hybrid=HybridModel(max_num_seqs=40, state_budget=256, decode_state_interval=64),
        ),
        attrs.evolve(
            SPEC_PRESET,
            drive=Drive(kv_token_limit=16, draft_tokens=2),
            hybrid=HybridModel(max_num_seqs=6, state_budget=8, decode_state_interval=16),
        ),
    ),
}


def make_cache(
    kind: str,
    num_blocks: int,
    block_size: int,
    hash_name: str = "fast",
    hybrid: HybridModel | None = None,
) -> PrefixCache:
    """A fresh ``"impl"`` (:class:`~prefixkv.impl.PrefixCacheManager`) or ``"spec"`` cache;
    their hybrid-model variants when ``hybrid`` is given."""
    if hash_name not in HASHERS:
        raise InvalidConfig(f"unknown hash {hash_name!r}: expected one of {sorted(HASHERS)}")
    hasher = HASHERS[hash_name]
    if hybrid is not None:
        kwargs = attrs.asdict(hybrid)
        if kind == "spec":
            return HybridSpecCache(num_blocks, block_size, hasher=hasher, **kwargs)
        if kind == "impl":
            from prefixkv.impl import HybridPrefixCacheManager

            return HybridPrefixCacheManager(num_blocks, block_size, hasher=hasher, **kwargs)
    if kind == "spec":
        return SpecCache(num_blocks, block_size, hasher=hasher)
    if kind == "impl":
        from prefixkv.impl import PrefixCacheManager

        return PrefixCacheManager(num_blocks, block_size, hasher=hasher)
    raise InvalidConfig(f"unknown cache kind {kind!r}: expected 'impl' or 'spec'")


@attrs.frozen
class SimulationResult:
    """What one replay did and what the cache saved."""

    requests: int
    prompt_tokens: int
    reply_tokens: int
    blocks_touched: int
    cache_ops: int
    hit_rate: float
    prefill_tokens: int
    prefill_tokens_computed: int
    prefill_tokens_skipped: int
    evictions: int
    blocks_published: int
    peak_used_blocks: int
    peak_utilization: float
    early_frees: int
    invariant_checks: int
    wall_time_s: float
    #: Prompt tokens not reused, by cause (they add up to ``prefill_tokens_computed``).
    lost_window: int = 0
    lost_span: int = 0
    lost_cap: int = 0
    lost_evicted: int = 0
    lost_never_cached: int = 0
    prefill_chunks: int = 0
    drafts_proposed: int = 0
    drafts_accepted: int = 0
    #: Hybrid models: the hit rate the KV alone would give (prompt tokens skipped plus
    #: prompt tokens lost for want of a Ready checkpoint, over prompt tokens) next to the
    #: checkpoint-backed hit rate (``hit_rate``). NOTE: every term is a count of prompt
    #: tokens (``CacheStats.hits`` and ``queries`` count tokens too, not admissions); the
    #: sum is written with the counters whose names say so.
    hybrid: bool = False
    kv_hit_rate: float = 0.0
    lost_checkpoint: int = 0
    checkpoints_saved: int = 0
    checkpoints_discarded: int = 0
    checkpoints_restored: int = 0
    checkpoints_released_stale: int = 0
    checkpoints_evicted: int = 0
    peak_state_slot_utilization: float = 0.0


class _Driver:
    """Drives one cache through the decode protocol, with the simulator's instrumentation.

    Counts cache operations, runs the invariant checker every ``check_every`` of them, and
    tracks the peak number of blocks held by live sequences (it can only grow on an admit or
    an append that allocated, so that is where it is sampled).
    """

    def __init__(
        self, cache: PrefixCache, live: int, check_every: int, drive: Drive | None = None
    ) -> None:
        self.cache = cache
        self.live = live
        self.check_every = check_every
        self.drive = Drive() if drive is None else drive
        self.rng = random.Random(self.drive.seed)
        self.chunks = 0
        self.proposed = 0
        self.accepted = 0
        self.finished: deque[SeqId] = deque()
        self.ops = 0
        self.checks = 0
        self.early_frees = 0
        self.peak_used = 0
        self.peak_slots = 0.0
        self.hybrid = cache if isinstance(cache, HybridPrefixCache) else None

    def _tick(self) -> None:
        self.ops += 1
        if self.check_every and self.ops % self.check_every == 0:
            self.check()

    def check(self) -> None:
        cache = self.cache
        # replay() refuses a cache without snapshot() up front when checks are asked for
        assert isinstance(cache, Inspectable)
        check(cache)
        self.checks += 1

    def _sample_used(self) -> None:
        stats = self.cache.stats()
        if stats.num_used_blocks > self.peak_used:
            self.peak_used = stats.num_used_blocks
        if stats.state_slot_utilization > self.peak_slots:
            self.peak_slots = stats.state_slot_utilization

    def _free(self, seq_ids: list[SeqId]) -> None:
        if seq_ids:
            self.cache.free(seq_ids)
            self._tick()

    def _with_room(self, op: Callable[[], _T]) -> _T:
        """Run ``op``; if the pool is dry, free the oldest finished sequences and retry."""
        while True:
            try:
                return op()
            except OutOfBlocks:
                if not self.finished:
                    raise  # nothing left to give back: one request needs more than the pool
                self.early_frees += 1
                self._free([self.finished.popleft()])

    def run_turn(self, seq_id: SeqId, turn: ChatTurn) -> None:
        cache, d = self.cache, self.drive
        req = Request(
            seq_id,
            turn.prompt,
            NAMESPACE,
            spans=turn.spans,
            recompute_blocks=d.recompute_blocks,
            kv_token_limit=d.kv_token_limit,
        )
        adm = self._with_room(lambda: cache.admit(req))
        self._tick()
        self._sample_used()
        if self.hybrid is not None and adm.restore_slot is not None:
            # the engine copies the checkpoint into the runtime slot before the first forward
            self.hybrid.restore_issued(seq_id)
            self._tick()
        n = len(turn.prompt)
        done = adm.num_cached_tokens + adm.num_scheduled_tokens
        cache.commit(seq_id, adm.num_scheduled_tokens, turn.reply[:1] if done == n else ())
        self._tick()
        while done < n:  # the next prefill chunks
            chunk = self._with_room(lambda: cache.continue_prefill(seq_id))
            self._tick()
            self._sample_used()
            self.chunks += 1
            done += chunk
            cache.commit(seq_id, chunk, turn.reply[:1] if done == n else ())
            self._tick()
        if d.draft_tokens:
            self._decode_speculative(seq_id, turn.reply)
        else:
            for token in turn.reply[1:]:
                new = self._with_room(lambda: cache.append(seq_id, 1))
                self._tick()
                if new:
                    self._sample_used()
                cache.commit(seq_id, 1, (token,))
                self._tick()
        self.finished.append(seq_id)
        excess = len(self.finished) - self.live
        if excess > 0:
            self._free([self.finished.popleft() for _ in range(excess)])

    def _decode_speculative(self, seq_id: SeqId, reply: Sequence[int]) -> None:
        """Decode ``reply`` with drafts: reserve the pending token plus ``k`` drafts, commit
        the accepted drafts and the bonus token, roll the rejected drafts back."""
        cache, d = self.cache, self.drive
        i = 1  # reply tokens sampled so far; reply[i - 1] is pending (its KV unwritten)
        while i < len(reply):
            k = min(d.draft_tokens, len(reply) - i - 1)
            new = self._with_room(functools.partial(cache.append, seq_id, 1 + k))
            self._tick()
            if new:
                self._sample_used()
            a = 0
            while a < k and self.rng.random() < d.acceptance:
                a += 1
            self.proposed += k
            self.accepted += a
            cache.commit(seq_id, 1 + a, reply[i : i + a + 1])
            self._tick()
            i += a + 1
            if k > a:
                cache.rollback(seq_id, k - a)
                self._tick()

    def drain(self) -> None:
        self._free(list(self.finished))
        self.finished.clear()


def replay(
    cache: PrefixCache,
    workload: ChatWorkload,
    *,
    live: int = 32,
    check_every: int = 0,
    schedule: Sequence[ChatTurn] | None = None,
    on_request: Callable[[int], None] | None = None,
    drive: Drive | None = None,
) -> SimulationResult:
    """Replay ``workload`` (in its shuffled schedule) through ``cache`` and report.

    ``check_every`` > 0 runs :func:`prefixkv.spec.invariants.check` every that many cache
    operations and once at the end. ``on_request(i)`` is called after each request (progress).
    Every sequence is freed at the end, so the cache is left holding only cached blocks.
    """
    require_int(live, "live", minimum=0)
    require_int(check_every, "check_every", minimum=0)
    if check_every and not isinstance(cache, Inspectable):
        # refused before the first request, not at the first check: nothing changes
        raise InvalidConfig(f"{type(cache).__name__} has no snapshot(): cannot check invariants")
    turns = workload.schedule() if schedule is None else list(schedule)
    driver = _Driver(cache, live, check_every, drive)
    start = time.perf_counter()
    for i, turn in enumerate(turns):
        driver.run_turn(i, turn)
        if on_request is not None:
            on_request(i)
    driver.drain()
    wall = time.perf_counter() - start
    if check_every:
        driver.check()
    stats = cache.stats()
    return SimulationResult(
        requests=len(turns),
        prompt_tokens=sum(len(t.prompt) for t in turns),
        reply_tokens=sum(len(t.reply) for t in turns),
        blocks_touched=sum(t.blocks_touched(cache.block_size) for t in turns),
        cache_ops=driver.ops,
        hit_rate=stats.hit_rate,
        prefill_tokens=stats.prefill_tokens,
        prefill_tokens_computed=stats.prefill_tokens_computed,
        prefill_tokens_skipped=stats.prefill_tokens_skipped,
        evictions=stats.evictions,
        blocks_published=stats.blocks_published,
        peak_used_blocks=driver.peak_used,
        peak_utilization=driver.peak_used / cache.num_blocks,
        early_frees=driver.early_frees,
        invariant_checks=driver.checks,
        wall_time_s=wall,
        lost_window=stats.lost_window,
        lost_span=stats.lost_span,
        lost_cap=stats.lost_cap,
        lost_evicted=stats.lost_evicted,
        lost_never_cached=stats.lost_never_cached,
        prefill_chunks=driver.chunks,
        drafts_proposed=driver.proposed,
        drafts_accepted=driver.accepted,
        hybrid=driver.hybrid is not None,
        kv_hit_rate=(
            (stats.prefill_tokens_skipped + stats.lost_checkpoint) / stats.prefill_tokens
            if stats.prefill_tokens
            else 0.0
        ),
        lost_checkpoint=stats.lost_checkpoint,
        checkpoints_saved=stats.checkpoints_saved,
        checkpoints_discarded=stats.checkpoints_discarded,
        checkpoints_restored=stats.checkpoints_restored,
        checkpoints_released_stale=stats.checkpoints_released_stale,
        checkpoints_evicted=stats.checkpoints_evicted,
        peak_state_slot_utilization=driver.peak_slots,
    )


@attrs.frozen
class SimulationSetup:
    """Everything one simulation replays, resolved from a preset and the caller's overrides.

    Its fields are the report's header (``prefixkv simulate --json``): which preset, which
    cache, the pool, the workload, how it is driven and the hybrid model, if any.
    """

    workload_name: str
    cache: str
    hash: str
    num_blocks: int
    block_size: int
    live: int
    workload: ChatConfig
    drive: Drive
    hybrid_model: HybridModel | None

    @property
    def num_requests(self) -> int:
        return self.workload.conversations * self.workload.turns


def resolve(
    workload_name: str = "chat",
    *,
    spec: bool = False,
    hash_name: str = "fast",
    num_blocks: int | None = None,
    block_size: int | None = None,
    conversations: int | None = None,
    turns: int | None = None,
    live: int | None = None,
    seed: int = 0,
) -> SimulationSetup:
    """The preset of ``workload_name`` (``spec``: its toy size for the executable spec), with
    every argument that is not None in place of the preset's value.

    Raises :class:`~prefixkv.errors.InvalidConfig` for an unknown workload or hash, or a
    count that is not an int in range; nothing is built before the checks pass.
    """
    if workload_name not in WORKLOADS:
        raise InvalidConfig(
            f"unknown workload {workload_name!r}: expected one of {sorted(WORKLOADS)}"
        )
    if hash_name not in HASHERS:
        raise InvalidConfig(f"unknown hash {hash_name!r}: expected one of {sorted(HASHERS)}")
    impl_preset, spec_preset = WORKLOADS[workload_name]
    preset = spec_preset if spec else impl_preset

    def pick(value: int | None, default: int, what: str, minimum: int = 1) -> int:
        return default if value is None else require_int(value, what, minimum=minimum)

    base = preset.workload
    config = attrs.evolve(
        base,
        seed=require_int(seed, "seed"),
        conversations=pick(conversations, base.conversations, "conversations"),
        turns=pick(turns, base.turns, "turns"),
    )
    size = pick(block_size, preset.block_size, "block_size")
    kept = pick(live, preset.live, "live", minimum=0)
    hybrid = preset.hybrid
    if hybrid is not None and hybrid.decode_state_interval % size:
        # another block size: keep the interval a whole number of blocks
        interval = max(1, hybrid.decode_state_interval // size) * size
        hybrid = attrs.evolve(hybrid, decode_state_interval=interval)
    if hybrid is not None and hybrid.max_num_seqs <= kept:
        # every finished sequence kept live holds a runtime slot
        hybrid = attrs.evolve(hybrid, max_num_seqs=kept + 8)
    return SimulationSetup(
        workload_name=workload_name,
        cache="spec" if spec else "impl",
        hash=hash_name,
        num_blocks=pick(num_blocks, preset.num_blocks, "num_blocks"),
        block_size=size,
        live=kept,
        workload=config,
        drive=preset.drive,
        hybrid_model=hybrid,
    )


def simulate(
    setup: SimulationSetup,
    *,
    check_every: int = 0,
    on_request: Callable[[int], None] | None = None,
) -> SimulationResult:
    """Build the workload and a fresh cache as ``setup`` says, and :func:`replay` it."""
    cache = make_cache(
        setup.cache, setup.num_blocks, setup.block_size, setup.hash, setup.hybrid_model
    )
    return replay(
        cache,
        chat_workload(setup.workload),
        live=setup.live,
        check_every=check_every,
        on_request=on_request,
        drive=setup.drive,
    )
