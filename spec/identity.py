"""Block identity and the pluggable hashes that index it.

The identity of a full block is ``(namespace, parent identity, token ids, extra keys)``.
It is what two blocks must share for one to stand in for the other. A hash of the identity is
*only an index*: every hit is verified against the stored identity, so a weak or colliding
hash can cost time, never correctness (INV-INDEX, INV-MATCH).

Two hashes ship for use, both with the signature of :data:`BlockHasher`:

* :func:`fast_hash` (the default): CPython's tuple hash over ints, stable across processes.
* :func:`sha256_hash`: a cryptographic digest over a canonical byte encoding, for events that
  leave the process or caches shared between tenants that must not probe each other.

The hashes that collide on purpose, which tests and the conformance kit run with to show
that exact verification, not the hash, decides every hit, are in :mod:`.hashing`, with
every hash by name.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from typing import Any

import attrs

from .framing import frame, i64, u64

__all__ = [
    "NS_DIGEST_CACHE_SIZE",
    "BlockHasher",
    "BlockIdentity",
    "ExtraKey",
    "fast_hash",
    "ns_digest",
    "sha256_hash",
]

#: One multimodal item (or prompt embedding) overlapping a block: ``(offset, content hash)``.
#: The offset is the item's start relative to the block's first position (may be negative).
ExtraKey = tuple[int, bytes]

#: ``(parent hash or None for a root block, namespace key, token ids, extra keys) -> hash``
BlockHasher = Callable[[int | None, bytes, tuple[int, ...], tuple[ExtraKey, ...]], int]


def _parent_repr(parent: BlockIdentity | None) -> str:
    # The whole chain would print every ancestor (and recurse as deep as the prompt is long).
    return "None" if parent is None else f"<BlockIdentity at depth {parent.depth}>"


@attrs.frozen(eq=False)
class BlockIdentity:
    """What a full block's KV depends on, exactly.

    ``parent`` is the whole identity of the previous block, so equal identities imply equal
    prefixes all the way to the first token.

    NOTE: equality and hashing are written out instead of generated. The generated ones
    recurse into ``parent``, so comparing or hashing a chain thousands of blocks deep (a long
    prompt) raised ``RecursionError``, and every comparison of two equal chains walked them
    to the root. Here the hash and the depth are computed once, at construction, from the
    parent's (O(1)); equality walks the two chains iteratively and stops at the first
    ancestor the two share as one object. A cache that builds a request's chain on top of
    the published identity objects (see ``SpecCache._chain``) thus compares in O(1).
    """

    namespace: bytes
    parent: BlockIdentity | None = attrs.field(repr=_parent_repr)
    token_ids: tuple[int, ...]
    extra_keys: tuple[ExtraKey, ...] = ()
    _hash: int = attrs.field(init=False, repr=False)
    _depth: int = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        parent = self.parent
        parent_hash = None if parent is None else parent._hash
        key = (self.namespace, parent_hash, self.token_ids, self.extra_keys)
        object.__setattr__(self, "_hash", hash(key))
        object.__setattr__(self, "_depth", 1 if parent is None else parent._depth + 1)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockIdentity):
            return NotImplemented
        a: BlockIdentity | None = self
        b: BlockIdentity | None = other
        while a is not b:
            if a is None or b is None:
                return False
            if (
                a._hash != b._hash
                or a.token_ids != b.token_ids
                or a.namespace != b.namespace
                or a.extra_keys != b.extra_keys
            ):
                return False
            a, b = a.parent, b.parent
        return True

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt through the constructor: the cached hash covers a bytes hash, which is
        # salted per process, so it must not travel in a pickle.
        return (BlockIdentity, (self.namespace, self.parent, self.token_ids, self.extra_keys))

    def __deepcopy__(self, memo: dict[int, Any]) -> BlockIdentity:
        # Immutable: sharing is safe, and copying deep parent chains would be quadratic.
        return self

    @property
    def depth(self) -> int:
        """1 for a root block, parent's depth + 1 otherwise."""
        return self._depth


#: How many namespace digests :func:`ns_digest` keeps. A server that isolates users with a
#: per-user salt sees an unbounded number of namespaces over its life; the cache must not
#: grow with them. The hot set (the namespaces of live and recently cached requests) is
#: small, and a miss costs one 8-byte BLAKE2b over a short key, so a bounded LRU loses
#: almost nothing.
NS_DIGEST_CACHE_SIZE = 4096


def _digest64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)


# NOTE: bounded on purpose. An unbounded module-level dict here kept every namespace ever
# hashed, across resets and after the cache itself was gone (one entry per tenant salt).
@functools.lru_cache(maxsize=NS_DIGEST_CACHE_SIZE)
def ns_digest(namespace: bytes) -> int:
    """A 64-bit digest of a namespace key, memoized in a bounded LRU cache.

    bytes hashes are salted per process (PYTHONHASHSEED); ints and tuples of ints are not.
    Digesting the namespace keeps :func:`fast_hash` stable across processes, so KV events
    from two workers agree.
    """
    return _digest64(namespace)


def _extra_digest(extra_keys: tuple[ExtraKey, ...]) -> int:
    return _digest64(_encode_extras(extra_keys)) if extra_keys else 0


def _encode_extras(extra_keys: tuple[ExtraKey, ...]) -> bytes:
    # count, then per key its offset and its framed content (injective: see .framing)
    out = bytearray(u64(len(extra_keys)))
    for offset, content in extra_keys:
        out += i64(offset)
        out += frame(content)
    return bytes(out)


def fast_hash(
    parent: int | None,
    namespace: bytes,
    token_ids: tuple[int, ...],
    extra_keys: tuple[ExtraKey, ...],
) -> int:
    """CPython's tuple hash: fast, 64-bit, deterministic across processes."""
    if parent is None:
        return hash((ns_digest(namespace), token_ids, _extra_digest(extra_keys)))
    return hash((parent, ns_digest(namespace), token_ids, _extra_digest(extra_keys)))


def sha256_hash(
    parent: int | None,
    namespace: bytes,
    token_ids: tuple[int, ...],
    extra_keys: tuple[ExtraKey, ...],
) -> int:
    """SHA-256 over a canonical, length-prefixed encoding, truncated to 64 bits."""
    h = hashlib.sha256()
    h.update(b"\x00" if parent is None else b"\x01" + i64(parent))
    h.update(frame(namespace))
    h.update(u64(len(token_ids)))
    h.update(b"".join(t.to_bytes(4, "big") for t in token_ids))
    h.update(_encode_extras(extra_keys))
    return int.from_bytes(h.digest()[:8], "big", signed=True)
