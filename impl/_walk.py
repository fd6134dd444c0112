"""The match walk: the longest cached prefix of a prompt, every hit verified exactly.

::

    keys        k0   k1   k2   k3   k4 ...   every full block's key, in one pass (._keys)
    candidates  b0   b1   b2   --            the index (._index), up to its first miss
    verified    b0   b1                      exact identity, checked per run of ids

The key decides only which blocks are looked at, never which are served: a candidate is a
hit only if its stored identity (the pool's columns) is exactly the prompt's block, parent,
namespace, extra keys and token ids (INV-INDEX, INV-MATCH). It reads the pool and the index
and changes neither.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from itertools import chain, compress, count, islice, repeat
from operator import getitem, ne, sub
from typing import NamedTuple, cast

from prefixkv.spec.errors import InvalidRequest
from prefixkv.spec.multimodal import block_extra_keys
from prefixkv.spec.request import Request

from ._index import HashIndex
from ._keys import ChainKeys
from ._pool import NO_PARENT, BlockPool

__all__ = ["PrefixWalk", "Walk"]


def _first_difference(a: Iterable[object], b: Iterable[object]) -> int:
    """The first position where ``a`` and ``b`` differ (C-level; they must differ)."""
    return next(compress(count(), map(ne, a, b)))


class Walk(NamedTuple):
    """What the index walk along a prompt found (before the cap, clamp and window)."""

    blocks: list[int]
    hashes: list[int]
    #: Position of the first unanchored matched block (unanchored blocks form a suffix).
    first_unanchored: int
    #: Whether the full-prompt cap (choice 4) stopped the walk.
    capped: bool
    #: The index key of every full block of the prompt (empty when not computed up front).
    keys: list[int]


class PrefixWalk:
    """Walks a manager's index along a prompt: its pool, index, keys and block size."""

    __slots__ = ("block_size", "index", "keys", "pool")

    def __init__(self, pool: BlockPool, index: HashIndex, keys: ChainKeys) -> None:
        self.pool, self.index, self.keys = pool, index, keys
        self.block_size = keys.block_size

    def lookup(self, req: Request) -> Walk:
        """Walk the index along ``req``'s prompt.

        Returns the matched blocks, their chain hashes, the position of the first unanchored
        one (unanchored blocks form a suffix of any chain), whether the full-prompt cap
        (choice 4) stopped the walk, and every full block's key (see the module doc).

        Every candidate is verified exactly (:meth:`verified`), so the hash decides only
        which blocks are looked at, never which are served.
        """
        if not isinstance(req, Request):
            raise InvalidRequest(f"expected a Request, got {type(req).__name__}")
        if req.spans:
            return self._lookup_spans(req)
        ns, _, seed = self.keys.namespace_key(req.namespace)
        keys = self.keys.prompt_keys(req, ns, seed)
        # The candidates up to the first miss. A collision bucket (a list) among them is
        # resolved in place by _verified_slow.
        entries = list(map(self.index.get_one, keys))
        if None in entries:  # NOTE: a lookup past the first miss is cheaper than stopping
            del entries[entries.index(None) :]  # at it through a Python-level sentinel call
        found = cast("list[int]", entries)
        m = self.verified(found, keys, req.token_bytes, ns)
        cap = (req.num_tokens - 1) // self.block_size
        capped = m > cap
        if capped:
            m = cap
        del found[m:]
        pool = self.pool
        ref, anchored = pool.ref, pool.anchored_children
        # Anchored blocks form a prefix of any chain (a parent of an anchored block is
        # anchored), so the first unanchored one is found by bisection.
        first_unanchored = bisect_left(found, True, key=lambda b: not (ref[b] or anchored[b]))
        return Walk(found, keys[:m], first_unanchored, capped, keys)

    def verified(self, found: list[int], keys: list[int], buf: bytes, ns: bytes) -> int:
        """How many of the leading candidates ``found`` are exactly the prompt's blocks
        (``buf``: its uint32 bytes; ``keys``: its blocks' index keys).

        Candidate j is block j of the prompt iff its stored identity is the prompt's: its
        parent is candidate j - 1 (none for j = 0), its namespace is ``ns``, it carries no
        extra keys, and its token ids equal the prompt's block j (INV-INDEX, INV-MATCH).
        Each part is checked over the whole chain with C-level iterators; the token ids of a
        run of consecutive block ids are one slice of the pool's buffer, so they take one
        comparison per run. A candidate that is a collision bucket (a list) sends the chain
        to :meth:`_verified_slow`, which resolves buckets block by block.
        """
        m = len(found)
        if not m:
            return 0
        pool = self.pool
        pns = pool.namespace
        c = found[0]
        # One run of consecutive block ids (a chain admitted at once, the common case):
        # its parents and namespaces are slices of the pool's columns, no gather.
        last = found[m - 1]
        one_run = (
            type(c) is int
            and type(last) is int
            and last - c == m - 1
            and found == list(range(c, c + m))
        )
        if one_run:
            parents = pool.parent[c : c + m].tolist()
            namespaces = pns[c : c + m]
        else:
            try:
                # (an array's bound __getitem__ is a slot wrapper: operator.getitem is faster)
                parents = list(map(getitem, repeat(pool.parent), found))
            except TypeError:  # a collision bucket
                return self._verified_slow(found, keys, buf, ns)
            namespaces = list(map(pns.__getitem__, found))
        # The first failing candidate of any part ends the match.
        if parents[0] != NO_PARENT:
            return 0
        if parents[1:] != found[: m - 1]:
            m = 1 + _first_difference(parents[1:], found)
        # (``count`` compares by identity first: a published block shares ``ns``'s object)
        if namespaces.count(ns) != len(namespaces):
            m = next(compress(count(), map(ne, namespaces, repeat(ns, m))), m)
        extra = pool.extra
        if extra and not extra.keys().isdisjoint(found[:m]):
            m = next(compress(count(), map(extra.__contains__, found)))
        # Token ids, one run of consecutive block ids at a time.
        nb, ptoks = pool.block_nbytes, pool.tokens
        if one_run:
            breaks: Iterable[int] = ()  # one run: the common case of a chain admitted at once
        else:
            breaks = compress(count(1), map(ne, map(sub, islice(found, 1, m), found), repeat(1)))
        start = 0
        for stop in chain(breaks, (m,)):
            c = found[start]
            if ptoks[c * nb : (c + stop - start) * nb] != buf[start * nb : stop * nb]:
                for j in range(start, stop):
                    c = found[j]
                    if ptoks[c * nb : (c + 1) * nb] != buf[j * nb : (j + 1) * nb]:
                        return j
            start = stop
        return m

    def _verified_slow(self, found: list[int], keys: list[int], buf: bytes, ns: bytes) -> int:
        """:meth:`verified`, block by block: a bucket is resolved by exact comparison."""
        pool, index = self.pool, self.index
        nb = pool.block_nbytes
        parent = NO_PARENT
        for j, entry in enumerate(found):
            mine = buf[j * nb : (j + 1) * nb]
            if type(entry) is int:
                b = entry
                if not pool.has_identity(b, mine, parent, ns, ()):
                    return j
            else:
                b = index.find(pool, keys[j], parent, mine, ns, ())
                if b < 0:
                    return j
                found[j] = b
            parent = b
        return len(found)

    def _lookup_spans(self, req: Request) -> Walk:
        """``lookup`` for prompts with multimodal spans: blocks carry extra keys."""
        ns, _, seed = self.keys.namespace_key(req.namespace)
        spans, buf = req.spans, req.token_bytes
        bs, n = self.block_size, req.num_tokens
        cap = (n - 1) // bs
        pool = self.pool
        nb = pool.block_nbytes
        tokens = req.token_ids if not self.keys.keyed else ()
        blocks: list[int] = []
        hashes: list[int] = []
        parent = NO_PARENT
        h: int | None = seed if self.keys.keyed else None
        first_unanchored = -1
        capped = False
        for j in range(n // bs):
            mine = buf[j * nb : (j + 1) * nb]
            extras = block_extra_keys(spans, j * bs, bs)
            h = self.keys.chain_key(h, j, ns, tokens[j * bs : (j + 1) * bs], mine, extras)
            b = self.index.find(pool, h, parent, mine, ns, extras)
            if b < 0:
                break
            if j >= cap:
                capped = True
                break
            blocks.append(b)
            hashes.append(h)
            parent = b
            if first_unanchored < 0 and not pool.ref[b] and not pool.anchored_children[b]:
                first_unanchored = j
        return Walk(
            blocks, hashes, len(blocks) if first_unanchored < 0 else first_unanchored, capped, []
        )
