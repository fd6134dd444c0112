"""Prompts as containers: what ``Request`` (and ``commit``'s accepted tokens) take and refuse.

A bad-input table: each entry was either silently accepted (a set became a sorted prompt, a
dict gave its keys, bools became 0/1) or must stay refused, with ``InvalidRequest``.
"""

from __future__ import annotations

from array import array
from typing import Any

import pytest
from prefixkv.impl import PrefixCacheManager
from prefixkv.spec import InvalidRequest, Namespace, Request, SpecCache

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

NS = Namespace("m")

GOOD: list[tuple[str, Any]] = [
    ("list", [3, 1, 2]),
    ("tuple", (3, 1, 2)),
    ("array_I", array("I", [3, 1, 2])),
    ("array_q", array("q", [3, 1, 2])),
    ("numpy_int64", np.array([3, 1, 2], dtype=np.int64)),
    ("numpy_uint32", np.array([3, 1, 2], dtype=np.uint32)),
    ("numpy_strided", np.array([3, 0, 1, 0, 2, 0])[::2]),
    ("numpy_scalars", [np.int64(3), 1, np.int32(2)]),
    ("torch_int64", torch.tensor([3, 1, 2])),
    ("torch_int32", torch.tensor([3, 1, 2], dtype=torch.int32)),
]


class _DuckArray:
    """An array-like with numpy's dtype, ndim, size, min and max, but an ``astype`` whose
    result has no ``tobytes`` (``converts``: what ``astype`` returns)."""

    dtype = np.dtype("int64")
    ndim = 1
    size = 3

    def __init__(self, converts: Any) -> None:
        self._converts = converts

    def min(self) -> int:
        return 1

    def max(self) -> int:
        return 3

    def astype(self, dtype: str, copy: bool = True) -> Any:
        return self._converts


class _ShortBytes:
    def tobytes(self) -> bytes:
        return b"\x03"


BAD: list[tuple[str, Any]] = [
    ("set", {3, 1, 2}),
    ("frozenset", frozenset({3, 1, 2})),
    ("dict", {3: 0, 1: 0, 2: 0}),
    ("dict_keys", {3: 0, 1: 0}.keys()),
    ("dict_values", {0: 3, 1: 1}.values()),
    ("iterator", iter([3, 1, 2])),
    ("generator", (t for t in [3, 1, 2])),
    ("bools", [True, False]),
    ("bool_in_ints", [3, True]),
    ("numpy_bool", np.array([True, False])),
    ("torch_bool", torch.tensor([True, False])),
    ("floats", [1.0, 2.0]),
    ("numpy_float", np.array([1.0, 2.0])),
    ("torch_float", torch.tensor([1.0, 2.0])),
    ("array_d", array("d", [1.0])),
    ("negative", [3, -1]),
    ("numpy_negative", np.array([3, -1])),
    ("torch_negative", torch.tensor([3, -1])),
    ("array_negative", array("i", [3, -1])),
    ("too_big", [2**32]),
    ("numpy_too_big", np.array([2**32])),
    ("array_too_big", array("Q", [2**32])),
    ("numpy_2d", np.array([[3, 1], [2, 0]])),
    ("torch_2d", torch.tensor([[3, 1], [2, 0]])),
    ("numpy_object", np.array([3, "x"], dtype=object)),
    # a masked element has no token id (tobytes() writes the fill value, 999999, there)
    ("numpy_masked", np.ma.array([3, 1, 2], mask=[False, True, False])),
    ("numpy_masked_unmasked", np.ma.array([3, 1, 2])),
    ("duck_without_tobytes", _DuckArray(object())),
    ("duck_short_bytes", _DuckArray(_ShortBytes())),
    ("str", "312"),
    ("bytes", b"\x03\x01\x02"),
    ("bytearray", bytearray(b"\x03")),
    ("none", None),
    ("int", 3),
]


@pytest.mark.parametrize(("name", "value"), GOOD, ids=[g[0] for g in GOOD])
def test_accepted_containers(name: str, value: Any) -> None:
    req = Request(1, value, NS)
    assert req.token_ids == (3, 1, 2)
    assert all(type(t) is int for t in req.token_ids)


def test_any_sequence() -> None:
    assert Request(1, range(3, 0, -1), NS).token_ids == (3, 2, 1)


@pytest.mark.parametrize(("name", "value"), BAD, ids=[b[0] for b in BAD])
def test_refused_containers(name: str, value: Any) -> None:
    with pytest.raises(InvalidRequest):
        Request(1, value, NS)


@pytest.mark.parametrize("cls", [SpecCache, PrefixCacheManager])
@pytest.mark.parametrize(("name", "value"), BAD[:12], ids=[b[0] for b in BAD[:12]])
def test_refused_accepted_tokens(cls: type[Any], name: str, value: Any) -> None:
    """``commit`` refuses the same containers as accepted tokens, and changes nothing."""
    cache = cls(8, 2)
    cache.admit(Request(1, [5, 6, 7], NS))
    before = cache.snapshot()
    with pytest.raises(InvalidRequest):
        cache.commit(1, 0, value)
    assert cache.snapshot() == before


def test_one_read_only_copy() -> None:
    """A tuple of ints is kept as it is; an array is copied once, and later writes to the
    caller's buffer do not reach the request."""
    prompt = (3, 1, 2)
    assert Request(1, prompt, NS).token_ids is prompt
    buf = np.array([3, 1, 2])
    req = Request(1, buf, NS)
    buf[0] = 9
    assert req.token_ids == (3, 1, 2)


def test_device_tensor_refused() -> None:
    if not torch.cuda.is_available():
        meta = torch.empty(3, dtype=torch.int64, device="meta")
        with pytest.raises(InvalidRequest):
            Request(1, meta, NS)
        return
    with pytest.raises(InvalidRequest):
        Request(1, torch.tensor([3, 1, 2], device="cuda"), NS)
