"""The eviction record: which identities were evicted, and the serial that names each one.

Only to tell "evicted" from "never cached" in ``LostReuse``: at most ``capacity``
identities, oldest first, keyed by identity, never by hash (a result must not depend on the
hasher).

An identity is named by a *serial*. A record key is ``(parent's serial, tokens[, extra
keys])`` and its value is the identity's own serial, so a chain of evicted identities is
walked key by key. A root block's key has its namespace (bytes, never equal to an int
serial) in the parent's place.

NOTE: serials are exact names. A published block carries its identity's serial
(``BlockPool.serial``); republishing a remembered identity takes its remembered serial (see
:meth:`EvictionRecord.serial_for`), so children remembered under it are still found. A
parent's latest eviction always follows its children's (only leaves are evicted), so when a
parent's entry falls out of the record, no remembered child refers to its serial any more.

NOTE: the namespace is in a root's key only. A parent's serial names the parent's whole
identity, namespace included, and a block shares its parent's namespace, so the namespace
would add nothing to a child's key but a reference to hash and compare. Keys without extra
keys are pairs, with them triples: never equal.
"""

from __future__ import annotations

from collections import OrderedDict
from struct import Struct

from prefixkv.spec.multimodal import MultimodalSpan, block_extra_keys

from ._pool import BlockPool

__all__ = ["EvictionRecord", "evicted_key"]

#: An evicted identity, exactly: ``(parent's serial, token ids)``, or
#: ``(parent's serial, token ids, extra keys)`` when the block has extra keys; a root block
#: has its namespace in place of the parent's serial (the token ids as the pool stores them:
#: native uint32 bytes).
EvictedKey = tuple[int | bytes, bytes] | tuple[int | bytes, bytes, tuple[tuple[int, bytes], ...]]


def evicted_key(
    name: int | bytes, tokens: bytes, extras: tuple[tuple[int, bytes], ...] = ()
) -> EvictedKey:
    """The record's key of an identity (see :data:`EvictedKey`): the one place its shape is
    written, for the record and every lookup in it."""
    return (name, tokens, extras) if extras else (name, tokens)


class EvictionRecord:
    """Evicted identities (newest last, at most ``capacity``) and the next fresh serial."""

    __slots__ = ("_cut_block", "_next_serial", "capacity", "entries")

    def __init__(self, capacity: int, block_nbytes: int) -> None:
        self.capacity = capacity
        #: key -> the evicted identity's serial, oldest first.
        self.entries: OrderedDict[EvictedKey, int] = OrderedDict()
        self._next_serial = 1
        #: Cuts a block's token ids (bytes) out of the pool's buffer, at its byte offset.
        self._cut_block = Struct(f"{block_nbytes}s").unpack_from

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        """Forget every identity (a full reset). Serials keep counting: they stay unique."""
        self.entries.clear()

    def remember(self, pool: BlockPool, victims: list[int]) -> None:
        """Add the evicted ``victims``' identities, newest last.

        Each victim's key is read from the pool while it is still published (its parent
        too: only leaves are evicted, so a parent evicted in the same batch comes later).
        A remembered identity moves to the newest end; past ``capacity`` identities the
        oldest fall out, exactly as the spec's record.

        NOTE: the loop writes the key of a block without extra keys out (``evicted_key``'s
        shape, checked by the tests against it) rather than calling ``evicted_key``, which
        costs a call per victim. Remembering a batch in C-level passes
        (drop every key, add every key, cut to ``capacity``) was measured dearer than this
        loop: most of a victim's cost is the record's own dictionary operations on a fresh
        key, which a batch does not make cheaper. Both are measured in docs/benchmarks.md,
        "The full pool: eviction at the cost of its work".
        """
        parent, serial, pns, extra = pool.parent, pool.serial, pool.namespace, pool.extra
        toks, nb, cut = pool.tokens, pool.block_nbytes, self._cut_block
        remembered = self.entries
        drop, drop_oldest = remembered.pop, remembered.popitem
        room = self.capacity - len(remembered)
        for b in victims:
            p = parent[b]
            if extra and b in extra:
                name = serial[p] if p >= 0 else pns[b]
                assert name is not None  # a published root has a namespace
                key = evicted_key(name, cut(toks, b * nb)[0], extra[b])
            else:
                key = (serial[p] if p >= 0 else pns[b], cut(toks, b * nb)[0])  # type: ignore[assignment]
            if drop(key, None) is None:  # not remembered yet: one more, or the oldest goes
                if room:
                    room -= 1
                else:
                    drop_oldest(False)
            remembered[key] = serial[b]

    def serial_for(
        self, name: int | bytes, tokens: bytes, extras: tuple[tuple[int, bytes], ...] = ()
    ) -> int:
        """The serial to publish an identity under: its remembered one, else a fresh one.

        ``name`` is the parent's serial, or the namespace for a root block.
        """
        if self.entries:
            serial = self.entries.get(evicted_key(name, tokens, extras))
            if serial is not None:
                return serial
        serial = self._next_serial
        self._next_serial = serial + 1
        return serial

    def serials_for_run(self, name: int | bytes, raw: bytes, nb: int) -> list[int]:
        """:meth:`serial_for` of each block of a chain without extra keys, root first.

        ``raw`` holds the blocks' token bytes, ``nb`` bytes each; ``name`` names the first
        block's parent (or namespace), and each block is the next one's parent.

        NOTE: remembered serials are looked up only while the parent's serial is a
        remembered one. A fresh serial was never any block's, so no remembered identity has
        it as its parent's serial: below the first block that gets a fresh serial, every
        lookup would miss.
        """
        serials: list[int] = []
        remembered = self.entries
        if remembered:
            get = remembered.get
            for o in range(0, len(raw), nb):
                serial = get(evicted_key(name, raw[o : o + nb]))
                if serial is None:
                    break
                serials.append(serial)
                name = serial
        fresh, new = self._next_serial, len(raw) // nb - len(serials)
        serials.extend(range(fresh, fresh + new))
        self._next_serial = fresh + new
        return serials

    def evicted_run(
        self,
        name: int | bytes,
        buf: bytes,
        spans: tuple[MultimodalSpan, ...],
        block_size: int,
        start: int,
        stop: int,
    ) -> int:
        """How many of a prompt's blocks ``start..stop-1`` were evicted, in a row from
        ``start`` (by identity). ``buf`` is the prompt's token bytes and ``name`` names
        block ``start``'s parent: the last matched block's serial, or the namespace."""
        get = self.entries.get
        nb = 4 * block_size
        run = 0
        for j in range(start, stop):
            mine = buf[j * nb : (j + 1) * nb]
            extras = block_extra_keys(spans, j * block_size, block_size) if spans else ()
            found = get(evicted_key(name, mine, extras))
            if found is None:
                break
            name = found
            run += 1
        return run
