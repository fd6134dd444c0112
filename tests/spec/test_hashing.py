"""The hashes by name: the two that collide on purpose stay out of the public surface, and
stay within reach of the tests, the command line and the conformance kit."""

from __future__ import annotations

import prefixkv.spec as spec
from prefixkv.spec import hashing
from prefixkv.spec.identity import fast_hash, sha256_hash

import prefixkv

TEST_ONLY = ("weak_hash", "tokens_only_hash")


def test_test_hashers_are_not_exported() -> None:
    for name in TEST_ONLY:
        assert name not in spec.__all__ and not hasattr(spec, name), name
        assert name not in prefixkv.__all__, name
    assert {"fast_hash", "sha256_hash", "HASHERS"} <= set(spec.__all__)


def test_every_hash_has_a_name() -> None:
    assert {
        "fast": fast_hash,
        "sha256": sha256_hash,
        "tokens": hashing.tokens_only_hash,
        "weak": hashing.weak_hash,
    } == hashing.HASHERS
    assert spec.HASHERS is hashing.HASHERS  # what the kit's hasher="weak" resolves through


def test_the_test_hashers_collide_on_purpose() -> None:
    ns_a, ns_b = spec.Namespace("a").key(), spec.Namespace("b").key()
    # other namespace, other parent: same bucket
    for h in (hashing.weak_hash, hashing.tokens_only_hash):
        assert h(None, ns_a, (1, 2), ()) == h(7, ns_b, (1, 2), ((0, b"img"),))
    assert fast_hash(None, ns_a, (1, 2), ()) != fast_hash(None, ns_b, (1, 2), ())
    assert len({hashing.weak_hash(None, ns_a, (t,), ()) for t in range(100)}) == 4
