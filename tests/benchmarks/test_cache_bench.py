"""The cache benchmark's drivers: their code paths, outputs, and the claims they rest on.

No test here asserts a speed: the figures come from ``prefixkv bench`` itself. These tests
check what the figures depend on: every call shape issues the same cache operations, the
crafted prompts really collide under the unkeyed hash (and not under a digest), the memory
probe counts cached blocks, and the quick run produces well-formed, positive, finite output.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from prefixkv.spec.identity import fast_hash, sha256_hash

from prefixkv.benchmarks.cache_report import BEGIN, END, render_markdown, write_markdown
from prefixkv.benchmarks.collisions import (
    craft_colliding_blocks,
    largest_bucket,
    lookup_setup,
    publish,
    tuple_hash_model,
)
from prefixkv.benchmarks.lifecycle import (
    VARIANTS,
    make_cache,
    replay,
    trace_from_config,
    variants_of,
)
from prefixkv.benchmarks.memory import measure
from prefixkv.benchmarks.worker import case_name, prepare
from prefixkv.workloads import ChatConfig

TINY = ChatConfig(
    conversations=5, turns=3, system_tokens=48, user_tokens=(5, 30), reply_tokens=(1, 20)
)


def _positive_finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


# -- the life cycle ------------------------------------------------------------------------


def _fingerprint(cache: Any) -> tuple[object, ...]:
    """Statistics and the whole observable state: blocks, identities, sequences, slots."""
    return (cache.stats(), cache.snapshot())


@pytest.mark.parametrize(
    ("num_blocks", "running"), [(20, 1), (32, 1), (4096, 1), (32, 3), (32, 4), (4096, 4)]
)
@pytest.mark.parametrize("variant", VARIANTS[1:])
def test_call_shapes_issue_the_same_operations(variant: str, num_blocks: int, running: int) -> None:
    # The small pools force early frees and evictions; 4,096 blocks never evicts.
    trace = trace_from_config(TINY)
    reference = make_cache("impl", num_blocks, 16)
    if variant not in variants_of(reference):
        pytest.skip(f"this build of the manager has no {variant!r} calls")
    base = replay(reference, trace, "percall", live=3, running=running)
    other = make_cache("impl", num_blocks, 16)
    result = replay(other, trace, variant, live=3, running=running)
    assert result == base
    assert _fingerprint(other) == _fingerprint(reference)


@pytest.mark.parametrize("running", [1, 4])
def test_every_request_runs_to_completion(running: int) -> None:
    trace = trace_from_config(TINY)
    cache = make_cache("impl", 4096, 16)
    replay(cache, trace, "percall", live=3, running=running)
    # The last ``live`` finished requests stay live, each with its whole prompt and reply
    # but the last sampled token (which no forward has computed yet).
    by_id = {r.seq_id: r for r in trace.requests}
    live = cache.seq_ids()
    assert len(live) == 3
    for sid in live:
        req = by_id[sid]
        assert cache.num_computed_tokens(sid) == len(req.prompt) + len(req.rest)


def test_spec_and_impl_agree_on_the_trace() -> None:
    trace = trace_from_config(TINY)
    results = []
    for manager in ("spec", "impl"):
        cache = make_cache(manager, 20, 16)
        results.append((replay(cache, trace, "percall", live=3), _fingerprint(cache)))
    assert results[0] == results[1]


def test_a_small_pool_frees_early_instead_of_failing() -> None:
    trace = trace_from_config(TINY)
    cache = make_cache("impl", 20, 16)
    result = replay(cache, trace, "percall", live=3)
    assert result.early_frees > 0 and result.evictions > 0
    # Every finished request but the last ``live`` was freed, none leaked.
    assert len(cache.seq_ids()) <= 3


def test_replay_refuses_a_call_shape_the_cache_lacks() -> None:
    class PerCallOnly:
        def stats(self) -> None: ...

    with pytest.raises(ValueError, match="no 'fused' calls"):
        replay(PerCallOnly(), trace_from_config(TINY), "fused", live=3)


# -- crafted collisions --------------------------------------------------------------------


def test_tuple_hash_model_is_cpythons() -> None:
    rng = random.Random(5)
    for length in (0, 1, 3, 16):
        for _ in range(50):
            items = tuple(rng.randrange(2**32) for _ in range(length))
            assert tuple_hash_model(items) == hash(items)


def test_crafted_blocks_are_distinct_and_share_one_tuple_hash() -> None:
    blocks = craft_colliding_blocks(40)
    assert len(set(blocks)) == 40
    assert all(len(b) == 16 and all(0 <= t < 2**32 for t in b) for b in blocks)
    assert len({hash(b) for b in blocks}) == 1


def test_crafted_prompts_fill_one_bucket_of_the_unkeyed_hash_only() -> None:
    crafted = lookup_setup(True, 100, num_probes=16)
    control = lookup_setup(False, 100, num_probes=16)
    assert largest_bucket(fast_hash, crafted.prompts) == 100
    assert largest_bucket(sha256_hash, crafted.prompts) == 1
    assert largest_bucket(fast_hash, control.prompts) == 1


def test_a_key_mixed_in_after_the_token_hash_does_not_help() -> None:
    # The crafted blocks collide in hash(tokens) itself, so a secret mixed in around that
    # value changes every key but keeps them equal: the key must enter the token hashing.
    secret = random.Random(9).getrandbits(63)

    def keyed_outside(parent: int | None, ns: bytes, tokens: tuple[int, ...], extra: Any) -> int:
        return hash((secret, parent, ns, tokens, extra))

    crafted = lookup_setup(True, 100, num_probes=16)
    assert largest_bucket(keyed_outside, crafted.prompts) == 100


def test_probes_miss_in_the_second_block() -> None:
    setup = lookup_setup(True, 100, num_probes=16)
    cache = make_cache("impl", 1024, 16, hasher=fast_hash)
    publish(cache, setup.prompts)
    assert cache.stats().blocks_published == 100 + 16  # 16 shared first blocks
    for probe in setup.probes:
        # The first block is cached, the second is not: the lookup searches the bucket.
        assert cache.match(probe).num_cached_tokens == 16


# -- memory --------------------------------------------------------------------------------


@pytest.mark.parametrize("probe", ["rss", "tracemalloc"])
def test_memory_probe_counts_cached_blocks(probe: str) -> None:
    out = measure(1024, probe)
    assert out["cached_blocks"] == 960  # 15 prompts of 64 blocks fit below 1,024 - 64
    assert out["probe"] == probe
    if probe == "tracemalloc":  # RSS may even shrink in a process that freed memory before
        assert _positive_finite(out["bytes_per_cached_block"])


# -- the pyperf worker ---------------------------------------------------------------------


def test_worker_cases_time_positive_durations() -> None:
    cases: list[dict[str, Any]] = [
        {
            "kind": "lifecycle",
            "tag": "t",
            "manager": "impl",
            "variant": "percall",
            "num_blocks": 64,
            "trace": {"conversations": 2, "turns": 2, "system_tokens": 32},
            "live": 2,
            "running": 2,
        },
        {"kind": "lookup", "crafted": True, "prompts": 32, "num_blocks": 256, "hasher": None},
    ]
    for case in cases:
        func, units = prepare(case)
        assert units > 0 and _positive_finite(func(1))
    assert len({case_name(c) for c in cases}) == 2


def test_bench_markdown_keeps_hand_written_text(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.md"
    path.write_text(f"# Mine\n\nnotes\n\n{BEGIN}\nold\n{END}\n\nafter\n")
    write_markdown(path, f"{BEGIN}\nnew figures\n{END}\n")
    text = path.read_text()
    assert text == f"# Mine\n\nnotes\n\n{BEGIN}\nnew figures\n{END}\n\nafter\n"


def test_the_published_section_is_what_the_saved_result_renders() -> None:
    """docs/benchmarks.md's generated section and docs/bench/cache.json come from one run:
    rendering the saved JSON again gives the section byte for byte."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    saved = json.loads((docs / "bench" / "cache.json").read_text(encoding="utf-8"))
    page = (docs / "benchmarks.md").read_text(encoding="utf-8")
    section = BEGIN + page.partition(BEGIN)[2].partition(END)[0] + END + "\n"
    assert render_markdown(saved) == section
