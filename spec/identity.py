"""Block identity and the pluggable hashes that index it.

The identity of a full block is ``(namespace, parent identity, token ids, extra keys)``.
It is what two blocks must share for one to stand in for the other. A hash of the identity is
*only an index*: every hit is verified against the stored identity, so a weak or colliding
hash can cost time, never correctness (INV-INDEX, INV-MATCH).

Three hashes ship, all with the signature of :data:`BlockHasher`:

* :func:`fast_hash` (the default): CPython's tuple hash over ints, stable across processes.
* :func:`sha256_hash`: a cryptographic digest over a canonical byte encoding, for events that
  leave the process or caches shared between tenants that must not probe each other.
* :func:`weak_hash`: collides on purpose (four buckets). Tests run with it to prove that
  exact verification, not the hash, decides every hit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import attrs

__all__ = [
    "HASHERS",
    "BlockHasher",
    "BlockIdentity",
    "ExtraKey",
    "fast_hash",
    "ns_digest",
    "sha256_hash",
    "tokens_only_hash",
    "weak_hash",
]

#: One multimodal item (or prompt embedding) overlapping a block: ``(offset, content hash)``.
#: The offset is the item's start relative to the block's first position (may be negative).
ExtraKey = tuple[int, bytes]

#: ``(parent hash or None for a root block, namespace key, token ids, extra keys) -> hash``
BlockHasher = Callable[[int | None, bytes, tuple[int, ...], tuple[ExtraKey, ...]], int]


@attrs.frozen(cache_hash=True)
class BlockIdentity:
    """What a full block's KV depends on, exactly.

    ``parent`` is the whole identity of the previous block, so equal identities imply equal
    prefixes all the way to the first token.
    """

    namespace: bytes
    parent: BlockIdentity | None
    token_ids: tuple[int, ...]
    extra_keys: tuple[ExtraKey, ...] = ()

    def __deepcopy__(self, memo: dict[int, Any]) -> BlockIdentity:
        # Immutable: sharing is safe, and copying deep parent chains would be quadratic.
        return self

    @property
    def depth(self) -> int:
        """1 for a root block, parent's depth + 1 otherwise."""
        depth, node = 1, self.parent
        while node is not None:
            depth, node = depth + 1, node.parent
        return depth


_NS_DIGESTS: dict[bytes, int] = {}


def _digest64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big", signed=True)


def ns_digest(namespace: bytes) -> int:
    # NOTE: bytes hashes are salted per process (PYTHONHASHSEED); ints and tuples of ints are
    # not. Digesting the namespace once keeps fast_hash stable across processes, so KV events
    # from two workers agree.
    digest = _NS_DIGESTS.get(namespace)
    if digest is None:
        digest = _NS_DIGESTS[namespace] = _digest64(namespace)
    return digest


def _extra_digest(extra_keys: tuple[ExtraKey, ...]) -> int:
    return _digest64(_encode_extras(extra_keys)) if extra_keys else 0


def _encode_extras(extra_keys: tuple[ExtraKey, ...]) -> bytes:
    out = bytearray(len(extra_keys).to_bytes(8, "big"))
    for offset, content in extra_keys:
        out += offset.to_bytes(8, "big", signed=True)
        out += len(content).to_bytes(8, "big")
        out += content
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
    h.update(b"\x00" if parent is None else b"\x01" + parent.to_bytes(8, "big", signed=True))
    h.update(len(namespace).to_bytes(8, "big") + namespace)
    h.update(len(token_ids).to_bytes(8, "big"))
    h.update(b"".join(t.to_bytes(4, "big") for t in token_ids))
    h.update(_encode_extras(extra_keys))
    return int.from_bytes(h.digest()[:8], "big", signed=True)


def weak_hash(
    parent: int | None,
    namespace: bytes,
    token_ids: tuple[int, ...],
    extra_keys: tuple[ExtraKey, ...],
) -> int:
    """Deliberately terrible: four buckets. Correctness must not depend on the hash.

    It ignores the parent, the namespace and the extra keys, so equal tokens always collide:
    at other depths, under other adapters, and as text against a multimodal item.
    """
    return sum(token_ids) % 4


def tokens_only_hash(
    parent: int | None,
    namespace: bytes,
    token_ids: tuple[int, ...],
    extra_keys: tuple[ExtraKey, ...],
) -> int:
    """The classic mistake: a hash of the block's own tokens only.

    Equal tokens collide exactly: at other depths, under other namespaces, and as text
    against a multimodal item, while most buckets still hold one block. Verification must
    compare the whole identity even when a lookup finds a single candidate.
    """
    return hash(token_ids)


#: Hashes by the names the CLI and the conformance kit accept.
HASHERS: dict[str, BlockHasher] = {
    "fast": fast_hash,
    "sha256": sha256_hash,
    "tokens": tokens_only_hash,
    "weak": weak_hash,
}
