"""The eviction record on its own: serials taken back or fresh, chains walked key by key.

The differential machines compare what the record makes visible (``LostReuse``, and the
serials that let a republished chain's children be found again) with the spec; these tests
pin down the record's own rules, each on a hand-built record.
"""

from __future__ import annotations

from array import array

import pytest
from prefixkv.impl import PrefixCacheManager
from prefixkv.impl._record import EvictionRecord, evicted_key
from prefixkv.spec import Namespace, Request

NB = 8  # bytes per block: block size 2
NS = b"ns"


def _block(*ids: int) -> bytes:
    return array("I", ids).tobytes()


def test_fresh_serials_count_up_and_a_remembered_one_is_taken_back() -> None:
    record = EvictionRecord(capacity=4, block_nbytes=NB)
    assert [record.serial_for(NS, _block(i, i)) for i in range(3)] == [1, 2, 3]
    record.entries[evicted_key(NS, _block(9, 9))] = 2
    assert record.serial_for(NS, _block(9, 9)) == 2  # its old name: no fresh serial used
    assert record.serial_for(NS, _block(8, 8)) == 4
    # Extra keys are part of the identity: same tokens without them is another identity.
    extras = ((0, b"img"),)
    record.entries[evicted_key(7, _block(1, 2), extras)] = 3
    assert record.serial_for(7, _block(1, 2), extras) == 3
    assert record.serial_for(7, _block(1, 2)) == 5


def test_a_run_takes_back_remembered_serials_until_the_first_miss() -> None:
    record = EvictionRecord(capacity=8, block_nbytes=NB)
    record._next_serial = 10
    # A remembered chain root -> a -> b, then c was never cached.
    record.entries[evicted_key(NS, _block(1, 1))] = 4
    record.entries[evicted_key(4, _block(2, 2))] = 6
    raw = _block(1, 1) + _block(2, 2) + _block(3, 3) + _block(4, 4)
    assert record.serials_for_run(NS, raw, NB) == [4, 6, 10, 11]
    assert record.serial_for(NS, _block(5, 5)) == 12  # the run used exactly two fresh ones
    # Under another parent nothing is remembered: every serial is fresh.
    assert record.serials_for_run(99, raw, NB) == [13, 14, 15, 16]


def test_a_run_on_an_empty_record_is_all_fresh() -> None:
    record = EvictionRecord(capacity=8, block_nbytes=NB)
    assert record.serials_for_run(NS, _block(1, 1) * 3, NB) == [1, 2, 3]
    assert record.serials_for_run(NS, b"", NB) == []
    assert record.serial_for(NS, _block(1, 1)) == 4


def test_evicted_run_walks_the_chain_by_serial() -> None:
    record = EvictionRecord(capacity=8, block_nbytes=NB)
    record.entries[evicted_key(NS, _block(1, 1))] = 4
    record.entries[evicted_key(4, _block(2, 2))] = 6
    buf = _block(1, 1) + _block(2, 2) + _block(3, 3)
    assert record.evicted_run(NS, buf, (), 2, 0, 3) == 2
    assert record.evicted_run(NS, buf, (), 2, 0, 1) == 1  # bounded by stop
    assert record.evicted_run(4, buf, (), 2, 1, 3) == 1  # from a matched parent's serial
    assert record.evicted_run(b"other", buf, (), 2, 0, 3) == 0


def test_clear_forgets_identities_but_serials_stay_unique() -> None:
    record = EvictionRecord(capacity=8, block_nbytes=NB)
    record.entries[evicted_key(NS, _block(1, 1))] = 1
    record._next_serial = 2
    record.clear()
    assert len(record) == 0
    assert record.serial_for(NS, _block(1, 1)) == 2


@pytest.mark.parametrize("num_blocks", [2, 3, 5])
def test_a_manager_remembers_at_most_its_pool_size(num_blocks: int) -> None:
    """Evicting many more distinct identities than the pool holds: the record stays within
    ``num_blocks`` and keeps the newest, as the spec's record does."""
    cache = PrefixCacheManager(num_blocks, 2)
    ns = Namespace("m@1")
    for i in range(4 * num_blocks):
        prompt = (i, i, 7)
        cache.admit(Request(i, prompt, ns))
        cache.commit(i, 3, (1,))
        cache.free([i])
        cache.evict(num_blocks)
        assert len(cache._record) <= num_blocks
    assert len(cache._record) == num_blocks
    newest = 4 * num_blocks - 1
    assert cache.match(Request("new", (newest, newest, 7), ns)).lost.evicted == 2
    assert cache.match(Request("old", (0, 0, 7), ns)).lost.evicted == 0  # fell out
