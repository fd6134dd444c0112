"""The lockstep driver (tests/spec/lockstep.py) at a small size, so that it cannot rot.

Its real use is on large pools, as a documented command (docs/testing.md); here it runs a
short workload with every check after every step, under a hash that collides all the time,
and must reach eviction, preemption and hits.
"""

from __future__ import annotations

import pytest
from lockstep import NAMESPACES, Diverged, Lockstep, parse, run
from prefixkv.spec import Request


@pytest.mark.parametrize("hasher", ["fast", "weak"])
def test_small_lockstep_run_agrees(hasher: str) -> None:
    report = run(
        parse(["--blocks", "48", "--block-size", "2", "--steps", "400", "--seqs", "6",
               "--check-every", "1", "--hasher", hasher])
    )  # fmt: skip
    assert report["evictions"] > 100 and report["hits"] > 0


def test_a_divergence_is_reported() -> None:
    pair = Lockstep(8, 2, "fast")
    pair.spec.admit(Request("only-spec", (1, 2, 3), NAMESPACES[0]))
    with pytest.raises(Diverged):
        pair.op("seq_ids")
