"""Block identity and the pluggable hashes that index it.

The identity of a full block is ``(namespace, parent identity, token ids, extra keys)``.
It is what two blocks must share for one to stand in for the other. A hash of the identity is
*only an index*: every hit is verified against the stored identity, so a weak or colliding
hash can cost time, never correctness (INV-INDEX, INV-MATCH).

Two hashes ship for use, both with the signature of :data:`BlockHasher`:

* :func:`fast_hash` (the default): CPython's tuple hash over ints, stable across processes.
* :func:`sha256_hash`: a cryptographic digest over a canonical byte encoding, for caches
  shared between tenants that must not probe each other.

Whatever the hash that indexes a cache, the hash its KV events carry is :func:`event_hash`:
a 64-bit BLAKE2b of the block's identity chain (its parent's event hash, its namespace, its
tokens and its extra keys). A router keys its mirror by it, so it must not collide, even
for a client who picks its token ids to make it (``fast_hash`` can be inverted, see
docs/events.md).

The hashes that collide on purpose, which tests and the conformance kit run with to show
that exact verification, not the hash, decides every hit, are in :mod:`.hashing`, with
every hash by name.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from array import array
from collections.abc import Callable
from struct import Struct
from typing import Any

import attrs

from .framing import frame, i64, u64

__all__ = [
    "NS_DIGEST_CACHE_SIZE",
    "BlockHasher",
    "BlockIdentity",
    "ExtraKey",
    "event_hash",
    "event_hash_of",
    "event_prefix",
    "fast_hash",
    "ns_digest",
    "sha256_hash",
    "token_bytes",
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


#: A fresh BLAKE2b of :func:`event_hash`: personalized, so that its digests are no other
#: hash's. NOTE: copied, not constructed per block: parsing the keyword arguments cost more
#: than the copy.
_new_event_digest = hashlib.blake2b(digest_size=8, person=b"prefixkv.event").copy
_ROOT = b"\x00"
_CHILD = Struct(">cq").pack
_TOKENS_BIG_ENDIAN = sys.byteorder == "big"
_from_bytes = int.from_bytes


def token_bytes(token_ids: tuple[int, ...]) -> bytes:
    """Token ids (each below 2**32) as little-endian uint32 bytes: the encoding
    :func:`event_hash` digests, the same on every machine."""
    a = array("I", token_ids)
    if _TOKENS_BIG_ENDIAN:  # pragma: no cover - no big-endian machine in CI
        a.byteswap()
    return a.tobytes()


def event_hash(
    parent: int | None,
    namespace: bytes,
    token_ids: tuple[int, ...],
    extra_keys: tuple[ExtraKey, ...],
) -> int:
    """The block hash KV events carry: a 64-bit BLAKE2b of the block's identity chain.

    A :data:`BlockHasher`: ``parent`` is the parent block's event hash (None for a first
    block), so the hash covers the whole chain. The digest is personalized and its input
    injective (a tagged parent, the framed namespace, the tokens with their count, the
    extra keys with theirs), so two identities share an event hash only by a collision of
    BLAKE2b truncated to 64 bits: a birthday search of about 2**32 digests for one pair,
    far more for many blocks under one hash. Signed 64-bit, as every prefixkv hash.
    """
    prefix = event_prefix(namespace, len(token_ids))
    return event_hash_of(parent, prefix, token_bytes(token_ids), extra_keys)


def event_prefix(namespace: bytes, num_tokens: int) -> bytes:
    """What :func:`event_hash` digests between a block's parent and its tokens: the framed
    namespace and the tokens' length in bytes. The same for every block of a sequence, so a
    manager builds it once per call.

    Args:
        namespace: the namespace key.
        num_tokens: tokens per block.

    Returns:
        The bytes :func:`event_hash_of` takes as ``prefix``.
    """
    return frame(namespace) + u64(4 * num_tokens)


def event_hash_of(
    parent: int | None, prefix: bytes, tokens: bytes, extra_keys: tuple[ExtraKey, ...]
) -> int:
    """:func:`event_hash` from the encodings a manager already holds.

    Args:
        parent: the parent block's event hash, None for a first block.
        prefix: :func:`event_prefix` of the block's namespace and size.
        tokens: the block's token ids as :func:`token_bytes` writes them.
        extra_keys: the block's extra keys.

    Returns:
        The event hash, a signed 64-bit int.
    """
    # NOTE: one update of one bytes object, from a copied personalized state: an update
    # per field, or the keyword arguments of a fresh constructor, cost a C call each (what
    # the hash costs per block is measured in docs/events.md, "The event hash").
    data = (_ROOT if parent is None else _CHILD(b"\x01", parent)) + prefix + tokens
    if extra_keys:
        data += _encode_extras(extra_keys)
    h = _new_event_digest()
    h.update(data)
    return _from_bytes(h.digest(), "big", signed=True)
