"""The simulation driver: spec and impl save exactly the same, every preset resolves, and
bad settings are refused before anything is built."""

from __future__ import annotations

import attrs
import pytest

from prefixkv.errors import InvalidConfig
from prefixkv.simulation import WORKLOADS, make_cache, replay, resolve, simulate
from prefixkv.workloads import ChatConfig, chat_workload


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_spec_and_impl_agree_on_every_workload(name: str) -> None:
    """Spans, chunks, windows and drafts: the impl saves exactly what the spec saves."""
    _, preset = WORKLOADS[name]
    w = chat_workload(attrs.evolve(preset.workload, conversations=6, seed=3))
    results = [
        replay(make_cache(kind, 48, 4), w, live=2, drive=preset.drive, check_every=30)
        for kind in ("spec", "impl")
    ]
    spec, impl = (attrs.asdict(r, filter=lambda a, _: a.name != "wall_time_s") for r in results)
    assert spec == impl
    assert results[0].evictions > 0


def test_spec_and_impl_report_the_same_reuse() -> None:
    """Same workload, same pool: the impl must save exactly what the spec saves."""
    w = chat_workload(
        ChatConfig(
            conversations=5,
            turns=3,
            system_prompts=2,
            system_tokens=32,
            user_tokens=(4, 12),
            reply_tokens=(3, 9),
            seed=4,
        )
    )
    results = [replay(make_cache(kind, 40, 4), w, live=2) for kind in ("spec", "impl")]
    keys = (
        "hit_rate",
        "prefill_tokens_computed",
        "evictions",
        "blocks_published",
        "peak_used_blocks",
        "early_frees",
    )
    spec, impl = ({k: getattr(r, k) for k in keys} for r in results)
    assert spec == impl
    assert results[0].evictions > 0  # the pool is small enough to exercise eviction


@pytest.mark.parametrize("name", sorted(WORKLOADS))
@pytest.mark.parametrize("spec", [False, True])
def test_every_preset_resolves_to_its_own_values(name: str, spec: bool) -> None:
    impl_preset, spec_preset = WORKLOADS[name]
    preset = spec_preset if spec else impl_preset
    setup = resolve(name, spec=spec)
    assert setup.cache == ("spec" if spec else "impl") and setup.workload_name == name
    assert (setup.num_blocks, setup.block_size, setup.live) == (
        preset.num_blocks,
        preset.block_size,
        preset.live,
    )
    assert setup.workload == preset.workload and setup.drive == preset.drive
    assert setup.hybrid_model == preset.hybrid
    assert setup.num_requests == preset.workload.conversations * preset.workload.turns


def test_overrides_keep_a_hybrid_model_consistent() -> None:
    # a block size that does not divide the decode interval, and more live sequences than
    # runtime slots: both are adjusted rather than refused
    setup = resolve("hybrid", block_size=24, live=100)
    assert setup.hybrid_model is not None
    assert setup.hybrid_model.decode_state_interval % 24 == 0
    assert setup.hybrid_model.max_num_seqs > 100


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workload_name": "poetry"}, "unknown workload"),
        ({"hash_name": "md5"}, "unknown hash"),
        ({"num_blocks": 0}, "num_blocks must be an int >= 1"),
        ({"block_size": True}, "block_size must be an int >= 1"),
        ({"conversations": 2.0}, "conversations must be an int >= 1"),
        ({"live": -1}, "live must be an int >= 0"),
        ({"seed": -3}, "seed must be an int >= 0"),
    ],
)
def test_bad_settings_raise_invalid_config(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidConfig, match=message) as info:
        resolve(**kwargs)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)


def test_replay_refuses_bad_counts_before_touching_the_cache() -> None:
    cache = make_cache("impl", 64, 4)
    workload = chat_workload(ChatConfig(conversations=1, turns=1, system_tokens=8))
    for kwargs in ({"live": -1}, {"live": True}, {"check_every": -2}):
        with pytest.raises(InvalidConfig):
            replay(cache, workload, **kwargs)  # type: ignore[arg-type]
    assert cache.stats().admissions == 0
    with pytest.raises(InvalidConfig, match="unknown cache kind"):
        make_cache("fast", 64, 4)


def test_simulate_replays_what_the_setup_says() -> None:
    setup = resolve("chat", spec=True, conversations=3, turns=2)
    calls: list[int] = []
    result = simulate(setup, check_every=50, on_request=calls.append)
    assert calls == list(range(setup.num_requests)) and result.requests == 6
    assert result.invariant_checks > 0
    again = replay(
        make_cache("spec", setup.num_blocks, setup.block_size),
        chat_workload(setup.workload),
        live=setup.live,
    )
    assert (again.hit_rate, again.evictions) == (result.hit_rate, result.evictions)


def test_checks_on_a_cache_without_a_snapshot_are_refused_up_front() -> None:
    class Opaque:
        """Delegates the cache protocol, but offers no snapshot() to check."""

        def __init__(self) -> None:
            self.inner = make_cache("impl", 128, 16)

        def __getattr__(self, name: str) -> object:
            if name == "snapshot":
                raise AttributeError(name)
            return getattr(self.inner, name)

    cache = Opaque()
    workload = chat_workload(ChatConfig(conversations=1, turns=1, system_tokens=8))
    with pytest.raises(InvalidConfig, match="cannot check invariants"):
        replay(cache, workload, check_every=5)  # type: ignore[arg-type]
    assert cache.inner.stats().admissions == 0
    assert replay(cache, workload).requests == 1  # type: ignore[arg-type]
