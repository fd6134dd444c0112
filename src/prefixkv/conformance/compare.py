"""Comparing two snapshots as the oracle's checks read them.

KV events are ``NamedTuple`` classes, so two events of different kinds with the same fields
compare equal as tuples; :func:`normal` tells them apart. :func:`same_state` says whether two
snapshots are the same for every check (the oracle re-checks no state twice).
"""

from __future__ import annotations

from prefixkv.spec import CacheState

__all__ = ["normal", "normal_events", "same_state"]


def same_state(a: CacheState | None, b: CacheState) -> bool:
    """Equal snapshots, pending KV events compared by type as well as fields: every check
    of the oracle reads two such states alike."""
    return a is b or (
        a is not None
        and a == b
        and normal_events(a.pending_events) == normal_events(b.pending_events)
    )


#: id(event) -> (the event, its :func:`normal` form). A cache keeps its pending events from
#: snapshot to snapshot, so each is normalised once; the entry holds the event itself, so
#: its id is not reused while it is cached. Only hashable events are cached: one holding a
#: list could change after it was normalised.
_NORMAL_EVENTS: dict[int, tuple[object, object]] = {}


def normal_events(events: tuple[object, ...]) -> tuple[object, ...]:
    """``normal(events)``, each event normalised once (see :data:`_NORMAL_EVENTS`)."""
    if not events:
        return ()
    if len(_NORMAL_EVENTS) > 50_000:
        _NORMAL_EVENTS.clear()
    out = []
    for e in events:
        hit = _NORMAL_EVENTS.get(id(e))
        if hit is None or hit[0] is not e:
            try:
                hash(e)
            except TypeError:
                out.append(normal(e))
                continue
            hit = _NORMAL_EVENTS[id(e)] = (e, normal(e))
        out.append(hit[1])
    return tuple(out)


def normal(value: object) -> object:
    """Compare lists as tuples and KV events by type as well as fields."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple event
        return (type(value).__name__, *(normal(v) for v in value))
    if isinstance(value, (list, tuple)):
        return tuple(normal(v) for v in value)
    return value
