"""prefixkv's KV events as NVIDIA Dynamo's KV router consumes them.

Dynamo's router index (``dynamo.llm.RadixTree``, from ``ai-dynamo-runtime``) keys each block
twice: by the engine's ``block_hash`` (an opaque, chained sequence hash, used to find the
parent on a store and the block on a removal) and by a ``tokens_hash`` (a hash of the block's
own content, used to walk the tree from the root when it scores a request). A request's
tokens hashes are computed on the router side, with ``compute_block_hash_for_seq``.

The tokens hash is where identity matters. If it covered the tokens alone, two tenants whose
blocks differ only in their salt, or two images behind the same placeholder tokens, would
land on one tree node, and the router would merge them: removals of one tenant's blocks then
remove the other's, later stores find no parent, and overlaps are wrong in both directions.
So both sides compute it from the whole identity a ``BlockStored`` now carries:

* ``cache_namespace`` is the hex of :meth:`Namespace.key` (model, adapter and salt, injective);
* ``lora_name`` is the adapter, as vLLM's events send it;
* each extra key ``(offset, content)`` becomes one multimodal object whose ``mm_hash`` is a
  64-bit digest of the offset and the content (Dynamo's tokens hash covers the ``mm_hash``
  values, not the offsets, so the offset goes into the digest).

Hashes are unsigned 64-bit on Dynamo's side; prefixkv's signed hashes are taken mod 2**64.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from prefixkv.spec import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CheckpointRemoved,
    CheckpointStored,
    KVEvent,
    Namespace,
)
from prefixkv.spec.identity import ExtraKey
from prefixkv.spec.multimodal import MultimodalSpan, block_extra_keys

__all__ = ["DynamoIndex", "router_event", "tokens_hashes", "u64"]

_MASK = (1 << 64) - 1


def u64(h: int) -> int:
    """A prefixkv hash (signed 64-bit) as Dynamo's unsigned block hash."""
    return h & _MASK


def _mm_hash(key: ExtraKey) -> int:
    offset, content = key
    data = offset.to_bytes(8, "big", signed=True) + content
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def tokens_hashes(
    namespace: Namespace,
    token_ids: Sequence[int],
    block_size: int,
    extra_keys: Sequence[tuple[ExtraKey, ...]],
    *,
    identity: bool = True,
    mm_hash: Callable[[ExtraKey], int] | None = None,
) -> list[int]:
    """Dynamo's tokens hash of each full block, from the block's whole identity.

    ``identity=False`` hashes the tokens and the adapter only, as a consumer of events
    without the namespace and the extra keys must: kept to show what that costs.
    ``mm_hash`` turns an extra key into its multimodal object's ``mm_hash``: by default a
    digest of its offset and content; Dynamo's ZMQ consumer reads the one the wire sends
    (:func:`prefixkv.events.wire.mm_hash`, of the content alone).
    """
    to_mm = _mm_hash if mm_hash is None else mm_hash
    from dynamo.llm import compute_block_hash_for_seq

    n = len(token_ids) // block_size
    if n == 0:
        return []
    mm: list[dict[str, Any] | None] | None = None
    if identity and any(extra_keys):
        mm = [
            {"mm_objects": [{"mm_hash": to_mm(k), "offsets": []} for k in keys]} if keys else None
            for keys in extra_keys
        ]
    hashes: list[int] = compute_block_hash_for_seq(
        list(token_ids[: n * block_size]),
        block_size,
        block_mm_infos=mm,
        lora_name=namespace.adapter,
        cache_namespace=namespace.key().hex() if identity else None,
    )
    return hashes


def router_event(event: KVEvent, event_id: int, *, identity: bool = True) -> bytes:
    """One prefixkv event as the JSON ``KvCacheEvent`` that ``RadixTree.apply_event`` takes."""
    data: Any
    if isinstance(event, BlockStored):
        ns = Namespace(event.model, event.adapter, event.salt)
        local = tokens_hashes(
            ns, event.token_ids, event.block_size, event.extra_keys, identity=identity
        )
        parent = event.parent_block_hash
        data = {
            "stored": {
                "parent_hash": None if parent is None else u64(parent),
                "blocks": [
                    {"block_hash": u64(h), "tokens_hash": t}
                    for h, t in zip(event.block_hashes, local, strict=True)
                ],
            }
        }
    elif isinstance(event, BlockRemoved):
        data = {"removed": {"block_hashes": [u64(h) for h in event.block_hashes]}}
    elif isinstance(event, AllBlocksCleared):
        data = "cleared"
    else:
        raise TypeError(f"not a KV event: {event!r}")
    return json.dumps({"event_id": event_id, "data": data}).encode()


class DynamoIndex:
    """A ``dynamo.llm.RadixTree`` fed with prefixkv events from several workers.

    ``rejected`` counts the events the tree refused (a store under an unknown parent, a
    removal of an unknown block): each is a point where the router lost sync. A hybrid
    cache's checkpoint events have no Dynamo counterpart and are skipped (``skipped``).
    """

    def __init__(self, *, identity: bool = True) -> None:
        from dynamo.llm import RadixTree

        self.tree = RadixTree()
        self.identity = identity
        self.rejected = 0
        self.applied = 0
        self.skipped = 0
        self._next_id: dict[int, int] = {}

    def apply(self, worker: int, events: Sequence[KVEvent]) -> None:
        for event in events:
            if isinstance(event, (CheckpointStored, CheckpointRemoved)):
                self.skipped += 1
                continue
            eid = self._next_id.get(worker, 0)
            self._next_id[worker] = eid + 1
            try:
                self.tree.apply_event(worker, router_event(event, eid, identity=self.identity))
            except Exception as exc:
                # The bindings raise a bare Exception ("Failed to apply event: ...") for a
                # rejected event and ValueError for one they cannot decode; both count.
                if "Failed" not in str(exc):
                    raise
                self.rejected += 1
            else:
                self.applied += 1

    def overlaps(
        self,
        namespace: Namespace,
        token_ids: Sequence[int],
        block_size: int,
        spans: Sequence[MultimodalSpan] = (),
    ) -> dict[int, int]:
        """worker -> the number of leading blocks the router believes it holds."""
        n = len(token_ids) // block_size
        extras = [block_extra_keys(spans, j * block_size, block_size) for j in range(n)]
        local = tokens_hashes(namespace, token_ids, block_size, extras, identity=self.identity)
        if not local:
            return {}
        # NOTE: the stubs say ``dict[int, int]``; the bindings key by (worker, dp_rank).
        scores: dict[Any, int] = self.tree.find_matches(local).scores
        return {key[0] if isinstance(key, tuple) else key: n for key, n in scores.items()}
