"""Lookups against prompts crafted to share one bucket of the index.

A hash is only an index: every hit is verified against the stored identity, so colliding
blocks cost time, never correctness. How much time is what this module measures. If the
index hash is public and unkeyed, a client who knows the code can build prompts whose
blocks all land in one bucket, and every lookup into that bucket then compares against
each of them.

**How the prompts are crafted.** The default hash, :func:`~prefixkv.spec.identity.fast_hash`,
is CPython's tuple hash (xxHash-style): for each item, ``acc = rotl(acc + hash(item) * P2,
31) * P1`` on 64 bits, and a small int hashes to itself. Each step is invertible, so two
tokens can undo a difference the previous token made. Starting from one state, draw many
first tokens ``t``; ``F(t) = rotl(s + t * P2, 31) * P1 * P2^-1`` must then differ by less
than ``2^32`` between two of them, which a birthday search over 2^17 draws finds in
milliseconds; the second token absorbs the difference. Eight such stages fill a 16-token
block, and each stage's two choices combine freely (Joux's multicollision): 2^8 distinct
blocks with one tuple hash. A block's chain hash depends on its tokens only through that
tuple hash, so two-block prompts built from those blocks share one chain hash at depth 2:
``roots x seconds`` distinct blocks in one bucket.

NOTE: the crafted token ids span ``[0, 2^32)``, which the cache accepts (it cannot know a
model's vocabulary). Within a 32k vocabulary the same search needs more tokens per stage;
it is harder, not impossible, which is why the index must be keyed per process rather
than hope that ids stay small.

The control is the same shape without collisions: the same number of prompts, the same
number of distinct first blocks, random tokens.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from typing import Any

import attrs

from prefixkv.errors import InvalidConfig, require_int
from prefixkv.spec import Request

from .lifecycle import NAMESPACE

__all__ = [
    "LookupSetup",
    "craft_colliding_blocks",
    "largest_bucket",
    "largest_index_bucket",
    "lookup_setup",
    "publish",
    "tuple_hash_model",
]

_MASK = (1 << 64) - 1
_P1 = 11400714785074694791
_P2 = 14029467366897019727
_P5 = 2870177450012600261
_P2_INV = pow(_P2, -1, 1 << 64)
_ROOT_BLOCKS = 16


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _MASK


def _absorb(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _MASK, 31) * _P1) & _MASK


def tuple_hash_model(items: tuple[int, ...]) -> int:
    """CPython's ``hash(tuple_of_small_ints)``, written out (a test checks it is exact)."""
    acc = _P5
    for lane in items:
        acc = _absorb(acc, lane)
    acc = (acc + (len(items) ^ (_P5 ^ 3527539))) & _MASK
    if acc == _MASK:
        return 1546275796
    return acc - (1 << 64) if acc >= 1 << 63 else acc


def _stage(state: int, rng: Any, draws: int) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """Two distinct token pairs that take ``state`` to the same state, or None (retry)."""
    import numpy as np

    u64 = np.uint64
    t = rng.integers(0, 1 << 32, size=draws, dtype=u64)
    with np.errstate(over="ignore"):
        x = u64(state) + t * u64(_P2)
        x = (x << u64(31)) | (x >> u64(33))
        f = x * u64((_P1 * _P2_INV) & _MASK)
    order = np.argsort(f)
    gaps = np.diff(f[order])
    for i in np.nonzero(gaps < u64(1 << 32))[0]:
        a, b = int(t[order[i]]), int(t[order[i + 1]])
        if a != b:
            # F(b) - F(a) = gap, so (a, gap) and (b, 0) reach the same state.
            return (a, int(gaps[i])), (b, 0)
    return None


def craft_colliding_blocks(
    count: int, block_size: int = 16, seed: int = 0
) -> list[tuple[int, ...]]:
    """``count`` distinct blocks of ``block_size`` token ids with one CPython tuple hash."""
    require_int(count, "count")
    require_int(block_size, "block_size", minimum=2)
    if block_size % 2 or count > 2 ** (block_size // 2):
        raise InvalidConfig(f"at most 2**{block_size // 2} blocks of an even size {block_size}")
    import numpy as np

    rng = np.random.default_rng(seed)
    state = _P5
    stages: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for _ in range(block_size // 2):
        found = None
        while found is None:
            found = _stage(state, rng, 1 << 17)
        stages.append(found)
        a, b = found[0]
        state = _absorb(_absorb(state, a), b)
    blocks = [
        tuple(tok for stage, pick in zip(stages, picks, strict=True) for tok in stage[pick])
        for picks in itertools.islice(itertools.product((0, 1), repeat=len(stages)), count)
    ]
    return blocks


@attrs.frozen
class LookupSetup:
    """Prompts to publish, and the probes to look up afterwards."""

    prompts: tuple[tuple[int, ...], ...]
    #: Requests whose first block is cached and whose second is not: each lookup walks
    #: into the depth-2 bucket and finds nothing there.
    probes: tuple[Request, ...]


def lookup_setup(
    crafted: bool, num_prompts: int, *, num_probes: int = 64, block_size: int = 16, seed: int = 0
) -> LookupSetup:
    """Two-block prompts (plus one token, so both blocks are matchable).

    ``crafted``: built from colliding blocks, so all second blocks share one chain hash
    under the unkeyed tuple hash. Otherwise random tokens of the same shape.
    """
    per_root = -(-num_prompts // _ROOT_BLOCKS)
    # Probe k pairs root k % 16 with a second block no prompt uses.
    needed = per_root + -(-num_probes // _ROOT_BLOCKS)
    if crafted:
        pool = craft_colliding_blocks(max(_ROOT_BLOCKS, needed), block_size, seed)
        roots, seconds = pool[:_ROOT_BLOCKS], pool
        tail = 7
    else:
        rng = random.Random(seed)

        def block() -> tuple[int, ...]:
            return tuple(rng.randrange(1 << 32) for _ in range(block_size))

        roots = [block() for _ in range(_ROOT_BLOCKS)]
        seconds = [block() for _ in range(needed)]
        tail = 7
    prompts = tuple(
        roots[i % _ROOT_BLOCKS] + seconds[i // _ROOT_BLOCKS] + (tail,) for i in range(num_prompts)
    )
    probes = tuple(
        Request(
            f"probe-{k}",
            roots[k % _ROOT_BLOCKS] + seconds[per_root + k // _ROOT_BLOCKS] + (tail,),
            NAMESPACE,
        )
        for k in range(num_probes)
    )
    return LookupSetup(prompts, probes)


def publish(cache: Any, prompts: tuple[tuple[int, ...], ...]) -> None:
    """Admit, prefill and free each prompt, leaving its full blocks cached."""
    for i, prompt in enumerate(prompts):
        sid = f"fill-{i}"
        adm = cache.admit(Request(sid, prompt, NAMESPACE))
        cache.commit(sid, adm.num_scheduled_tokens, (0,))
        cache.free((sid,))


def largest_bucket(
    hasher: Callable[[int | None, bytes, tuple[int, ...], tuple[Any, ...]], int],
    prompts: tuple[tuple[int, ...], ...],
    block_size: int = 16,
) -> int:
    """The most distinct depth-2 blocks of ``prompts`` that ``hasher`` puts under one key.

    This is the check that the crafted prompts collide under the hasher measured (1 under a
    keyed hash), computed through the hasher's public signature.
    """
    ns = NAMESPACE.key()
    counts: dict[int, set[tuple[int, ...]]] = {}
    roots: dict[tuple[int, ...], int] = {}
    for prompt in prompts:
        first, second = prompt[:block_size], prompt[block_size : 2 * block_size]
        h1 = roots.get(first)
        if h1 is None:
            h1 = roots[first] = hasher(None, ns, first, ())
        counts.setdefault(hasher(h1, ns, second, ()), set()).add(prompt[: 2 * block_size])
    return max(len(v) for v in counts.values())


def largest_index_bucket(
    prompts: tuple[tuple[int, ...], ...],
    num_blocks: int,
    hasher: Callable[[int | None, bytes, tuple[int, ...], tuple[Any, ...]], int],
) -> int:
    """The most blocks that ``prefixkv.impl``'s own index files under one key, after
    publishing ``prompts`` into a manager built with ``hasher``.

    With the default hasher the index is keyed per process (the identity hash is not its
    key), so crafted prompts spread out: 1.
    """
    from prefixkv.impl import PrefixCacheManager

    cache = PrefixCacheManager(num_blocks, 16, hasher=hasher)
    publish(cache, prompts)
    return cache.largest_index_bucket()
