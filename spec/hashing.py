"""Every block hash by name, and the two that collide on purpose.

The names are what the command line (``--hash``) and the conformance kit (``hasher=``)
accept. :func:`weak_hash` and :func:`tokens_only_hash` are for tests, never for serving:
they make hash collisions the common case, so that a test run with them shows that exact
verification of the stored identity, not the hash, decides every hit (INV-INDEX,
INV-MATCH). They are not part of ``prefixkv.spec.__all__``; import them from here.
"""

from __future__ import annotations

from .identity import BlockHasher, ExtraKey, fast_hash, sha256_hash

__all__ = ["HASHERS", "tokens_only_hash", "weak_hash"]


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
