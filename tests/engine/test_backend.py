"""The torch backend against the kernels' torch references; backend selection; the parts
of the model the cache depends on (RoPE by absolute position, the stub encoder, the drafter)."""

from __future__ import annotations

import pytest
import torch
from prefixkv.kernels.metadata import build_batch_metadata
from prefixkv.kernels.reference import attention_ref, write_kv_ref
from prefixkv.spec import InvalidRequest

from prefixkv.engine import BackendUnavailable, Engine, EngineConfig, Turn
from prefixkv.engine.backend import TorchBackend, select_backend
from prefixkv.engine.draft import NgramDrafter
from prefixkv.engine.layers import apply_rope
from prefixkv.engine.multimodal import StubEncoder, image_item


def test_torch_backend_matches_the_references() -> None:
    gen = torch.Generator().manual_seed(0)
    num_pages, page, heads, dim, q_heads = 12, 4, 2, 8, 4
    kc = torch.randn(num_pages, page, heads, dim, generator=gen)
    vc = torch.randn(num_pages, page, heads, dim, generator=gen)
    cached, new = [5, 0, 8], [3, 6, 1]
    blocks = [[7, 2], [3, 9], [0, 11, 4]]
    meta = build_batch_metadata(cached, new, blocks, page)
    t = sum(new)
    k = torch.randn(t, heads, dim, generator=gen)
    v = torch.randn(t, heads, dim, generator=gen)
    q = torch.randn(t, q_heads, dim, generator=gen)
    ref_k, ref_v = write_kv_ref(k, v, kc, vc, meta.slot_mapping)
    backend = TorchBackend()
    backend.write_kv(k, v, kc, vc, meta)
    assert torch.equal(kc, ref_k) and torch.equal(vc, ref_v)
    out = backend.attend(q, kc, vc, meta, tuple(zip(cached, new, strict=True)))
    ref = attention_ref(q, kc, vc, meta.block_table, meta.query_start_loc, meta.seq_lens)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_backend_selection() -> None:
    assert select_backend("auto", torch.device("cpu")).name == "torch"
    with pytest.raises(BackendUnavailable):
        select_backend("fast", torch.device("cpu"))
    with pytest.raises(RuntimeError):  # BackendUnavailable is a RuntimeError
        select_backend("nope", torch.device("cpu"))


def test_rope_depends_on_absolute_position_only() -> None:
    x = torch.randn(1, 2, 8)
    a = apply_rope(x, torch.tensor([5]), 10_000.0)
    b = apply_rope(torch.cat([torch.randn(3, 2, 8), x]), torch.tensor([0, 1, 2, 5]), 10_000.0)
    assert torch.equal(a[0], b[3])
    assert not torch.allclose(a, apply_rope(x, torch.tensor([6]), 10_000.0))


def test_stub_encoder_depends_on_content_only() -> None:
    enc = StubEncoder(16)
    cat, cat2, dog = (image_item(4, 6, c) for c in (b"cat", b"cat", b"dog"))
    assert torch.equal(enc.encode(cat), enc.encode(cat2))
    assert not torch.allclose(enc.encode(cat), enc.encode(dog))
    assert cat.span.content_hash != dog.span.content_hash


def test_ngram_drafter() -> None:
    d = NgramDrafter(n=2)
    assert d.propose([1, 2, 3, 9, 1, 2], 3) == [3, 9, 1]
    assert d.propose([1, 2, 3, 1, 2, 3, 1, 2], 2) == [3, 1]  # newest occurrence first
    assert d.propose([4, 5, 6], 3) == []
    assert d.propose([1, 2, 1], 0) == []


def test_engine_rejects_bad_requests() -> None:
    engine = Engine(EngineConfig(num_blocks=16))
    with pytest.raises(InvalidRequest):
        engine.request("x", [1, 999], 2)  # outside the vocabulary
    with pytest.raises(InvalidRequest):
        engine.run([Turn("a", [1], 2, follows="nobody")])
    with pytest.raises(InvalidRequest):
        engine.run([Turn("a", [1], 2), Turn("a", [2], 2)])
