"""The cost of one event batch applied to an EventMirror that holds N blocks.

Builds a mirror of N blocks (chains of 100), then applies K batches, each storing a chain
of 4 blocks and removing it again, so the mirror keeps N blocks throughout. Run it under
callgrind for two values of K and divide the difference in instructions by the difference
in K, at N = 1,000 and 100,000 (``docs/events.md``):

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python scripts/mirror_batch_cost.py 100000 200
"""

from __future__ import annotations

import sys

from prefixkv.spec import BlockRemoved, BlockStored, EventMirror, KVEvent

BLOCK = 16


def chain(first: int, n: int, token: int) -> BlockStored:
    """``n`` blocks with hashes ``first .. first + n - 1``, each the child of the one before."""
    return BlockStored(
        tuple(range(first, first + n)),
        None,
        (token,) * (n * BLOCK),
        BLOCK,
        "m@1",
        None,
        None,
        ((),) * n,
    )


def main(blocks: int, batches: int) -> None:
    mirror = EventMirror()
    # One event at a time, not apply_all: the setup then costs the same with a mirror that
    # copies itself per batch, whose cost can be measured with this script too.
    for start in range(0, blocks, 100):
        mirror.apply(chain(start + 1, min(100, blocks - start), start % 7))
    assert len(mirror) == blocks
    top = blocks + 1
    batch: list[KVEvent] = [chain(top, 4, 9), BlockRemoved(tuple(range(top + 3, top - 1, -1)))]
    for _ in range(batches):
        mirror.apply_all(batch)
    assert len(mirror) == blocks


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
