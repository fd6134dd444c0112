"""INV-EVENTS in the state machines: a consumer's mirror per cache, checked every step.

A snapshot carries only the events still pending. What a router knows is everything drained
so far, so each machine keeps one :class:`~prefixkv.spec.event_mirror.EventMirror` per cache
(the candidate's and the reference's) and feeds it every batch ``take_events`` returns.
After every operation, that mirror with the pending events applied must hold exactly the
published blocks (:func:`prefixkv.spec.invariants.event_violations`).

It runs only when the run records events (``record_events=True``, which an adapter enables
with the ``events`` capability). In exact mode the reference must pass it too (``SPEC:``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from prefixkv.spec import KVEvent
from prefixkv.spec import invariants as inv
from prefixkv.spec.event_mirror import EventMirror, EventStreamError
from prefixkv.spec.invariant_ids import InvariantId
from prefixkv.spec.state import CacheState

from .compare import same_state
from .failures import CheckFailed

__all__ = ["EventStreams"]


class EventStreams:
    """The drained-event mirrors of one machine run."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.mirrors = {"candidate": EventMirror(), "reference": EventMirror()}
        #: who -> the last state INV-EVENTS held on, with the mirror unchanged since.
        self._clean: dict[str, CacheState] = {}

    def after(
        self, name: str, who: str, value: object, raised: bool, snap: CacheState | None
    ) -> None:
        """Check INV-EVENTS on ``who``'s cache after operation ``name`` returned ``value``."""
        if not self.enabled or snap is None:
            return
        prefix = "" if who == "candidate" else "SPEC:"
        mirror = self.mirrors[who]
        if name == "take_events" and not raised:
            self._clean.pop(who, None)
            try:
                # whatever the cache returned: the mirror refuses a bad stream
                mirror.apply_all(cast(Iterable[KVEvent], value))
            except (EventStreamError, TypeError) as exc:
                raise CheckFailed(
                    prefix + InvariantId.EVENTS, f"{who}: take_events returned a bad stream: {exc}"
                ) from None
        # NOTE: INV-EVENTS reads the mirror and the state alone: on the state it last held on,
        # with nothing drained since, it holds again (the lockstep's unchanged-state rule).
        if same_state(self._clean.get(who), snap):
            return
        found = inv.event_violations(mirror, snap)
        if not found:
            self._clean[who] = snap
        else:
            self._clean.pop(who, None)
        if found:
            raise CheckFailed(
                prefix + InvariantId.EVENTS,
                f"after {name}, {who}: " + "; ".join(str(v) for v in found),
            )
