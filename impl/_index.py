"""The hashed index of published blocks, with exact verification on every lookup.

A hash is only a way to find candidates. A hit must match the stored identity exactly:
namespace, parent block, token ids and extra keys (INV-INDEX, INV-MATCH). With a weak hash several
published blocks share a bucket; lookups then scan the bucket, still returning only exact
matches, so a colliding hash costs time, never correctness.

The comparison itself is the pool's (:meth:`BlockPool.has_identity`): it owns the stored
identities.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat

from ._pool import BlockPool

__all__ = ["HashIndex"]


class HashIndex:
    __slots__ = ("_buckets", "claim", "get_one")

    def __init__(self, buckets: dict[int, int | list[int]] | None = None) -> None:
        # A bucket is one block id (the common case) or a list of ids after a collision.
        self._buckets: dict[int, int | list[int]] = {} if buckets is None else buckets
        #: The bucket under a key: its one block id (the common case), its candidates (a
        #: list, after a collision: use :meth:`find`), or None.
        #:
        #: NOTE: the bound ``dict.get`` itself, not a method around it: the match walk calls
        #: it once per block. A single block is a candidate, not a hit: the caller verifies
        #: the identity exactly, as :meth:`find` does for every candidate of a shared bucket.
        self.get_one: Callable[[int], int | list[int] | None] = self._buckets.get
        #: ``claim(key, b)`` files block ``b`` under ``key`` if nothing is filed there, and
        #: returns the bucket under ``key`` either way: ``b`` itself (this very object) iff it
        #: filed it. One dict operation for the lookup and the insert of a new block.
        #:
        #: NOTE: the bound ``dict.setdefault``, as ``get_one``. The caller passes a block that
        #: is in no bucket (an unpublished one, INV-INDEX), so an existing bucket is never
        #: that same object, and one that is not handed back untouched means a twin or a
        #: collision, which the caller verifies as :meth:`find` does.
        self.claim: Callable[[int, int], int | list[int]] = self._buckets.setdefault

    def __deepcopy__(self, memo: dict[int, object]) -> HashIndex:
        # NOTE: ``get_one`` and ``claim`` are bound to the bucket dict, and copy treats
        # builtin methods as atomic: a plain deep copy would use the *original* buckets.
        # Rebind them.
        buckets: dict[int, int | list[int]] = {}
        for key, entry in self._buckets.items():
            buckets[key] = entry if type(entry) is int else list(entry)  # type: ignore[arg-type]
        return HashIndex(buckets)

    def find(
        self,
        pool: BlockPool,
        key: int,
        parent: int,
        tokens: bytes,
        namespace: bytes,
        extra: tuple[tuple[int, bytes], ...],
    ) -> int:
        """The published block with exactly this identity, or -1 (``tokens``: uint32 bytes)."""
        entry = self._buckets.get(key)
        if entry is None:
            return -1
        candidates = (entry,) if type(entry) is int else entry
        assert isinstance(candidates, (tuple, list))
        has_identity = pool.has_identity
        for b in candidates:
            if has_identity(b, tokens, parent, namespace, extra):
                return b
        return -1

    def insert(self, key: int, b: int) -> None:
        entry = self._buckets.get(key)
        if entry is None:
            self._buckets[key] = b
        elif type(entry) is int:
            self._buckets[key] = [entry, b]
        else:
            assert isinstance(entry, list)
            entry.append(b)

    def file_new(self, keys: list[int], blocks: list[int]) -> bool:
        """File each of ``blocks`` (unpublished) under its key, if none of ``keys`` is filed
        yet and no two of them are equal; otherwise change nothing and return False.

        Two C-level passes (a disjointness test and a dict update) instead of a lookup and
        an insert per block. A key filed already, or one key twice in ``keys``, may be a
        twin or a collision: the caller then goes block by block, verifying each.
        """
        buckets = self._buckets
        if not buckets.keys().isdisjoint(keys):
            return False
        before = len(buckets)
        buckets.update(zip(keys, blocks, strict=True))
        if len(buckets) - before == len(keys):
            return True
        # A key twice in ``keys`` (a collision inside the run): none of them was filed
        # before, so removing them all restores the index exactly.
        for key in keys:
            buckets.pop(key, None)
        return False

    def none_filed(self, keys: list[int]) -> bool:
        """Whether no block is filed under any of ``keys`` (one C-level pass)."""
        return self._buckets.keys().isdisjoint(keys)

    def remove(self, key: int, b: int) -> None:
        """Forget block ``b`` under ``key`` (it is in the index)."""
        entry = self._buckets[key]
        if type(entry) is int:
            del self._buckets[key]
            return
        assert isinstance(entry, list)
        entry.remove(b)
        if len(entry) == 1:
            self._buckets[key] = entry[0]

    def remove_all(self, keys: list[int], blocks: list[int]) -> None:
        """Forget each of ``blocks`` under its key (``keys[i]`` is ``blocks[i]``'s; each is
        in the index): :meth:`remove` for a batch, in one C-level pass when no bucket is
        shared."""
        buckets = self._buckets
        popped = list(map(buckets.pop, keys, repeat(None)))
        if popped != blocks:
            # A collision bucket (a list) was among them: put back what was popped, then
            # remove one at a time (a key may be popped twice; the second gets None).
            for key, entry in zip(keys, popped, strict=True):
                if entry is not None:
                    buckets[key] = entry
            for key, b in zip(keys, blocks, strict=True):
                self.remove(key, b)

    def largest_bucket(self) -> int:
        """The most blocks filed under one key (0 when empty)."""
        return max(
            (1 if type(entry) is int else len(entry) for entry in self._buckets.values()),  # type: ignore[arg-type]
            default=0,
        )

    def clear(self) -> None:
        self._buckets.clear()

    def blocks(self) -> list[int]:
        out: list[int] = []
        for entry in self._buckets.values():
            if type(entry) is int:
                out.append(entry)
            else:
                assert isinstance(entry, list)
                out.extend(entry)
        return out

    def entries(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for key, entry in self._buckets.items():
            if type(entry) is int:
                out.append((key, entry))
            else:
                assert isinstance(entry, list)
                out.extend((key, b) for b in entry)
        return out
