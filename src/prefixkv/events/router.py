"""A KV-aware router: one event-fed index per replica, and the policy that places requests.

A cluster router never sees a replica's cache, only its KV events. It keeps one index per
replica, fed in order by that replica's :class:`~prefixkv.events.transport.EventSubscriber`,
and asks each index how many leading blocks of a request it believes the replica holds.

Two indexes stand behind one small interface, :class:`RouterIndex`:

* :class:`DynamoTreeIndex`: NVIDIA Dynamo's own router index (``dynamo.llm.RadixTree``), fed
  through :mod:`prefixkv.events.dynamo`; used when ``ai-dynamo-runtime`` is importable (the
  ``prefixkv[router]`` extra);
* :class:`MirrorIndex`: prefixkv's consumer-side mirror
  (:class:`~prefixkv.spec.event_mirror.EventMirror`), identity verified block by block.

Two policies place a request:

* ``kv`` (:class:`KVRouter`): the replica with the longest predicted prefix; ties go to the
  replica with the fewest unfinished requests, then to the lowest replica number;
* ``round-robin`` (:class:`RoundRobinRouter`): the baseline, blind to the cache. It still
  records the chosen replica's predicted prefix, so router accuracy is checked for both.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Protocol

import attrs

from prefixkv.spec import KVEvent, Namespace, PrefixCacheError
from prefixkv.spec.event_mirror import EventMirror
from prefixkv.spec.identity import BlockHasher, fast_hash
from prefixkv.spec.multimodal import MultimodalSpan

__all__ = [
    "INDEXES",
    "ROUTERS",
    "DynamoTreeIndex",
    "KVRouter",
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
INDEXES = ("auto", "dynamo", "mirror")


class RouterConfigError(PrefixCacheError, ValueError):
    """A router asked for with an unknown policy or index, or with no replica to route to."""


class RouterIndex(Protocol):
    """What a router knows of one replica's cache, fed by that replica's events in order."""

    kind: str

    def apply(self, events: Sequence[KVEvent]) -> None:
        """Apply one batch of the replica's events, in order."""

    def overlap(
        self, namespace: Namespace, token_ids: Sequence[int], spans: Sequence[MultimodalSpan] = ()
    ) -> int:
        """How many leading full blocks of the request the replica is believed to hold."""

    @property
    def rejected(self) -> int:
        """Events the index refused: each is a point where it lost sync with the replica."""


class MirrorIndex:
    """prefixkv's own consumer: an :class:`EventMirror` and the replicas' block hash."""

    kind = "mirror"

    def __init__(self, hasher: BlockHasher = fast_hash) -> None:
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

    @property
    def rejected(self) -> int:
        return 0


class DynamoTreeIndex:
    """Dynamo's ``RadixTree`` for one replica (worker 0 of its own tree)."""

    kind = "dynamo"

    def __init__(self, block_size: int) -> None:
        from .dynamo import DynamoIndex

        self._index = DynamoIndex()
        self._block_size = block_size

    def apply(self, events: Sequence[KVEvent]) -> None:
        self._index.apply(0, events)

    def overlap(
        self, namespace: Namespace, token_ids: Sequence[int], spans: Sequence[MultimodalSpan] = ()
    ) -> int:
        return self._index.overlaps(namespace, token_ids, self._block_size, spans).get(0, 0)

    @property
    def rejected(self) -> int:
        return self._index.rejected


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # the parent package ``dynamo`` is missing
        return False


def default_index() -> str:
    """``dynamo`` when Dynamo's router index is importable, else ``mirror``."""
    return "dynamo" if _importable("dynamo.llm") else "mirror"


def make_index(kind: str, block_size: int, hasher: BlockHasher = fast_hash) -> RouterIndex:
    """A fresh index of ``kind`` (one of :data:`INDEXES`) for one replica."""
    if kind == "auto":
        kind = default_index()
    if kind == "dynamo":
        if not _importable("dynamo.llm"):
            raise RouterConfigError(
                "the dynamo index needs ai-dynamo-runtime (pip install prefixkv[router])"
            )
        return DynamoTreeIndex(block_size)
    if kind == "mirror":
        return MirrorIndex(hasher)
    raise RouterConfigError(f"unknown router index {kind!r}; expected one of {INDEXES}")


@attrs.frozen
class Placement:
    """Where a request goes, and what the router believed about every replica."""

    replica: int
    predicted_blocks: int
    """The chosen replica's predicted prefix, in blocks."""
    overlaps: tuple[int, ...]


class Router(Protocol):
    name: str

    def place(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        loads: Sequence[int],
        spans: Sequence[MultimodalSpan] = (),
    ) -> Placement: ...


class KVRouter:
    """Longest predicted prefix first; then the least loaded replica; then the lowest number."""

    name = "kv"

    def __init__(self, indexes: Sequence[RouterIndex]) -> None:
        if not indexes:
            raise RouterConfigError("a router needs at least one replica")
        self.indexes = list(indexes)

    def place(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        loads: Sequence[int],
        spans: Sequence[MultimodalSpan] = (),
    ) -> Placement:
        overlaps = tuple(ix.overlap(namespace, token_ids, spans) for ix in self.indexes)
        best = min(range(len(overlaps)), key=lambda r: (-overlaps[r], loads[r], r))
        return Placement(best, overlaps[best], overlaps)


class RoundRobinRouter:
    """The i-th request goes to replica ``i mod N``, whatever the replicas hold."""

    name = "round-robin"

    def __init__(self, indexes: Sequence[RouterIndex]) -> None:
        if not indexes:
            raise RouterConfigError("a router needs at least one replica")
        self.indexes = list(indexes)
        self._next = 0

    def place(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        loads: Sequence[int],
        spans: Sequence[MultimodalSpan] = (),
    ) -> Placement:
        overlaps = tuple(ix.overlap(namespace, token_ids, spans) for ix in self.indexes)
        chosen = self._next % len(self.indexes)
        self._next += 1
        return Placement(chosen, overlaps[chosen], overlaps)


def make_router(name: str, indexes: Sequence[RouterIndex]) -> Router:
    """The policy ``name`` (one of :data:`ROUTERS`) over one index per replica."""
    if name == "kv":
        return KVRouter(indexes)
    if name == "round-robin":
        return RoundRobinRouter(indexes)
    raise RouterConfigError(f"unknown router {name!r}; expected one of {ROUTERS}")
