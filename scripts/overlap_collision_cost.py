"""What a router's ``overlap`` costs on blocks crafted to collide under ``fast_hash``.

Publishes N two-block prompts into a manager that records events, feeds the events to a
router's mirror (``MirrorIndex``), then asks it K times for the overlap of each of 64
probes (the first block cached, the second not). The prompts are either crafted (every
second block has one ``fast_hash`` under its root, see
``prefixkv.benchmarks.collisions``) or random, of the same shape. Run it under callgrind
for K = 0 and K > 0 and divide the difference by K * 64 (``docs/events.md``):

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python scripts/overlap_collision_cost.py crafted 4000 20
"""

from __future__ import annotations

import sys

from prefixkv.impl import PrefixCacheManager

from prefixkv.benchmarks.collisions import lookup_setup, publish
from prefixkv.benchmarks.lifecycle import NAMESPACE
from prefixkv.events.router import MirrorIndex


def main(kind: str, num_prompts: int, repeats: int) -> None:
    setup = lookup_setup(kind == "crafted", num_prompts)
    cache = PrefixCacheManager(2 * num_prompts + 64, 16, record_events=True)
    publish(cache, setup.prompts)
    index = MirrorIndex()
    index.apply(cache.take_events())
    assert len(index.mirror) == cache.stats().num_published_blocks
    probes = [p.token_ids for p in setup.probes]
    for _ in range(repeats):
        for tokens in probes:
            index.overlap(NAMESPACE, tokens)
    assert all(index.overlap(NAMESPACE, t) == 1 for t in probes)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
