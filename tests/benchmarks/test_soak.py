"""The hybrid soak's driver: a short run samples RSS and keeps the cache consistent."""

from __future__ import annotations

from typing import Any

import pytest
from prefixkv.spec import invariants as inv

from prefixkv.benchmarks import soak as soak_mod
from prefixkv.benchmarks.soak import SoakSample, _Driver, drift_after, main, rss_bytes, soak
from prefixkv.errors import PrefixKVError


def test_a_short_soak_samples_every_interval() -> None:
    seen: list[SoakSample] = []
    samples = soak(3_000, every=1_000, seed=1, num_blocks=128, block_size=4, on_sample=seen.append)
    assert samples == seen
    assert samples[0].ops == 0 and samples[-1].ops >= 3_000
    assert [s.ops // 1_000 for s in samples[1:4]] == [1, 2, 3]
    assert all(s.rss > 0 for s in samples)
    low, high = drift_after(samples, 1_000)
    assert 0 < low <= high


def test_the_workload_exercises_hits_evictions_checkpoints_and_resets() -> None:
    # The soak is only worth its figures if it reaches every path that keeps data.
    driver = _Driver(3, num_blocks=256, block_size=4, events=True)
    while driver.ops < 20_000:
        driver.step()
        if driver.ops % 997 < 3:
            inv.check(driver.cache)
    st = driver.cache.stats()
    assert st.hits and st.evictions and st.checkpoints_restored and st.checkpoints_evicted
    assert st.checkpoints_released_stale
    assert driver.cache.take_events() == []  # drained every step


def test_reset_happens(monkeypatch: pytest.MonkeyPatch) -> None:
    driver = _Driver(0, num_blocks=64, block_size=4, events=False)
    resets: list[dict[str, Any]] = []
    real = driver.cache.reset

    def counted(**kw: Any) -> None:
        resets.append(kw)
        real(**kw)

    monkeypatch.setattr(driver.cache, "reset", counted)
    while driver.ops < 20_000:
        driver.step()
    assert resets and driver.cache.stats().num_sequences == len(driver.live)


def test_rss_is_read() -> None:
    assert rss_bytes() > 1_000_000


def test_bad_counts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(PrefixKVError):
        soak(0, every=1)
    with pytest.raises(SystemExit) as exc:
        main(["--ops", "0"])
    assert exc.value.code == 2


def test_the_command_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--ops", "2000", "--every", "500", "--num-blocks", "64", "--block-size", "4"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["ops", "rss"]
    assert len(out) >= 6 and out[-1].startswith("RSS after 200 ops:")
    assert soak_mod.VOCAB > 0
