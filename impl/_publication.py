"""Publication (choice 1): a sequence's full, committed blocks become cached identities.

Each block is filed in the index under its chain key and its identity is stored in the pool,
under its parent: the sequence's own block before it, or that block's canonical twin when
the sequence's own block is a private duplicate (choice 2). A block whose identity is already
published stays private; one whose parent identity is gone (evicted) is an orphan and stays
private too (INV-ANCESTOR). A republished identity takes back the serial the eviction record
remembers for it, so that its evicted children are still found under it.
"""

from __future__ import annotations

import sys

from prefixkv.spec.events import KVEvent, stored_event
from prefixkv.spec.identity import event_hash_of, event_prefix, token_bytes
from prefixkv.spec.multimodal import block_extra_keys

from ._index import HashIndex
from ._keys import ChainKeys
from ._pool import NO_PARENT, BlockPool
from ._record import EvictionRecord
from ._sequence import SeqState

__all__ = ["MISSING", "Publisher"]

#: The pool keeps token ids as native uint32 bytes; the event hash digests little-endian.
_LITTLE_ENDIAN = sys.byteorder == "little"

#: What :meth:`Publisher.canonical` returns when a chain's identity is no longer published.
MISSING = -2


class Publisher:
    """Publishes sequences' blocks into a manager's pool, index and eviction record."""

    __slots__ = ("block_size", "index", "keys", "pool", "record")

    def __init__(
        self, pool: BlockPool, index: HashIndex, keys: ChainKeys, record: EvictionRecord
    ) -> None:
        self.pool, self.index, self.keys, self.record = pool, index, keys, record
        self.block_size = keys.block_size

    def canonical(self, seq: SeqState, i: int) -> int:
        """The published block carrying the identity of ``seq``'s block ``i``, or MISSING.

        Called only when ``seq``'s own block ``i`` is private (a duplicate or an orphan).
        The remembered answer is reused while its block has not been evicted since;
        otherwise the chain is re-resolved from the root, as a match would.
        """
        pool = self.pool
        if seq.canon_j == i and seq.canon_block >= 0 and pool.gen[seq.canon_block] == seq.canon_gen:
            return seq.canon_block
        bs, tokens, blocks, ns = self.block_size, seq.tokens, seq.blocks, seq.namespace
        p = NO_PARENT
        for k in range(i + 1):
            b = blocks[k]
            if pool.depth[b]:
                p = b
                continue
            mine = tokens[k * bs : (k + 1) * bs].tobytes()
            extras = block_extra_keys(seq.spans, k * bs, bs) if seq.spans else ()
            p = self.index.find(pool, seq.hashes[k], p, mine, ns, extras)
            if p < 0:
                return MISSING
        seq.canon_j, seq.canon_block, seq.canon_gen = i, p, pool.gen[p]
        return p

    def publish(self, seq: SeqState, first: int, stop: int, events: list[KVEvent] | None) -> int:
        """Choice 1: publish the full, committed blocks ``first..stop-1`` of ``seq``;
        returns how many were published. ``events`` is the queue of KV events, or None
        when the manager records none.

        ::

            blocks of seq   [ settled ... ][ first ... stop-1 ][ partial / uncomputed ]
                                            ^ full and committed: publish each unless its
                                              identity is already published (it stays a
                                              private duplicate, choice 2) or its parent
                                              identity is gone (an orphan, INV-ANCESTOR)
        """
        # NOTE: two fast paths for the plain case (the keyed index, no events, no multimodal
        # spans): one block (a decode step completing its block) and a run of prompt blocks
        # whose keys the admission computed (a prefill). Each handles only what it can
        # finish: a block filed under a key already (a twin or a collision) or a private
        # parent (a canonical twin to find, or an orphan) sends the call, before anything
        # changed, to the general loop below, which alone handles duplicates, orphans,
        # events and extra keys.
        keys = self.keys
        if keys.keyed and events is None and not seq.spans:
            if stop - first == 1:
                if self._publish_one(seq, first):
                    return 1
            elif self._publish_run(seq, first, stop):
                return stop - first
        return self._publish_each(seq, first, stop, events)

    def _publish_each(
        self, seq: SeqState, first: int, stop: int, events: list[KVEvent] | None
    ) -> int:
        """:meth:`publish`'s general loop, one block at a time: any hasher, KV events,
        multimodal extra keys, duplicates (choice 2) and orphans (INV-ANCESTOR)."""
        keys = self.keys
        bs, tokens, blocks, hashes, ns = (
            self.block_size,
            seq.tokens,
            seq.blocks,
            seq.hashes,
            seq.namespace,
        )
        pool, index = self.pool, self.index
        get_one = index.get_one
        record = self.record
        keyed = keys.keyed
        wire = seq.wire if pool.wire_hashes else None
        prefix = event_prefix(ns, bs) if wire is not None else b""
        pdepth = pool.depth
        published = 0
        spans = seq.spans
        extras: tuple[tuple[int, bytes], ...] = ()
        prompt_keys = seq.prompt_keys
        for j in range(first, stop):
            mine = tokens[j * bs : (j + 1) * bs].tobytes()
            if spans:
                extras = block_extra_keys(spans, j * bs, bs)
            tup: tuple[int, ...] | None = None
            if j < len(prompt_keys):
                h = prompt_keys[j]  # hashed up front by the admission's lookup
            elif keyed:
                h = keys.chain_key(hashes[j - 1] if j else seq.seed, j, ns, (), mine, extras)
            else:
                tup = tuple(tokens[j * bs : (j + 1) * bs])
                h = keys.chain_key(hashes[j - 1] if j else None, j, ns, tup, mine, extras)
            hashes.append(h)
            # The event hash (prefixkv.spec.identity.event_hash) is kept per block of the
            # sequence while events are recorded: a twin's is its published twin's, any
            # other block's is computed here, once.
            w, parent_w = 0, None
            if wire is not None:
                parent_w = wire[j - 1] if j else None
            if j == 0:
                p = NO_PARENT
            else:
                p = blocks[j - 1]
                if not pdepth[p]:
                    p = self.canonical(seq, j - 1)
                    if p == MISSING:
                        if wire is not None:  # an orphan: its children chain from it
                            le = mine if _LITTLE_ENDIAN else self._le_tokens(seq, j)
                            wire.append(event_hash_of(parent_w, prefix, le, extras))
                        continue
            if get_one(h) is not None:
                twin = index.find(pool, h, p, mine, ns, extras)
                if twin >= 0:
                    seq.canon_j, seq.canon_block, seq.canon_gen = j, twin, pool.gen[twin]
                    if wire is not None:
                        wire.append(pool.event_hash[twin])
                    continue
            if wire is not None:
                le = mine if _LITTLE_ENDIAN else self._le_tokens(seq, j)
                w = event_hash_of(parent_w, prefix, le, extras)
                wire.append(w)
            b = blocks[j]
            index.insert(h, b)
            # A remembered identity keeps its name (see ._record).
            serial = record.serial_for(pool.serial[p] if p >= 0 else ns, mine, extras)
            pool.publish(b, mine, ns, extras, p, h, w, j + 1, serial)
            published += 1
            if events is not None:
                if tup is None:
                    tup = tuple(tokens[j * bs : (j + 1) * bs])
                events.append(stored_event(w, parent_w, tup, bs, ns, extras))
        return published

    def _le_tokens(self, seq: SeqState, j: int) -> bytes:  # pragma: no cover - big-endian
        """``seq``'s block ``j`` as the event hash digests it, on a big-endian machine."""
        bs = self.block_size
        return token_bytes(tuple(seq.tokens[j * bs : (j + 1) * bs]))

    def _publish_one(self, seq: SeqState, j: int) -> bool:
        """:meth:`publish` of the one block ``j`` in the plain case, if it is new and its
        parent is published; otherwise change nothing and return False."""
        p = self._own_parent(seq, j)
        if p == MISSING:
            return False  # before hashing: the general loop hashes the block itself
        bs = self.block_size
        mine = seq.tokens[j * bs : (j + 1) * bs].tobytes()
        prompt_keys = seq.prompt_keys
        if j < len(prompt_keys):
            h = prompt_keys[j]  # hashed up front by the admission's lookup
        else:
            parent_key = seq.hashes[j - 1] if j else seq.seed
            h = self.keys.chain_key(parent_key, j, seq.namespace, (), mine, ())
        pool = self.pool
        b = seq.blocks[j]
        # File b under h unless h is filed already. b is unpublished, so it is in no
        # bucket (INV-INDEX): ``claim`` hands back this very object iff it filed it.
        if self.index.claim(h, b) is not b:
            return False  # a twin or a colliding key: the general loop verifies which
        seq.hashes.append(h)
        ns = seq.namespace
        # A remembered identity keeps its name (see ._record).
        serial = self.record.serial_for(pool.serial[p] if p >= 0 else ns, mine)
        pool.publish_plain(b, mine, ns, p, h, j + 1, serial)
        return True

    def _own_parent(self, seq: SeqState, j: int) -> int:
        """The parent a fast publication path files ``seq``'s block ``j`` under: its own
        block ``j - 1`` when that is published (NO_PARENT for a root block), else MISSING
        (a private parent: its canonical twin or an orphan, which only the general loop
        resolves)."""
        if not j:
            return NO_PARENT
        p = seq.blocks[j - 1]
        return p if self.pool.depth[p] else MISSING

    def _publish_run(self, seq: SeqState, first: int, stop: int) -> bool:
        """:meth:`publish` of the prompt blocks ``first..stop-1`` in the plain case, if the
        admission computed their keys, none is filed yet and block ``first``'s parent is
        published; otherwise change nothing and return False.

        Then every block of the run is new, so each is published under its own parent, the
        block before it in the run.
        """
        prompt_keys = seq.prompt_keys
        if stop > len(prompt_keys):
            return False
        pool = self.pool
        blocks = seq.blocks
        p = self._own_parent(seq, first)
        if p == MISSING:
            return False
        keys = prompt_keys[first:stop]
        run = blocks[first:stop]
        if not self.index.file_new(keys, run):
            return False  # a key filed already (a twin or a collision), or twice in the run
        seq.hashes.extend(keys)
        bs = self.block_size
        raw = seq.tokens[first * bs : stop * bs].tobytes()
        # A remembered identity keeps its name (see ._record); a root's is its namespace.
        name: int | bytes = pool.serial[p] if p >= 0 else seq.namespace
        serials = self.record.serials_for_run(name, raw, pool.block_nbytes)
        pool.publish_run(run, raw, seq.namespace, p, keys, first + 1, serials)
        return True
