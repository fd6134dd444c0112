"""A KV-aware router: one event-fed index per replica, and the policy that places requests.

A cluster router never sees a replica's cache, only its KV events. It keeps one index per
replica, fed in order by that replica's :class:`~prefixkv.events.transport.EventSubscriber`,
and asks each index how many leading blocks of a request it believes the replica holds.

Three indexes stand behind one small interface, :class:`RouterIndex`:

* :class:`DynamoTreeIndex`: NVIDIA Dynamo's own router index (``dynamo.llm.RadixTree``), fed
  through :mod:`prefixkv.events.dynamo`; used when ``ai-dynamo-runtime`` is importable (the
  ``prefixkv[router]`` extra);
* :class:`DynamoZmqIndex`: Dynamo's own ZMQ consumer (``python -m dynamo.indexer``), which
  decodes the replicas' streams itself (``serve-sim --index dynamo-zmq``);
* :class:`MirrorIndex`: prefixkv's consumer-side mirror
  (:class:`~prefixkv.spec.event_mirror.EventMirror`), identity verified block by block.

A published prefix is not yet a hit. The replica's match policy, which every replica
announces in its hello (:class:`MatchPolicy`), turns it into the tokens a request is served
from cache: at least one prompt token is computed (choice 4), a hit never ends inside a
multimodal span (choice 5), a recompute window is taken back (choice 6), and a hybrid
model's hit ends at the deepest block that carries a restorable checkpoint, which the
replica announces with its checkpoint events. So each index also answers which of a
request's leading blocks carry a checkpoint, and the router predicts the hit in tokens
(:meth:`MatchPolicy.hit_blocks`), exactly as the replica's cache will compute it.

Two policies place a request:

* ``kv`` (:class:`KVRouter`): the replica with the longest predicted hit; ties go to the
  replica with the longest published prefix, then to the one with the fewest unfinished
  requests, then to the lowest replica number;
* ``round-robin`` (:class:`RoundRobinRouter`): the baseline, blind to the cache. It still
  records the chosen replica's predicted hit, so router accuracy is checked for both.

Both place a request only on a live replica (``live``): a fleet drops a replica that died
or stalled (:mod:`prefixkv.events.cluster`), and :meth:`RouterIndex.drop` forgets its blocks.

A replica whose subscriber is ``stale`` (batches were lost beyond the publisher's replay
buffer, :class:`~prefixkv.events.transport.ReplayGap`) is healthy, but its index may be
wrong, and a router never routes on it. Both policies then place by turn: requests go
round the live replicas in order, and when a stale replica's turn comes, it takes the
request whatever the request's prefix (:attr:`Placement.by_turn`), its index not consulted;
on the other turns ``kv`` places by its predictions among the replicas in sync. So a stale
replica keeps its round-robin share of the load, and no prediction rests on its index, until
its subscriber is back in sync (an ``AllBlocksCleared`` from the replica).
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import attrs

from prefixkv.spec import (
    AllBlocksCleared,
    CheckpointRemoved,
    CheckpointStored,
    KVEvent,
    Namespace,
    PrefixCacheError,
)
from prefixkv.spec.contract import full_prompt_cap
from prefixkv.spec.event_mirror import EventMirror
from prefixkv.spec.identity import BlockHasher, event_hash
from prefixkv.spec.multimodal import MultimodalSpan, block_extra_keys, clamp_out_of_spans

__all__ = [
    "INDEXES",
    "ROUTERS",
    "DynamoTreeIndex",
    "DynamoZmqIndex",
    "KVRouter",
    "MatchPolicy",
    "MirrorIndex",
    "Placement",
    "RoundRobinRouter",
    "Router",
    "RouterConfigError",
    "RouterIndex",
    "default_index",
    "make_index",
    "make_router",
]

#: The placement policies ``serve-sim --router`` accepts.
ROUTERS = ("kv", "round-robin")
#: The index kinds: ``auto`` is ``dynamo`` when ``ai-dynamo-runtime`` is importable.
INDEXES = ("auto", "dynamo", "dynamo-zmq", "mirror")


class RouterConfigError(PrefixCacheError, ValueError):
    """A router asked for with an unknown policy or index, or with no replica to route to."""


@attrs.frozen
class MatchPolicy:
    """How a replica's cache turns a published prefix into a hit (choices 4-7).

    What a router must model to predict the tokens a request is served from cache, not
    only the blocks the replica published. A replica announces it in its hello.
    """

    block_size: int
    hybrid: bool = False
    """A hit ends at the deepest matched block that carries a restorable checkpoint."""
    recompute_blocks: int = 0
    """The recompute window (choice 6): matched blocks recomputed privately."""

    def hit_blocks(
        self,
        published: int,
        num_tokens: int,
        spans: Sequence[MultimodalSpan] = (),
        has_checkpoint: Callable[[int], bool] | None = None,
    ) -> int:
        """The blocks a request is served from cache, given its published prefix.

        Args:
            published: leading full blocks of the request the replica holds.
            num_tokens: the request's prompt length.
            spans: its multimodal spans.
            has_checkpoint: for a hybrid model, whether block ``j`` (0-based) of the
                request carries a restorable checkpoint; required when ``hybrid``.

        Returns:
            The number of leading blocks the cache attaches: the walk capped so that one
            prompt token is computed, clamped out of spans, less the recompute window, and
            for a hybrid model cut back to the deepest block with a checkpoint.
        """
        bs = self.block_size
        matched = min(published, full_prompt_cap(num_tokens, bs))  # choice 4
        k1 = clamp_out_of_spans(matched, spans, bs)  # choice 5
        window = min(self.recompute_blocks, k1)  # choice 6
        attached = clamp_out_of_spans(k1 - window, spans, bs)
        if not self.hybrid:
            return attached
        if has_checkpoint is None:
            raise RouterConfigError("a hybrid model's hit needs the checkpoint events")
        c = attached
        # NOTE: the same walk as the hybrid cache's match: a restore needs the state at
        # exactly the boundary where the reused prefix ends.
        while c and not (has_checkpoint(c - 1) and clamp_out_of_spans(c, spans, bs) == c):
            c -= 1
        return c


class RouterIndex(Protocol):
    """What a router knows of one replica's cache, fed by that replica's events in order."""

    kind: str

    def apply(self, events: Sequence[KVEvent]) -> None:
        """Apply one batch of the replica's events, in order."""

    def overlap(
        self, namespace: Namespace, token_ids: Sequence[int], spans: Sequence[MultimodalSpan] = ()
    ) -> int:
        """How many leading full blocks of the request the replica is believed to hold."""

    def checkpoints(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        num_blocks: int,
        spans: Sequence[MultimodalSpan] = (),
    ) -> tuple[bool, ...]:
        """Whether each of the request's first ``num_blocks`` blocks carries a checkpoint."""

    def drop(self) -> int:
        """Forget every block of the replica (it is gone); returns how many it held."""

    @property
    def rejected(self) -> int:
        """Events the index refused: each is a point where it lost sync with the replica."""


def _block_hashes(
    hasher: BlockHasher,
    namespace: Namespace,
    token_ids: Sequence[int],
    num_blocks: int,
    block_size: int,
    spans: Sequence[MultimodalSpan],
) -> list[int]:
    """The hash the replica's events carry for each of the request's first ``num_blocks``
    blocks (prefixkv's :func:`~prefixkv.spec.identity.event_hash`, whatever its index hash)."""
    ns = namespace.key()
    out: list[int] = []
    parent: int | None = None
    for j in range(num_blocks):
        tokens = tuple(token_ids[j * block_size : (j + 1) * block_size])
        parent = hasher(parent, ns, tokens, block_extra_keys(spans, j * block_size, block_size))
        out.append(parent)
    return out


class MirrorIndex:
    """prefixkv's own consumer: an :class:`EventMirror` and the hash the replicas' events
    carry (:func:`~prefixkv.spec.identity.event_hash`)."""

    kind = "mirror"

    def __init__(self, hasher: BlockHasher = event_hash) -> None:
        self.mirror = EventMirror()
        self._hasher = hasher

    def apply(self, events: Sequence[KVEvent]) -> None:
        # NOTE: strict, all or nothing: an event the mirror cannot apply raises
        # EventStreamError, and the subscriber already refused such a batch before this.
        self.mirror.apply_all(events)

    def overlap(
        self, namespace: Namespace, token_ids: Sequence[int], spans: Sequence[MultimodalSpan] = ()
    ) -> int:
        return self.mirror.overlap(self._hasher, namespace, token_ids, spans)

    def checkpoints(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        num_blocks: int,
        spans: Sequence[MultimodalSpan] = (),
    ) -> tuple[bool, ...]:
        bs = self.mirror.block_size
        if bs is None or num_blocks == 0:
            return (False,) * num_blocks
        hashes = _block_hashes(self._hasher, namespace, token_ids, num_blocks, bs, spans)
        return tuple(self.mirror.has_checkpoint(h) for h in hashes)

    def drop(self) -> int:
        held = len(self.mirror)
        self.mirror.apply(AllBlocksCleared())
        return held

    @property
    def rejected(self) -> int:
        return 0


class DynamoTreeIndex:
    """Dynamo's ``RadixTree`` for one replica (worker 0 of its own tree).

    Dynamo's tree has no notion of a checkpoint, so the index keeps the replica's checkpoint
    events beside it: per block hash, how many of its blocks carry one (the same count as
    :attr:`EventMirror.checkpoints`, kept by the same events in the same order).
    """

    kind = "dynamo"

    def __init__(self, block_size: int, hasher: BlockHasher = event_hash) -> None:
        from .dynamo import DynamoIndex

        self._index = DynamoIndex()
        self._block_size = block_size
        self._hasher = hasher
        self._checkpoints: dict[int, int] = {}

    def apply(self, events: Sequence[KVEvent]) -> None:
        self._index.apply(0, events)
        self._count_checkpoints(events)

    def _count_checkpoints(self, events: Sequence[KVEvent]) -> None:
        for event in events:
            if isinstance(event, CheckpointStored):
                for h in event.block_hashes:
                    self._checkpoints[h] = self._checkpoints.get(h, 0) + 1
            elif isinstance(event, CheckpointRemoved):
                for h in event.block_hashes:
                    left = self._checkpoints.get(h, 0) - 1
                    if left > 0:
                        self._checkpoints[h] = left
                    else:
                        self._checkpoints.pop(h, None)
            elif isinstance(event, AllBlocksCleared):
                self._checkpoints.clear()

    def overlap(
        self, namespace: Namespace, token_ids: Sequence[int], spans: Sequence[MultimodalSpan] = ()
    ) -> int:
        return self._index.overlaps(namespace, token_ids, self._block_size, spans).get(0, 0)

    def checkpoints(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        num_blocks: int,
        spans: Sequence[MultimodalSpan] = (),
    ) -> tuple[bool, ...]:
        if not self._checkpoints or num_blocks == 0:
            return (False,) * num_blocks
        hashes = _block_hashes(
            self._hasher, namespace, token_ids, num_blocks, self._block_size, spans
        )
        return tuple(self._checkpoints.get(h, 0) > 0 for h in hashes)

    def drop(self) -> int:
        """Dynamo's own ``remove_worker``: the tree forgets every block of the replica."""
        import json

        held = sum(
            len(json.loads(e)["event"]["data"]["stored"]["blocks"])
            for e in self._index.tree.dump_tree_as_events()
        )
        self._index.tree.remove_worker(0)
        self._checkpoints.clear()
        return held

    @property
    def rejected(self) -> int:
        return self._index.rejected


class DynamoZmqIndex(DynamoTreeIndex):
    """Dynamo's own ZMQ consumer (``python -m dynamo.indexer``) for one replica.

    The replica is worker ``worker`` of a :class:`~prefixkv.events.dynamo_zmq.DynamoIndexer`
    that the whole cluster shares, and which subscribes to the replica's stream (PUB and
    replay) itself: nothing of prefixkv sits between the bytes and Dynamo's tree.
    :meth:`apply` sees the same batches only to keep the checkpoints beside it, which
    Dynamo has no notion of. Dynamo applies events asynchronously, so a router first waits
    until :meth:`held` equals the blocks the replica published (:meth:`settle`).

    Args:
        indexer: the shared indexer.
        worker: the replica's worker id there.
        block_size: tokens per block.
        hasher: the hash the replicas' events carry (for the checkpoints' hashes).
    """

    kind = "dynamo-zmq"

    def __init__(
        self, indexer: Any, worker: int, block_size: int, hasher: BlockHasher = event_hash
    ) -> None:
        self._indexer = indexer
        self._worker = worker
        self._block_size = block_size
        self._hasher = hasher
        self._checkpoints: dict[int, int] = {}

    def apply(self, events: Sequence[KVEvent]) -> None:
        self._count_checkpoints(events)

    def overlap(
        self, namespace: Namespace, token_ids: Sequence[int], spans: Sequence[MultimodalSpan] = ()
    ) -> int:
        overlaps: dict[int, int] = self._indexer.overlaps(namespace, token_ids, spans)
        return overlaps.get(self._worker, 0)

    def held(self) -> set[int]:
        """The block hashes Dynamo's tree holds for the replica (unsigned 64-bit).

        Returns:
            The set, from the indexer's ``/dump``.
        """
        held: set[int] = self._indexer.held_blocks(self._worker)
        return held

    def settle(self, published: Iterable[int], timeout_s: float) -> bool:
        """Wait until Dynamo's tree holds exactly the replica's published blocks.

        Args:
            published: the hashes the replica published (the subscriber's mirror).
            timeout_s: how long to wait.

        Returns:
            Whether it did within ``timeout_s`` (if not, the router goes on with what Dynamo
            holds, and its mispredictions are counted).
        """
        want = {h & _U64 for h in published}
        deadline = time.monotonic() + timeout_s
        while self.held() != want:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def drop(self) -> int:
        """Dynamo's own ``/unregister``: the worker's blocks leave the tree."""
        held = len(self.held())
        self._indexer.unregister(self._worker)
        self._checkpoints.clear()
        return held

    @property
    def rejected(self) -> int:
        # NOTE: Dynamo's decode failures are the indexer's, counted once for the cluster.
        return 0


_U64 = (1 << 64) - 1


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # the parent package ``dynamo`` is missing
        return False


def default_index() -> str:
    """``dynamo`` when Dynamo's router index is importable, else ``mirror``."""
    return "dynamo" if _importable("dynamo.llm") else "mirror"


def make_index(kind: str, block_size: int, hasher: BlockHasher = event_hash) -> RouterIndex:
    """A fresh index of ``kind`` (one of :data:`INDEXES`) for one replica."""
    if kind == "auto":
        kind = default_index()
    if kind == "dynamo":
        if not _importable("dynamo.llm"):
            raise RouterConfigError(
                "the dynamo index needs ai-dynamo-runtime (pip install prefixkv[router])"
            )
        return DynamoTreeIndex(block_size, hasher)
    if kind == "mirror":
        return MirrorIndex(hasher)
    if kind == "dynamo-zmq":
        raise RouterConfigError(
            "the dynamo-zmq index subscribes to the replicas itself: run_cluster builds it"
        )
    raise RouterConfigError(f"unknown router index {kind!r}; expected one of {INDEXES}")


@attrs.frozen
class Placement:
    """Where a request goes, and what the router believed about every replica."""

    replica: int
    predicted_blocks: int
    """The chosen replica's published prefix, in blocks, as its index believes it."""
    predicted_tokens: int
    """The tokens the chosen replica is predicted to serve from cache (its match policy)."""
    overlaps: tuple[int, ...]
    """Every replica's published prefix, in blocks (0 for a dropped replica)."""
    hits: tuple[int, ...]
    """Every replica's predicted hit, in tokens (0 for a dropped replica)."""
    by_turn: bool = False
    """Placed on a stale replica by round-robin turn: no prediction was made (its index
    was not consulted, and ``predicted_*`` are 0)."""


class Router(Protocol):
    name: str

    def place(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        loads: Sequence[int],
        spans: Sequence[MultimodalSpan] = (),
        *,
        live: Sequence[bool] | None = None,
        stale: Sequence[bool] | None = None,
    ) -> Placement: ...


class _Predicting:
    """What both policies share: one index per replica, the replicas' match policy, and the
    prediction for every live replica."""

    def __init__(self, indexes: Sequence[RouterIndex], policy: MatchPolicy) -> None:
        if not indexes:
            raise RouterConfigError("a router needs at least one replica")
        self.indexes = list(indexes)
        self.policy = policy
        self._next = 0

    def _live(self, live: Sequence[bool] | None) -> list[int]:
        alive = [r for r in range(len(self.indexes)) if live is None or live[r]]
        if not alive:
            raise RouterConfigError("no live replica to route to")
        return alive

    def _turn(self, alive: Sequence[int]) -> int:
        """The next live replica in round-robin order (and the turn moves past it)."""
        n = len(self.indexes)
        chosen = next(r % n for r in range(self._next, self._next + n) if r % n in alive)
        self._next = chosen + 1
        return chosen

    @staticmethod
    def _in_sync(alive: Sequence[int], stale: Sequence[bool] | None) -> list[int]:
        """The live replicas whose index may be routed on."""
        return [r for r in alive if stale is None or not stale[r]]

    def _predict(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        spans: Sequence[MultimodalSpan],
        alive: Sequence[int],
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        overlaps = [0] * len(self.indexes)
        hits = [0] * len(self.indexes)
        for r in alive:
            ix = self.indexes[r]
            overlaps[r] = n = ix.overlap(namespace, token_ids, spans)
            marks: tuple[bool, ...] = ()
            if self.policy.hybrid and n:
                marks = ix.checkpoints(namespace, token_ids, n, spans)
            blocks = self.policy.hit_blocks(
                n, len(token_ids), spans, marks.__getitem__ if self.policy.hybrid else None
            )
            hits[r] = blocks * self.policy.block_size
        return tuple(overlaps), tuple(hits)


class KVRouter(_Predicting):
    """Longest predicted hit first; then the longest published prefix; then the least
    loaded replica; then the lowest number."""

    name = "kv"

    def place(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        loads: Sequence[int],
        spans: Sequence[MultimodalSpan] = (),
        *,
        live: Sequence[bool] | None = None,
        stale: Sequence[bool] | None = None,
    ) -> Placement:
        """Place one request.

        Args:
            namespace: the request's namespace.
            token_ids: its whole prompt.
            loads: unfinished requests per replica.
            spans: its multimodal spans.
            live: which replicas may take it (default: all).
            stale: which replicas' indexes must not be routed on (default: none).

        Returns:
            The chosen replica and every predicted replica's predictions (0 for a stale
            one).
        """
        alive = self._live(live)
        fresh = self._in_sync(alive, stale)
        if len(fresh) < len(alive):
            # NOTE: a stale replica is placed on by turn, never by its index: its turn
            # comes once in len(alive) placements, as under round-robin.
            turn = self._turn(alive)
            if turn not in fresh:
                overlaps, hits = self._predict(namespace, token_ids, spans, fresh)
                return Placement(turn, 0, 0, overlaps, hits, by_turn=True)
        overlaps, hits = self._predict(namespace, token_ids, spans, fresh)
        best = min(fresh, key=lambda r: (-hits[r], -overlaps[r], loads[r], r))
        return Placement(best, overlaps[best], hits[best], overlaps, hits)


class RoundRobinRouter(_Predicting):
    """The i-th request goes to the next live replica in turn, whatever the replicas hold."""

    name = "round-robin"

    def place(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        loads: Sequence[int],
        spans: Sequence[MultimodalSpan] = (),
        *,
        live: Sequence[bool] | None = None,
        stale: Sequence[bool] | None = None,
    ) -> Placement:
        """Place one request (the arguments and the result are :meth:`KVRouter.place`'s)."""
        alive = self._live(live)
        fresh = self._in_sync(alive, stale)
        overlaps, hits = self._predict(namespace, token_ids, spans, fresh)
        chosen = self._turn(alive)
        if chosen not in fresh:
            return Placement(chosen, 0, 0, overlaps, hits, by_turn=True)
        return Placement(chosen, overlaps[chosen], hits[chosen], overlaps, hits)


def make_router(name: str, indexes: Sequence[RouterIndex], policy: MatchPolicy) -> Router:
    """A placement policy over one index per replica.

    Args:
        name: one of :data:`ROUTERS`.
        indexes: one index per replica, in replica order.
        policy: the match policy the replicas announced in their hello.

    Returns:
        The router.
    """
    if name == "kv":
        return KVRouter(indexes, policy)
    if name == "round-robin":
        return RoundRobinRouter(indexes, policy)
    raise RouterConfigError(f"unknown router {name!r}; expected one of {ROUTERS}")
