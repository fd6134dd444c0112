"""A malformed pool shape is a configuration error, the same from the spec and the impl."""

from __future__ import annotations

import pytest
from prefixkv.impl import HybridPrefixCacheManager, PrefixCacheManager
from prefixkv.spec import PrefixCacheError, SpecCache

from prefixkv.errors import InvalidConfig

#: (num_blocks, block_size, the argument the error must name)
BAD = [
    (0, 4, "num_blocks"),
    (-1, 4, "num_blocks"),
    (True, 4, "num_blocks"),
    ("8", 4, "num_blocks"),
    (None, 4, "num_blocks"),
    (8, 0, "block_size"),
    (8, False, "block_size"),
    (8, 4.0, "block_size"),
]


@pytest.mark.parametrize("cls", [SpecCache, PrefixCacheManager])
@pytest.mark.parametrize(("num_blocks", "block_size", "what"), BAD)
def test_bad_pool_shape(cls: type, num_blocks: object, block_size: object, what: str) -> None:
    with pytest.raises(InvalidConfig) as err:
        cls(num_blocks, block_size)
    assert isinstance(err.value, ValueError)
    assert not isinstance(err.value, PrefixCacheError)  # not a bad request: a bad setup
    assert what in str(err.value)


def test_hybrid_pool_shape() -> None:
    with pytest.raises(InvalidConfig):
        HybridPrefixCacheManager(0, 4, max_num_seqs=2, state_budget=2)
