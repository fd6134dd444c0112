"""``prefixkv simulate``: replay a multi-turn chat workload through a cache, report reuse.

This is the "see it work" demo. It drives the cache exactly as a serving engine would (the
decode protocol of ``docs/design.md``), on the synthetic chat workload of
:mod:`prefixkv.workloads`, and reports what the cache saved: the hit rate, the prefill tokens
computed and skipped, evictions, blocks published and the peak pool utilization.

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

import argparse
import functools
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs

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
    "make_cache",
    "replay",
    "setup",
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
    raise ValueError(f"unknown cache kind {kind!r}: expected 'impl' or 'spec'")


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
        if not isinstance(cache, Inspectable):
            raise TypeError(f"{type(cache).__name__} has no snapshot(): cannot check invariants")
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
    if live < 0:
        raise ValueError("live must be >= 0")
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


# -- command line ------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def setup(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """Add the ``simulate`` flags; returns its runner (see :mod:`prefixkv.cli`)."""
    d, s = IMPL_PRESET, SPEC_PRESET
    parser.add_argument(
        "--spec",
        action="store_true",
        help="drive the executable spec (slow: O(pool) per operation) on a toy workload "
        f"({s.workload.conversations} conversations, {s.num_blocks} blocks of "
        f"{s.block_size}) instead of the optimized cache manager",
    )
    parser.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="chat",
        help="chat (default): the benchmark's multi-turn chat; multimodal: images in half "
        "the user turns, shared across conversations, prefilled in chunks of 512 tokens; "
        "speculative: 3 draft tokens a step and a one-block recompute window; hybrid: a "
        "hybrid (attention + recurrent) model that hits only at saved state checkpoints",
    )
    parser.add_argument(
        "--hash",
        choices=sorted(HASHERS),
        default="fast",
        help="block hash (default: fast); 'weak' collides on purpose and must not change "
        "any result, only the time",
    )
    parser.add_argument(
        "--num-blocks",
        type=_positive,
        metavar="N",
        help=f"pool size (default: {d.num_blocks}; spec {s.num_blocks})",
    )
    parser.add_argument(
        "--block-size",
        type=_positive,
        metavar="N",
        help=f"tokens per block (default: {d.block_size}; spec {s.block_size})",
    )
    parser.add_argument(
        "--conversations",
        type=_positive,
        metavar="N",
        help=f"conversations (default: {d.workload.conversations}; spec "
        f"{s.workload.conversations})",
    )
    parser.add_argument(
        "--turns",
        type=_positive,
        metavar="N",
        help=f"turns per conversation (default: {d.workload.turns}; spec {s.workload.turns})",
    )
    parser.add_argument(
        "--live",
        type=_non_negative,
        metavar="N",
        help="finished sequences kept live before they are freed "
        f"(default: {d.live}; spec {s.live})",
    )
    parser.add_argument(
        "--seed", type=_non_negative, default=0, metavar="N", help="workload seed (default: 0)"
    )
    parser.add_argument(
        "--check-invariants",
        type=_positive,
        metavar="N",
        default=0,
        help="run prefixkv.spec.invariants.check on the cache every N cache operations "
        "and at the end (O(pool) each)",
    )
    return _run


def _run(args: argparse.Namespace) -> int:
    kind = "spec" if args.spec else "impl"
    impl_preset, spec_preset = WORKLOADS[args.workload]
    preset = spec_preset if args.spec else impl_preset
    base = preset.workload
    config = attrs.evolve(
        base,
        seed=args.seed,
        conversations=base.conversations if args.conversations is None else args.conversations,
        turns=base.turns if args.turns is None else args.turns,
    )
    num_blocks = preset.num_blocks if args.num_blocks is None else args.num_blocks
    block_size = preset.block_size if args.block_size is None else args.block_size
    live = preset.live if args.live is None else args.live

    workload = chat_workload(config)
    hybrid = preset.hybrid
    if hybrid is not None and hybrid.decode_state_interval % block_size:
        # --block-size changed: keep the interval a whole number of blocks
        interval = max(1, hybrid.decode_state_interval // block_size) * block_size
        hybrid = attrs.evolve(hybrid, decode_state_interval=interval)
    if hybrid is not None and hybrid.max_num_seqs <= live:
        hybrid = attrs.evolve(hybrid, max_num_seqs=live + 8)
    cache = make_cache(kind, num_blocks, block_size, args.hash, hybrid)
    result = _replay_with_progress(
        cache, workload, live, args.check_invariants, args.json, preset.drive
    )
    report = {
        "command": "simulate",
        "ok": True,
        "workload_name": args.workload,
        "cache": kind,
        "hash": args.hash,
        "num_blocks": num_blocks,
        "block_size": block_size,
        "live": live,
        "workload": attrs.asdict(config),
        "drive": attrs.asdict(preset.drive),
        "hybrid_model": None if hybrid is None else attrs.asdict(hybrid),
        **attrs.asdict(result),
    }
    if args.json:
        from prefixkv.cli import emit_json

        emit_json(report)
    else:
        _print_report(report)
    return 0


def _replay_with_progress(
    cache: PrefixCache,
    workload: ChatWorkload,
    live: int,
    check_every: int,
    quiet: bool,
    drive: Drive | None = None,
) -> SimulationResult:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    schedule = workload.schedule()
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=quiet,
        transient=True,
    )
    with progress:
        task = progress.add_task("replaying requests", total=len(schedule))
        return replay(
            cache,
            workload,
            live=live,
            check_every=check_every,
            schedule=schedule,
            on_request=lambda _: progress.advance(task),
            drive=drive,
        )


def _print_report(r: dict[str, object]) -> None:
    from rich.console import Console
    from rich.table import Table

    w = r["workload"]
    assert isinstance(w, dict)
    computed, skipped = r["prefill_tokens_computed"], r["prefill_tokens_skipped"]
    assert isinstance(computed, int) and isinstance(skipped, int)
    total = max(computed + skipped, 1)
    title = (
        f"prefixkv simulate: {r['cache']} cache, {r['num_blocks']:,} blocks x "
        f"{r['block_size']} tokens, hash={r['hash']}"
    )
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    rows: list[tuple[str, str]] = [
        (
            "workload",
            f"{r['workload_name']}: {w['conversations']} conversations x {w['turns']} turns, "
            f"{w['system_prompts']} shared system prompts of {w['system_tokens']} tokens"
            + (f", images of {w['image_tokens']} tokens" if w["image_tokens"] else ""),
        ),
        ("requests", f"{r['requests']:,}"),
        ("prompt / reply tokens", f"{r['prompt_tokens']:,} / {r['reply_tokens']:,}"),
        ("hit rate (prompt tokens)", f"{r['hit_rate']:.1%}"),
        *(
            [
                ("  checkpoint hit rate", f"{r['hit_rate']:.1%}  (hits restore a saved state)"),
                ("  KV hit rate", f"{r['kv_hit_rate']:.1%}  (what the KV alone would hit)"),
                (
                    "checkpoints",
                    f"saved {r['checkpoints_saved']:,} / restored {r['checkpoints_restored']:,}"
                    f" / released stale {r['checkpoints_released_stale']:,} / evicted "
                    f"{r['checkpoints_evicted']:,} / discarded {r['checkpoints_discarded']:,}",
                ),
                ("peak state-slot utilization", f"{r['peak_state_slot_utilization']:.1%}"),
            ]
            if r["hybrid"]
            else []
        ),
        ("lost reuse (tokens)", _lost_split(r)),
        ("prefill tokens computed", f"{computed:,}  ({computed / total:.1%})"),
        ("prefill tokens skipped", f"{skipped:,}  ({skipped / total:.1%})"),
        ("blocks published", f"{r['blocks_published']:,}"),
        ("evictions", f"{r['evictions']:,}"),
        ("peak utilization", f"{r['peak_utilization']:.1%}  ({r['peak_used_blocks']:,} blocks)"),
        ("early frees (pool dry)", f"{r['early_frees']:,}"),
        ("cache operations", f"{r['cache_ops']:,}"),
    ]
    if r["prefill_chunks"]:
        rows.append(("prefill chunks after the first", f"{r['prefill_chunks']:,}"))
    proposed, accepted = r["drafts_proposed"], r["drafts_accepted"]
    assert isinstance(proposed, int) and isinstance(accepted, int)
    if proposed:
        rows.append(
            ("draft tokens accepted", f"{accepted:,} of {proposed:,}  ({accepted / proposed:.1%})")
        )
    if r["invariant_checks"]:
        rows.append(("invariant checks passed", f"{r['invariant_checks']:,}"))
    rows.append(("wall time", f"{r['wall_time_s']:.2f} s"))
    for key, value in rows:
        table.add_row(key, value)
    Console().print(table)


def _lost_split(r: dict[str, object]) -> str:
    """The lost-reuse split: ``window 1,234 / span 0 / ...`` (causes with no tokens omitted)."""
    causes = ("window", "span", "cap", "evicted", "never_cached", "checkpoint")
    parts = [f"{c.replace('_', ' ')} {r['lost_' + c]:,}" for c in causes if r["lost_" + c]]
    return " / ".join(parts) or "none"
