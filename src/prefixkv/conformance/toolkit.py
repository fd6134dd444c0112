"""Helpers for writing an adapter, so that an adapter is the translation and nothing else.

An adapter turns the kit's calls into the engine's and renders the engine's state as a
:class:`~prefixkv.spec.CacheState`. Everything else an adapter used to carry is here:

* **Argument checks** (:func:`check_count`, :func:`check_seq_id`, :func:`check_request`,
  :func:`check_new`, :func:`check_tokens`, :func:`check_commit`, :func:`check_flag`,
  :func:`check_free_batch`, :func:`live`) raise the exact
  :class:`~prefixkv.spec.PrefixCacheError` subclasses the kit expects, before the engine is
  touched, so a refused call changes nothing (INV-TXN); :func:`refusal` turns an engine's
  own refusal into ``InvalidOperation``.
* **The operations every adapter writes the same way** (:class:`AdapterBase`): ``append``
  after ``can_append``, a batched ``free``, ``reset`` and ``seq_ids`` over the adapter's
  table of live requests; the adapter supplies the engine calls (``extend``, ``release``,
  ``clear_cache``).
* **Statistics from a snapshot** (:class:`Counters`, :func:`stats_from`,
  :class:`AdapterBase`) for engines that
  keep no :class:`~prefixkv.spec.CacheStats`: occupancy is derived from the blocks, and
  the token counters from what the adapter saw at admission.
* **Snapshots of hash-chained caches** (:class:`Block`, :func:`build_snapshot`): engines
  that store a chained hash per block but no parent pointer, and engines that keep cached
  blocks inside their free queue (a cached block there counts as evictable, not free).
* **Dry runs on a copy** (:func:`dry_run`, :func:`check_deepcopy`) for engines whose
  allocation is not transactional: decide success on a deep copy, then apply to the real
  manager only if it succeeded.
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import (
    Callable,
    Collection,
    Container,
    Hashable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import Generic, TypeVar, cast

import attrs

from prefixkv.errors import require_int
from prefixkv.spec import (
    BlockView,
    CacheBusy,
    CacheState,
    CacheStats,
    DuplicateSequence,
    InvalidOperation,
    InvalidRequest,
    KVEvent,
    Match,
    OutOfBlocks,
    PrefixCacheError,
    Request,
    SeqId,
    SeqView,
    UnknownSequence,
)

__all__ = [
    "AdapterBase",
    "Block",
    "BlockMemo",
    "Counters",
    "Lineage",
    "SeqBook",
    "build_snapshot",
    "check_commit",
    "check_count",
    "check_deepcopy",
    "check_flag",
    "check_free_batch",
    "check_new",
    "check_request",
    "check_seq_id",
    "check_tokens",
    "dry_run",
    "live",
    "match_of",
    "refusal",
    "stats_from",
]

_T = TypeVar("_T")
_U = TypeVar("_U")
_K = TypeVar("_K")
_V = TypeVar("_V")
_R = TypeVar("_R")  # an engine's request

#: Token ids the kit's workloads use fit here; the kit's bad inputs fall outside.
MAX_TOKEN_ID = 2**32


# -- argument checks ------------------------------------------------------------------------


def check_count(value: object, what: str, minimum: int = 1) -> int:
    """An ``int`` (not a ``bool``) at least ``minimum``, else ``InvalidRequest``."""
    return require_int(value, what, minimum=minimum, error=InvalidRequest)


def check_seq_id(value: object) -> SeqId:
    """A sequence id is an ``int`` (not a ``bool``) or a ``str``, else ``InvalidRequest``."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidRequest(f"a sequence id is an int or a str, got {value!r}")
    return value


def check_request(value: object) -> Request:
    """A :class:`~prefixkv.spec.Request`, else ``InvalidRequest``."""
    if not isinstance(value, Request):
        raise InvalidRequest(f"expected a Request, got {value!r}")
    return value


def check_new(value: object, table: Container[object], num_new_tokens: object = None) -> Request:
    """The arguments of ``can_admit`` and ``admit``, in the spec's order: a
    :class:`~prefixkv.spec.Request` and a token budget that is ``None`` or an ``int >= 1``
    (else ``InvalidRequest``), for a sequence not live in ``table`` (else
    ``DuplicateSequence``)."""
    req = check_request(value)
    if num_new_tokens is not None:
        check_count(num_new_tokens, "num_new_tokens")
    if req.seq_id in table:
        raise DuplicateSequence(f"sequence {req.seq_id!r} is already live")
    return req


def check_tokens(value: object) -> list[int]:
    """``accepted_tokens``: a sequence (not a string) of token ids, else ``InvalidRequest``."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InvalidRequest(f"accepted_tokens must be a sequence of token ids, got {value!r}")
    tokens = list(value)
    for t in tokens:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < MAX_TOKEN_ID:
            raise InvalidRequest(f"bad token id {t!r}")
    return tokens


def check_commit(
    num_computed: object, accepted_tokens: object, *, committed: int, allocated: int, known: int
) -> tuple[int, list[int]]:
    """The arguments of ``commit``: ``(num_computed, accepted_tokens)`` checked.

    ``committed`` tokens of the sequence hold written KV, ``allocated`` have slots and
    ``known`` token ids are known before ``accepted_tokens`` arrive. KV can be committed
    only for slots that exist and for tokens whose ids are known (an accepted draft token
    is known once it is accepted): anything past ``min(allocated, known + accepted)`` is
    refused with ``InvalidOperation``, before the engine is touched.
    """
    n = check_count(num_computed, "num_computed", 0)
    tokens = check_tokens(accepted_tokens)
    limit = min(allocated, known + len(tokens))
    if committed + n > limit:
        raise InvalidOperation(
            f"cannot commit {n} more tokens after {committed}: only {limit} have slots and "
            f"known token ids ({allocated} slots, {known} + {len(tokens)} tokens)"
        )
    return n, tokens


@contextlib.contextmanager
def refusal(
    *errors: type[Exception], what: str = "", as_error: type[PrefixCacheError] = InvalidOperation
) -> Iterator[None]:
    """Turn the engine's own refusal (one of ``errors``) into ``as_error``
    (``InvalidOperation``; ``OutOfBlocks`` for an engine's own "no room" error).

    NOTE: use it only around an engine call that raises before it changes anything (a
    validation the engine does itself); a refusal half way through breaks INV-TXN, and the
    kit will say so.
    """
    try:
        yield
    except PrefixCacheError:
        raise  # already the kit's: an argument check inside the block
    except errors as exc:
        raise as_error(f"{what}{': ' if what else ''}{exc}") from None


def check_flag(value: object, what: str = "preserve_cache") -> bool:
    """A real ``bool`` (``1`` is refused: a typo there would wipe a cache), else
    ``InvalidRequest``."""
    if not isinstance(value, bool):
        raise InvalidRequest(f"{what} must be a bool, got {value!r}")
    return value


def live(table: Mapping[_K, _V], seq_id: object) -> _V:
    """``table[seq_id]`` for a live sequence: ``InvalidRequest`` for a malformed id,
    ``UnknownSequence`` for one that is not live."""
    key = check_seq_id(seq_id)
    try:
        # the table's keys are the engine's ids; an id of another type is simply not there
        return table[cast(_K, key)]
    except KeyError:
        raise UnknownSequence(f"sequence {seq_id!r} is not live") from None


def check_free_batch(seq_ids: object, table: Mapping[_K, object]) -> list[SeqId]:
    """The ids of a batched ``free``, all checked before anything is released: an iterable
    (not one id), no id twice (``DuplicateSequence``), every id live (``UnknownSequence``)."""
    if isinstance(seq_ids, (str, bytes)) or not isinstance(seq_ids, Iterable):
        raise InvalidRequest(f"free takes an iterable of sequence ids, got {seq_ids!r}")
    ids = [check_seq_id(s) for s in seq_ids]
    if len(set(ids)) != len(ids):
        raise DuplicateSequence(f"a sequence is listed twice in {ids!r}")
    for s in ids:
        live(table, s)
    return ids


# -- statistics -----------------------------------------------------------------------------


class AdapterBase(Generic[_R]):
    """The part every adapter of an engine without statistics or KV events shares: the pool
    shape, the :class:`Counters`, ``stats()`` read from the adapter's own ``snapshot()``,
    and no events (declare ``events=False``).

    It also writes the operations whose translation is the same for every engine, over
    ``reqs`` (the engine's requests by live sequence id: the adapter's own table, or the
    engine's if it keeps one):
    ``append`` asks ``can_append`` first, so a refused append changes nothing (set
    ``append_asks_can_append = False`` to call ``extend`` directly, which must then raise
    ``OutOfBlocks`` itself: a ``can_append`` that over-asks is then caught, not hidden);
    ``free``
    checks the whole batch before it releases any of it; ``reset`` frees every live
    sequence when the cache is kept, and is refused while one is live otherwise. The
    subclass supplies the engine calls behind them: ``extend``, ``release`` and
    ``clear_cache``. An operation whose hook the engine lacks is declared missing in the
    capabilities, and the kit never calls it.
    """

    #: ``append`` asks ``can_append`` first (``False``: ``extend`` checks the room itself).
    append_asks_can_append: bool = True

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.counters = Counters()
        self.reqs: dict[SeqId, _R] = {}

    def snapshot(self) -> CacheState:
        raise NotImplementedError("render the engine's state with build_snapshot")

    def stats(self) -> CacheStats:
        """Statistics derived from the snapshot (see :func:`stats_from`)."""
        return self.snapshot().stats

    def take_events(self) -> list[KVEvent]:
        """No KV events: the engine publishes none."""
        return []

    def seq_ids(self) -> tuple[SeqId, ...]:
        """The live sequences, in the order of ``reqs``."""
        return tuple(self.reqs)

    def can_append(self, seq_id: SeqId, num_tokens: int) -> bool:
        raise NotImplementedError("ask the engine whether num_tokens more slots fit")

    def extend(self, seq_id: SeqId, num_tokens: int) -> list[int]:
        """Hook: give the live ``seq_id`` ``num_tokens`` more slots (they fit); return the
        ids of the blocks it added."""
        raise NotImplementedError("call the engine's allocation for more slots")

    def append(self, seq_id: SeqId, num_tokens: int) -> list[int]:
        """``can_append`` checks the arguments and the room; only then is the engine
        called, so ``OutOfBlocks`` leaves everything as it was. Without
        ``append_asks_can_append`` the arguments are checked and ``extend`` is called."""
        if not self.append_asks_can_append:
            live(self.reqs, seq_id)
            return self.extend(seq_id, check_count(num_tokens, "num_tokens"))
        if not self.can_append(seq_id, num_tokens):
            raise OutOfBlocks(f"no room for {num_tokens} more tokens of {seq_id!r}")
        return self.extend(seq_id, num_tokens)

    def release(self, seq_id: SeqId) -> None:
        """Hook: release the live ``seq_id`` and its blocks."""
        raise NotImplementedError("call the engine's free")

    def free(self, seq_ids: Iterable[SeqId]) -> None:
        """Every id is checked (:func:`check_free_batch`) before any is released."""
        for s in check_free_batch(seq_ids, self.reqs):
            self.release(s)

    def clear_cache(self) -> bool:
        """Hook: drop every cached block, no sequence being live; ``False`` if the engine
        refused."""
        raise NotImplementedError("call the engine's cache reset")

    def reset(self, *, preserve_cache: bool) -> None:
        """``preserve_cache=True`` frees every live sequence and keeps what is cached; a
        full reset is refused with ``CacheBusy`` while a sequence is live."""
        if check_flag(preserve_cache):
            self.free(list(self.reqs))
        elif self.reqs or not self.clear_cache():
            raise CacheBusy("a full reset while sequences are live")


@attrs.define
class SeqBook:
    """Per-sequence bookkeeping for an engine that keeps less than a
    :class:`~prefixkv.spec.SeqView` needs: the known tokens, the slots reserved, the
    tokens computed and the tokens hit at admission. Keep one per live sequence (as the
    adapter's ``reqs`` when the engine keeps no request of its own: :meth:`admitted`,
    :meth:`committed`), or build one from the engine's fields, and render it with
    :meth:`view`.
    """

    namespace: bytes
    tokens: list[int]
    prompt: int
    reserved: int = 0
    computed: int = 0
    hit: int = 0

    @classmethod
    def admitted(cls, req: Request, hit: int, reserved: int) -> SeqBook:
        """A sequence admitted with ``hit`` tokens from the cache and ``reserved`` slots."""
        toks = list(req.token_ids)
        return cls(req.namespace.key(), toks, len(toks), reserved, hit, hit)

    def committed(self, num_computed: int, accepted: Iterable[int] = ()) -> None:
        """``num_computed`` more tokens written; ``accepted`` tokens are now known."""
        self.tokens += list(accepted)
        self.computed += num_computed

    def view(self, seq_id: SeqId, block_ids: Sequence[int]) -> SeqView:
        """The :class:`~prefixkv.spec.SeqView` of this sequence holding ``block_ids``."""
        return SeqView(
            seq_id, self.namespace, tuple(self.tokens), tuple(block_ids), self.computed,
            self.reserved, self.prompt, self.hit,
        )  # fmt: skip


class BlockMemo:
    """Builds an engine's :class:`Block` objects, and hands back the same object while the
    engine block is unchanged, so :func:`build_snapshot` compares it by identity.

    NOTE: plain ints only for the id and the refcount (``True == 1`` must not hand a
    refcount of ``True`` the block of a refcount of 1); a field that does not hash (a list
    the engine may change) is built every time.
    """

    def __init__(self) -> None:
        self._blocks: dict[tuple[object, ...], Block] = {}

    def __call__(
        self,
        block_id: int,
        refcount: int,
        block_hash: int | None = None,
        parent_hash: int | None = None,
        token_ids: tuple[int, ...] = (),
        namespace: bytes = b"",
    ) -> Block:
        """``Block(block_id, refcount, block_hash, parent_hash, token_ids, namespace)``.

        Args:
            block_id: the block.
            refcount: the block tables holding it.
            block_hash: what the engine indexes it by (``None``: not published).
            parent_hash: the chained hash of the block before it.
            token_ids: its tokens.
            namespace: its namespace.

        Returns:
            The block, the same object as last time for the same values.
        """
        key = (block_id, refcount, block_hash, parent_hash, token_ids, namespace)
        return _memoised(
            self._blocks,
            key,
            type(block_id) is int and type(refcount) is int,
            lambda: Block(block_id, refcount, block_hash, parent_hash, token_ids, namespace),
        )


#: ``(block id, refcount, hash, tokens, identity, parent identity)`` of a :class:`Block`.
_BlockKey = tuple[int, int, int | None, tuple[int, ...], Hashable | None, Hashable | None]


class Lineage:
    """Parent and identity recording at publication, for an engine that keeps neither.

    Call :meth:`published` when the engine makes a block findable, with the block before it
    in its sequence (``None`` for a first block), and :meth:`unpublished` when it leaves;
    :meth:`identity` and :meth:`parent_identity` then fill a :class:`Block`. A block's
    identity is its namespace and tokens under its parent's identity, so copies of one
    prefix share it (what ``duplicates="shared"`` and ``"last-wins"`` compare).
    """

    def __init__(self) -> None:
        self._ident: dict[int, Hashable] = {}
        self._parent: dict[int, Hashable | None] = {}
        self._seen: dict[int, Hashable] = {}
        self._blocks: dict[_BlockKey, Block] = {}

    def observe(
        self,
        block_id: int,
        parent: int | None,
        namespace: bytes,
        token_ids: Sequence[int],
        key: Hashable,
    ) -> None:
        """Record ``block_id`` as :meth:`published`, unless it was already recorded under
        the same ``key`` (the engine's hash of it): for an adapter that reads publication off
        the engine's state in ``snapshot()``, walking each live block table in order, so a
        parent is seen before its child.

        NOTE: a block evicted and published again with another key is recorded again; one
        published again with the same key has the same identity, so its record stands.

        Args:
            block_id: a published block.
            parent: the block before it in the table of the sequence that holds it.
            namespace: its namespace.
            token_ids: its tokens.
            key: what the engine indexes it by.
        """
        if self._seen.get(block_id, self) != key:
            self._seen[block_id] = key
            self.published(block_id, parent, namespace, token_ids)

    def published(
        self, block_id: int, parent: int | None, namespace: bytes, token_ids: Sequence[int]
    ) -> Hashable:
        """Record ``block_id`` published under ``parent``; returns its identity."""
        up = None if parent is None else self._ident.get(parent, ("lost", parent))
        ident = (up, namespace, tuple(token_ids))
        self._ident[block_id], self._parent[block_id] = ident, up
        return ident

    def unpublished(self, block_id: int) -> None:
        """``block_id`` left (evicted, reused, withdrawn)."""
        self._ident.pop(block_id, None)
        self._parent.pop(block_id, None)

    def identity(self, block_id: int) -> Hashable | None:
        return self._ident.get(block_id)

    def parent_identity(self, block_id: int) -> Hashable | None:
        return self._parent.get(block_id)

    def namespace(self, block_id: int) -> bytes:
        """The namespace ``block_id`` was published in (``b""`` if it is not recorded)."""
        ident = self._ident.get(block_id)
        return ident[1] if isinstance(ident, tuple) else b""

    def block(
        self, block_id: int, refcount: int, block_hash: int | None, token_ids: Sequence[int]
    ) -> Block:
        """The :class:`Block` of an engine block, with the namespace, identity and parent
        identity recorded for it (``block_hash`` ``None``: it is not published).

        NOTE: the block of an unchanged engine block is the same object from one snapshot to
        the next, so :func:`build_snapshot` compares it by identity; plain ints only (``True
        == 1`` must not hand a refcount of ``True`` the block of a refcount of 1).

        Args:
            block_id: the block.
            refcount: the block tables holding it.
            block_hash: what the engine indexes it by, or ``None``.
            token_ids: its tokens.

        Returns:
            The block, as :func:`build_snapshot` reads it.
        """
        ident, up = self._ident.get(block_id), self._parent.get(block_id)
        key: _BlockKey = (block_id, refcount, block_hash, tuple(token_ids), ident, up)
        exact = type(block_id) is int and type(refcount) is int
        return _memoised(self._blocks, key, exact, lambda: self._new_block(key))

    def _new_block(self, key: _BlockKey) -> Block:
        block_id, refcount, block_hash, tokens, ident, up = key
        ns = ident[1] if isinstance(ident, tuple) else b""
        return Block(
            block_id, refcount, block_hash, None, tokens, ns, identity=ident, parent_identity=up
        )


@attrs.define
class Counters:
    """The token and event counters an adapter keeps for an engine without statistics.

    Call :meth:`admitted` after each admission and :meth:`evicted_among` / :attr:`published` as
    the engine reports them; :func:`stats_from` adds the occupancy.
    """

    queries: int = 0
    hits: int = 0
    admissions: int = 0
    evictions: int = 0
    published: int = 0

    def evicted_among(self, cached_before: Collection[int], taken: Iterable[int]) -> int:
        """For an engine that counts no evictions: the blocks an allocation ``taken`` that
        were cached before it (``cached_before``) were evicted. Adds them to ``evictions``.

        Args:
            cached_before: the ids of the blocks published before the allocation.
            taken: the ids of the blocks it handed out.

        Returns:
            The number of blocks evicted (an ``Admission``'s ``num_evicted``).
        """
        n = sum(1 for b in taken if b in cached_before)
        self.evictions += n
        return n

    def admitted(self, num_prompt_tokens: int, num_cached_tokens: int) -> None:
        self.queries += num_prompt_tokens
        self.hits += num_cached_tokens
        self.admissions += 1


def stats_from(
    blocks: Sequence[BlockView],
    num_free: int,
    num_sequences: int,
    counters: Counters,
    *,
    block_size: int,
) -> CacheStats:
    """:class:`~prefixkv.spec.CacheStats` derived from the block views and ``counters``.

    Every uncached prompt token is reported as never cached: an engine that does not split
    lost reuse by cause declares ``lost_reuse=False``.
    """
    cached = sum(1 for b in blocks if b.published and b.refcount == 0)
    used = sum(1 for b in blocks if b.refcount > 0)
    c = counters
    return CacheStats(
        num_blocks=len(blocks),
        block_size=block_size,
        num_free_blocks=num_free,
        num_cached_blocks=cached,
        num_used_blocks=used,
        num_published_blocks=sum(1 for b in blocks if b.published),
        num_sequences=num_sequences,
        queries=c.queries,
        hits=c.hits,
        prefill_tokens=c.queries,
        prefill_tokens_computed=c.queries - c.hits,
        prefill_tokens_skipped=c.hits,
        admissions=c.admissions,
        evictions=c.evictions,
        blocks_published=c.published,
        lost_never_cached=c.queries - c.hits,
    )


# -- snapshots ------------------------------------------------------------------------------


@attrs.frozen
class Block:
    """One engine block as an adapter reads it.

    ``block_hash`` is set iff the block is findable (published). ``token_ids`` and
    ``namespace`` are the stored identity the engine verifies a hit against (or the
    request's, if it verifies nothing).

    The builder finds the parent by the key the engine looks the parent up by:

    * ``parent_hash``, the chained hash of the block before it (``None`` for a first
      block), for an engine that finds a block by its hash alone;
    * ``identity`` and ``parent_identity``, for an engine that keeps each block's full
      identity and verifies a hit against it (``parent_identity`` is ``None`` for a first
      block). Then a colliding hash cannot name the wrong parent. Set both on every
      published block or on none.

    ``depth`` is derived from the parents when ``None``; give it when the engine knows it,
    so a block whose parent was evicted keeps its true depth.
    """

    block_id: int
    refcount: int
    block_hash: int | None = None
    parent_hash: int | None = None
    token_ids: tuple[int, ...] = ()
    namespace: bytes = b""
    extra_keys: tuple[tuple[int, bytes], ...] = ()
    last_use: int = 0
    identity: Hashable | None = None
    parent_identity: Hashable | None = None
    depth: int | None = None

    @property
    def key(self) -> Hashable | None:
        """What a lookup of this block goes by: its identity, else its hash."""
        return self.identity if self.identity is not None else self.block_hash

    @property
    def parent_key(self) -> Hashable | None:
        """What a lookup of its parent goes by (``None`` for a first block)."""
        return self.parent_identity if self.identity is not None else self.parent_hash


#: ``(block, parent, depth)`` (or ``(block id, refcount)`` of an unpublished block) -> its
#: view. An engine's blocks mostly stay as they were from one operation to the next, so most
#: views of a snapshot are the last one's: built once, and compared by identity when the
#: oracle compares two snapshots (a tuple compares its equal-by-identity items at once).
_VIEWS: dict[tuple[object, ...], BlockView] = {}
_MAX_VIEWS = 50_000


def _view(blk: Block, key: tuple[object, ...]) -> BlockView:
    """The view of ``blk`` (``key``: its parent and depth, for a published block)."""
    if blk.block_hash is None:
        return BlockView(blk.block_id, blk.refcount, False)
    return BlockView(
        blk.block_id,
        blk.refcount,
        True,
        blk.namespace,
        key[1],  # type: ignore[arg-type]
        tuple(blk.token_ids),
        tuple(blk.extra_keys),
        blk.block_hash,
        key[2],  # type: ignore[arg-type]
        blk.last_use,
    )


def _memoised(memo: dict[_K, _V], key: _K, exact: bool, build: Callable[[], _V]) -> _V:
    """``memo[key]``, built by ``build`` the first time: the same object while the values
    in ``key`` stay the same. At most :data:`_MAX_VIEWS` entries (past it, ``memo`` starts
    afresh).

    NOTE: only keys of plain ints for ids and counts are memoised (``exact``): ``True == 1``
    would hand a block whose refcount is ``True`` the object built for a refcount of ``1``,
    and the checks would then see another value than the adapter gave. A key that does not
    hash (a list among the fields, which the engine may change) is built every time.
    """
    if not exact:
        return build()
    try:
        found = memo.get(key)
    except TypeError:
        return build()
    if found is None:
        if len(memo) > _MAX_VIEWS:
            memo.clear()
        found = memo[key] = build()
    return found


def build_snapshot(
    blocks: Sequence[Block],
    sequences: Iterable[SeqView],
    free_queue: Iterable[int],
    counters: Counters,
    *,
    block_size: int,
    index: Iterable[tuple[int, int]] | None = None,
    stats: CacheStats | None = None,
    cached_in_free_queue: bool = True,
) -> CacheState:
    """A :class:`~prefixkv.spec.CacheState` for a hash-chained cache.

    * A block's parent is the block a lookup of its :attr:`Block.parent_key` returns: the
      first indexed block, in the order ``index`` is given, whose :attr:`Block.key` is that
      key (so give the index in the order the engine's lookup prefers its copies); failing
      that, the published block with that key and the lowest id (a copy a last-wins index
      dropped). Under ``duplicates="shared"`` or ``"last-wins"`` any copy is a right parent:
      the kit compares parents by their full identity. A parent key that no published block
      has (a parent evicted before its child) leaves the parent unknown: the block is
      rendered with the parent id ``-1``, so no match through it can pass INV-MATCH.
    * With ``cached_in_free_queue`` (engines that evict lazily from the free queue),
      ``free_queue`` may hold cached blocks: only the unpublished ones are free; the cached
      ones count as evictable. Without it, ``free_queue`` is rendered as it is, so a
      published block in it is a bug the invariants report (INV-PARTITION).
    * ``index`` defaults to ``(hash, block_id)`` of every published block, by block id. The
      snapshot holds it sorted, so that equal indexes compare equal.

    Fill each :class:`~prefixkv.spec.SeqView`'s ``num_cached_tokens`` (the tokens attached
    from the cache at admission): the kit tells the blocks a sequence hit from the blocks
    it writes by it.
    """
    c = counters
    blocks, seqs, free = tuple(blocks), tuple(sequences), tuple(free_queue)
    entries = None if index is None else tuple(index)
    counts = (c.queries, c.hits, c.admissions, c.evictions, c.published)
    key = (blocks, seqs, free, entries, stats, block_size, cached_in_free_queue, counts)
    last = _LAST_STATE[0]
    if last is not None and last[0] == key:
        return last[1]
    state = _build_snapshot(
        blocks, seqs, free, entries, counters, block_size, stats, cached_in_free_queue
    )
    try:
        hash(key)
    except TypeError:  # a list among the inputs: it could change in place, never reused
        _LAST_STATE[0] = None
    else:
        _LAST_STATE[0] = (key, state)
    return state


#: The inputs of the last snapshot built, and the snapshot (``None``: not reusable).
#: NOTE: an engine mostly answers reads and refusals, which leave its state as it was, so
#: the next snapshot's inputs are the last one's: the last snapshot is handed back, and the
#: oracle compares it to the one before by identity. Inputs are kept only when they are
#: hashable, so nothing in them can change in place (a list the engine goes on filling
#: would make an old snapshot look current); equal inputs give equal snapshots, which every
#: check of the kit reads alike (they compare with ``==``).
_LAST_STATE: list[tuple[tuple[object, ...], CacheState] | None] = [None]


def _build_snapshot(
    blocks: tuple[Block, ...],
    seqs: tuple[SeqView, ...],
    free_queue: tuple[int, ...],
    index: tuple[tuple[int, int], ...] | None,
    counters: Counters,
    block_size: int,
    stats: CacheStats | None,
    cached_in_free_queue: bool,
) -> CacheState:
    """:func:`build_snapshot`, built from its inputs."""
    by_id = {b.block_id: b for b in blocks}
    if index is None:
        entries = [(b.block_hash, b.block_id) for b in blocks if b.block_hash is not None]
    else:
        entries = list(index)
    owner: dict[Hashable, int] = {}  # key -> the copy a lookup returns: the first indexed
    for _, b in entries:
        if b in by_id:  # an entry outside the pool is left for INV-INDEX to report
            owner.setdefault(by_id[b].key, b)
    for blk in sorted(blocks, key=lambda x: x.block_id):
        # A published copy the index no longer lists (last-wins) is still a parent: its
        # children were written after it, and a child may outlive the indexed copy.
        if blk.block_hash is not None:
            owner.setdefault(blk.key, blk.block_id)

    def parent_of(b: Block) -> int | None:
        return None if b.parent_key is None else owner.get(b.parent_key, -1)

    depths: dict[int, int] = {}

    def depth(b: Block) -> int:
        # Walk up to a first block, a known depth or a lost parent; a cycle (a corrupt
        # engine) stops after len(blocks) steps, and the invariants report the rest.
        chain: list[Block] = []
        cur: Block | None = b
        base = 0
        while cur is not None and len(chain) <= len(blocks):
            if cur.block_id in depths:
                base = depths[cur.block_id]
                break
            if cur.depth is not None:
                base = cur.depth
                depths[cur.block_id] = base
                break
            chain.append(cur)
            up = parent_of(cur)
            cur = by_id[up] if up is not None and up >= 0 else None
        for blk in reversed(chain):
            base += 1
            depths[blk.block_id] = base
        return depths.get(b.block_id, base)

    views: list[BlockView] = []
    for blk in sorted(blocks, key=lambda x: x.block_id):
        key: tuple[object, ...]
        if blk.block_hash is None:
            key = (blk.block_id, blk.refcount)
        else:
            key = (blk, parent_of(blk), depth(blk))
        exact = type(blk.block_id) is int and type(blk.refcount) is int
        views.append(_memoised(_VIEWS, key, exact, functools.partial(_view, blk, key)))
    free = tuple(
        q
        for q in free_queue
        # A cached block in a lazily evicting free queue is evictable, not free.
        if not cached_in_free_queue or q not in by_id or by_id[q].block_hash is None
    )
    return CacheState(
        num_blocks=len(views),
        block_size=block_size,
        blocks=tuple(views),
        free_queue=free,
        index=tuple(sorted(entries)),
        sequences=seqs,
        stats=stats
        if stats is not None
        else stats_from(views, len(free), len(seqs), counters, block_size=block_size),
        pending_events=(),
    )


def match_of(req: Request, hit_block_ids: Sequence[int], block_size: int) -> Match:
    """The capacity-free :class:`~prefixkv.spec.Match` of ``req``: the cached blocks its
    prompt starts with, whether or not the rest would fit.

    NOTE: ``match`` must not depend on the room left. For an engine whose lookup is fused
    with its room check, pass the hits of the lookup part alone (or of the allocation run
    with :func:`dry_run` on a pool with room), never ``[]`` for a prompt that does not fit.

    Args:
        req: the request, checked (:func:`check_request`).
        hit_block_ids: the ids of the cached blocks the prompt starts with, in order.
        block_size: tokens per block.

    Returns:
        The match: ``len(hit_block_ids) * block_size`` cached tokens.
    """
    return Match(req.num_tokens, len(hit_block_ids) * block_size, tuple(hit_block_ids))


# -- dry runs -------------------------------------------------------------------------------


def dry_run(manager: _T, operation: Callable[[_T], _U]) -> _U:
    """Run ``operation`` on a deep copy of ``manager`` first; only if it succeeds, run it on
    ``manager`` and return its result. A failure raises from the copy and leaves
    ``manager`` untouched, which makes a non-transactional engine call transactional.

    Several objects (the engine and its request object) are one tuple: ``dry_run((engine,
    req), lambda pair: pair[0].allocate(pair[1]))`` copies them together, so the copy of
    ``req`` is the one the copied engine refers to.

    Exceptions that are not a :class:`~prefixkv.spec.PrefixCacheError` are left for the
    adapter to translate. The copy costs O(state): a testing tool, never a serving path.
    Run :func:`check_deepcopy` once on a populated manager to be sure the copy is faithful.
    """
    operation(copy.deepcopy(manager))
    return operation(manager)


def _fields(obj: object) -> dict[str, object]:
    out: dict[str, object] = dict(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                out[name] = getattr(obj, name)
    return out


def check_deepcopy(manager: object) -> list[str]:
    """The fields a deep copy of ``manager`` gets wrong (empty when it is faithful).

    Walks attributes (``__dict__`` and ``__slots__``), lists, tuples, dicts and deques, and
    compares plain values with ``==``. A field that the copy shares with the original (a
    mutable object that survived the copy by reference, e.g. through a custom
    ``__deepcopy__``) or that differs is reported with its path; so is a
    ``PrefixCacheError`` from copying.
    """
    try:
        twin = copy.deepcopy(manager)
    except PrefixCacheError as exc:  # pragma: no cover - engines rarely raise ours here
        return [f"deepcopy raised {exc!r}"]
    problems: list[str] = []
    seen: set[int] = set()

    def walk(a: object, b: object, path: str) -> None:
        if id(a) in seen:
            return
        if isinstance(a, (int, float, str, bytes, bool, type(None), frozenset)):
            if a != b:
                problems.append(f"{path}: {a!r} became {b!r}")
            return
        seen.add(id(a))
        # Immutable values may be shared by a deep copy (tuples of ints are); mutable
        # containers and objects with fields may not: the dry run would change the original.
        mutable = not isinstance(a, (tuple, frozenset)) and (
            isinstance(a, (list, dict, set, bytearray)) or bool(_fields(a))
        )
        if a is b and (mutable or type(a).__name__ == "deque"):
            problems.append(f"{path} is shared with the copy, not copied")
            return
        if type(a) is not type(b):
            problems.append(f"{path}: {type(a).__name__} became {type(b).__name__}")
            return
        if isinstance(a, Mapping):
            assert isinstance(b, Mapping)
            if list(a) != list(b):
                problems.append(f"{path}: keys differ")
                return
            for k in a:
                walk(a[k], b[k], f"{path}[{k!r}]")
            return
        if isinstance(a, (list, tuple)) or type(a).__name__ == "deque":
            # a list, a tuple or a deque, and b of the same type
            la, lb = list(cast(Iterable[object], a)), list(cast(Iterable[object], b))
            if len(la) != len(lb):
                problems.append(f"{path}: length {len(la)} became {len(lb)}")
                return
            for i, (x, y) in enumerate(zip(la, lb, strict=True)):
                walk(x, y, f"{path}[{i}]")
            return
        if isinstance(a, (set, frozenset)):
            if a != b:
                problems.append(f"{path}: set differs")
            return
        fa, fb = _fields(a), _fields(b)
        if not fa:
            if a != b and type(a).__eq__ is not object.__eq__:
                problems.append(f"{path}: {a!r} became {b!r}")
            return
        if set(fa) != set(fb):
            problems.append(f"{path}: fields {sorted(set(fa) ^ set(fb))} lost in the copy")
        for name in fa:
            if name in fb:
                walk(fa[name], fb[name], f"{path}.{name}")

    walk(manager, twin, type(manager).__name__)
    return problems
