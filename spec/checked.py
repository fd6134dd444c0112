"""A runtime invariant checker that wraps any cache: for engine CI, opt in.

::

    from prefixkv.spec.checked import checked

    cache = checked(MyBlockManagerAdapter(...))   # a no-op unless PREFIXKV_CHECK_INVARIANTS=1

With checking on, every call on the wrapper goes to the wrapped cache and is then checked
against its snapshot (:meth:`~prefixkv.spec.protocol.Inspectable.snapshot`):

* every invariant of :func:`prefixkv.spec.invariants.check`, after every call;
* INV-TXN: a call that raised a :class:`~prefixkv.spec.errors.PrefixCacheError` left the
  snapshot exactly as it was, statistics and pending events included;
* a query (``match``, ``can_*``, ``block_table``, ...) changed nothing;
* INV-MATCH on every ``match`` result and on the hit part of every admission, against the
  state it was computed on;
* INV-EVENTS, when the cache records events (``record_events`` is true): the wrapper keeps
  a consumer's :class:`~prefixkv.spec.event_mirror.EventMirror` of every batch that
  ``take_events`` returned, and after every call that mirror, with the pending events
  applied, must hold exactly the published blocks. Drain events through the wrapper, or
  the mirror misses them.

A violation raises :class:`~prefixkv.spec.invariants.InvariantViolation` (an
``AssertionError``) naming the invariant. Each check renders two snapshots and walks them,
O(pool) per call: this is for tests and CI, not for serving.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .errors import PrefixCacheError
from .event_mirror import EventMirror, EventStreamError
from .invariant_ids import InvariantId
from .invariants import InvariantViolation, Violation, check, check_events, check_match
from .protocol import Inspectable
from .request import Request
from .results import Admission, Match
from .state import CacheState

__all__ = ["ENV_VAR", "CheckedCache", "checked", "checking_enabled"]

#: Set to ``1`` (or ``true``, ``yes``, ``on``) to make :func:`checked` wrap its cache.
ENV_VAR = "PREFIXKV_CHECK_INVARIANTS"

#: Calls that must not change the snapshot.
_QUERIES = frozenset(
    {
        "match",
        "can_admit",
        "can_append",
        "can_continue_prefill",
        "block_table",
        "num_computed_tokens",
        "seq_ids",
        "stats",
        # hybrid caches (HybridPrefixCache)
        "state_slot",
        "pending_restore",
        "checkpoint_reservation",
        "runtime_state",
    }
)
#: Calls that may change the snapshot when they succeed.
_UPDATES = frozenset(
    {"admit", "continue_prefill", "append", "commit", "rollback", "free", "evict", "reset",
     "take_events", "restore_issued", "keep_state", "advance", "advance_batch",
     "advance_columns"}
)  # fmt: skip


def checking_enabled() -> bool:
    """Whether :data:`ENV_VAR` asks for runtime checking."""
    return os.environ.get(ENV_VAR, "").strip().lower() in {"1", "true", "yes", "on"}


class CheckedCache:
    """Forwards every call to ``cache`` and checks the invariants after it (see module doc).

    Attributes that are not cache operations (``num_blocks``, ``snapshot``, engine-specific
    extras) are passed through unchecked. ``num_checks`` counts the checked calls.
    """

    def __init__(self, cache: Any) -> None:
        if not isinstance(cache, Inspectable):
            raise TypeError(
                f"{type(cache).__name__} has no snapshot(): the runtime checker needs one "
                "(see prefixkv.spec.state.CacheState)"
            )
        self._cache = cache
        self.num_checks = 0
        #: The consumer's mirror of the drained events; ``None`` when events are off.
        self.mirror: EventMirror | None = (
            EventMirror() if getattr(cache, "record_events", False) is True else None
        )
        snap = cache.snapshot()
        check(snap)
        if self.mirror is not None:
            check_events(self.mirror, snap)

    @property
    def wrapped(self) -> Any:
        """The cache being checked."""
        return self._cache

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._cache, name)
        if name in _QUERIES or name in _UPDATES:
            return self._checked(name, attr)
        return attr

    def __repr__(self) -> str:
        return f"CheckedCache({self._cache!r})"

    def _checked(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            before: CacheState = self._cache.snapshot()
            try:
                result = fn(*args, **kwargs)
            except PrefixCacheError:
                self._after(name, before, changed_ok=False)
                raise
            if name == "take_events" and self.mirror is not None:
                # The drained batch reaches the consumer; INV-EVENTS below checks that it,
                # and what is still pending, mirror the published blocks.
                try:
                    self.mirror.apply_all(result)
                except EventStreamError as exc:
                    raise InvariantViolation(
                        Violation(InvariantId.EVENTS, f"take_events returned a bad stream: {exc}")
                    ) from None
            self._after(name, before, changed_ok=name in _UPDATES)
            req = args[0] if args else kwargs.get("req")
            if name == "match" and isinstance(req, Request):
                check_match(before, req, result)
            elif name == "admit" and isinstance(req, Request) and isinstance(result, Admission):
                k = result.num_cached_tokens // before.block_size
                hit = Match(req.num_tokens, result.num_cached_tokens, result.block_ids[:k])
                check_match(before, req, hit)
            return result

        call.__name__ = name
        call.__doc__ = fn.__doc__
        return call

    def _after(self, name: str, before: CacheState, *, changed_ok: bool) -> None:
        after: CacheState = self._cache.snapshot()
        self.num_checks += 1
        if not changed_ok and after != before:
            what = "raised" if name in _UPDATES else "is a query"
            raise InvariantViolation(
                Violation(InvariantId.TXN, f"{name} {what} but changed the cache state")
            )
        check(after)
        if self.mirror is not None:
            check_events(self.mirror, after)


def checked(cache: Any, *, enabled: bool | None = None) -> Any:
    """``cache`` wrapped in a :class:`CheckedCache` when checking is on, else ``cache``.

    ``enabled=None`` (the default) reads :data:`ENV_VAR`, so an engine can leave the call in
    its code and turn checking on in CI only.
    """
    if enabled is None:
        enabled = checking_enabled()
    return CheckedCache(cache) if enabled else cache
