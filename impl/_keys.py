"""The index keys of block chains: a keyed SipHash chain, or the configured hasher.

A key only says where to look. Whatever the key, every hit is verified exactly against the
stored identity (:mod:`._walk`), so a weak or colliding hasher costs time, never
correctness.

NOTE: with the default hasher (``fast_hash``) blocks are filed under a *keyed* chain hash,
not under the identity hash. ``fast_hash`` is deterministic (KV events from two workers must
agree) and CPython's tuple hash is invertible, so a client who knows the code could craft
thousands of blocks into one bucket and make every lookup linear. The keyed hash (SipHash of
each block's token bytes, salted per process by Python and per manager here) cannot be
steered. Any other hasher (sha256, and the weak ones tests use to force collisions) is the
index key itself.
"""

from __future__ import annotations

import os
from itertools import accumulate, count, repeat
from operator import and_, xor
from struct import unpack_from

from prefixkv.spec.identity import NS_DIGEST_CACHE_SIZE, BlockHasher, fast_hash, ns_digest
from prefixkv.spec.namespace import Namespace
from prefixkv.spec.request import Request

__all__ = ["KEY_MASK", "ChainKeys"]

#: Keyed index keys are masked to 60 bits (see :meth:`ChainKeys.chain_key`).
KEY_MASK = (1 << 60) - 1


class ChainKeys:
    """How a manager keys its index: per namespace a seed, per block a key chained from its
    parent's.

    ``keyed`` is True for the default hasher (the keyed chain, see the module doc). Every
    key is computed here, so the secret salt never leaves this object.
    """

    __slots__ = ("_namespaces", "_salt", "block_nbytes", "block_size", "hasher", "keyed")

    def __init__(self, block_size: int, hasher: BlockHasher) -> None:
        self.block_size = block_size
        #: A block's token ids as native uint32 bytes take this many bytes.
        self.block_nbytes = 4 * block_size
        self.hasher = hasher
        self.keyed = hasher is fast_hash
        # NOTE: bytes, not an int: a bytes object caches its hash, so mixing the salt into
        # every block's key costs nothing per block.
        self._salt = os.urandom(8)
        self._namespaces: dict[Namespace, tuple[bytes, int, int]] = {}

    def __len__(self) -> int:
        """How many namespaces' keys are memoized (bounded by ``NS_DIGEST_CACHE_SIZE``)."""
        return len(self._namespaces)

    def namespace_key(self, namespace: Namespace) -> tuple[bytes, int, int]:
        """The namespace's identity key, its digest (for the inline fast hash) and the seed
        of its keyed index chain."""
        entry = self._namespaces.get(namespace)
        if entry is None:
            # NOTE: a server that isolates every user by salt sees unboundedly many
            # namespaces; the memo is only a memo, so it starts over at the bound rather than
            # growing forever (clearing is O(1) amortised and needs no LRU bookkeeping).
            if len(self._namespaces) >= NS_DIGEST_CACHE_SIZE:
                self._namespaces.clear()
            key = namespace.key()
            digest = ns_digest(key)
            entry = self._namespaces[namespace] = (
                key,
                digest,
                hash((self._salt, digest)) & KEY_MASK,
            )
        return entry

    def prompt_keys(self, req: Request, ns: bytes, seed: int) -> list[int]:
        """The index key of every full block of ``req``'s prompt (a prompt without spans).

        Keyed, this is one pass of C-level iterators over the prompt's bytes: each block's
        bytes are hashed once with its position, and the chain is a running xor (see
        :meth:`chain_key`). Any other hasher is called block by block, as it must be.
        """
        buf, nb = req.token_bytes, self.block_nbytes
        stop = len(buf) - len(buf) % nb
        if not self.keyed:
            tokens, bs, hasher = req.token_ids, self.block_size, self.hasher
            keys: list[int] = []
            h: int | None = None
            for j in range(stop // nb):
                h = hasher(h, ns, tokens[j * bs : (j + 1) * bs], ())
                keys.append(h)
            return keys
        # One C call cuts the prompt into its blocks' bytes: ``"64s64s..."``, one per block.
        blocks = unpack_from(f"{nb}s" * (stop // nb), buf)
        leaves = map(hash, zip(repeat(self._salt), count(), blocks))
        # NOTE: each leaf is masked before the xor, as ``chain_key`` does (masking
        # distributes over xor, so the keys are the same): a hash is negative half the
        # time, and CPython's xor of a negative int takes a slower path than two masked ones.
        chain = accumulate(map(and_, leaves, repeat(KEY_MASK)), xor, initial=seed)
        next(chain)  # the seed itself
        return list(chain)

    def chain_key(
        self,
        parent_key: int | None,
        j: int,
        ns: bytes,
        tokens: tuple[int, ...],
        mine: bytes,
        extras: tuple[tuple[int, bytes], ...],
    ) -> int:
        """The index key of block ``j``: keyed (see the module doc) or the hasher's hash.

        ``parent_key`` is the key of block ``j - 1``, or the namespace's seed (keyed) or
        None (a hasher) for a root block; ``mine`` is the block's token ids as native uint32
        bytes, ``tokens`` the same ids as ints.

        NOTE: the keyed key of block j is ``seed ^ leaf(0) ^ ... ^ leaf(j)`` where
        ``leaf(i) = hash((salt, i, block i's bytes[, extra keys]))``: Python's SipHash of the
        bytes, salted per process, inside a tuple hash that mixes in this manager's secret
        salt and the position. Every leaf is unpredictable without both secrets and differs
        by position, so the xor cannot be steered, and a whole prompt's keys come out of one
        ``accumulate`` in C (:meth:`prompt_keys`) instead of one Python step per block. The
        key is masked to 60 bits, so that it fits in a two-digit int (32 bytes, not 40).
        """
        if not self.keyed:
            return self.hasher(parent_key, ns, tokens, extras)
        assert parent_key is not None  # a root block chains from its namespace's seed
        if extras:
            return parent_key ^ (hash((self._salt, j, mine, extras)) & KEY_MASK)
        return parent_key ^ (hash((self._salt, j, mine)) & KEY_MASK)
