"""What a block manager under test supports, so the machines never fake a feature.

A rule that needs a feature the candidate lacks is skipped (its precondition is false), and
the requests other rules draw are stripped of it: no multimodal items without
``multimodal``, no recompute window without ``recompute_windows``, no ``kv_token_limit`` or
``continue_prefill`` without ``chunked_prefill``.

``exact`` chooses the mode:

* ``exact=True``: the candidate must match :class:`~prefixkv.spec.SpecCache` step for step:
  the same results, errors, block ids, eviction order, statistics and events.
* ``exact=False`` (policy-agnostic): the candidate runs alone. Whatever its eviction policy
  and block-id choices, every safety invariant (INV-REF, INV-PARTITION, INV-INDEX,
  INV-ANCESTOR, INV-WRITE, INV-PUBLISH, INV-MATCH, INV-WINDOW, INV-LIMIT, INV-TXN,
  INV-STATS) must hold after every step, queries must be pure, ``can_*`` must predict the
  operation that follows, an admission must attach what the match before it found, and
  invalid operations must raise the right :class:`~prefixkv.spec.PrefixCacheError`.
"""

from __future__ import annotations

import attrs

__all__ = ["Capabilities"]


@attrs.frozen
class Capabilities:
    """Features of the candidate; everything on by default (prefixkv's own caches)."""

    #: Multimodal spans in block identity (choice 5).
    multimodal: bool = True
    #: ``Request.recompute_blocks`` (choice 6).
    recompute_windows: bool = True
    #: ``Request.kv_token_limit`` and ``continue_prefill`` (choice 8).
    chunked_prefill: bool = True
    #: ``Match.lost`` / ``Admission.lost`` split the uncached prompt by cause.
    lost_reuse: bool = True
    #: ``reset(preserve_cache=...)``.
    reset: bool = True
    #: KV events (``record_events=True``, ``take_events``).
    events: bool = True
    #: Step-for-step equality with the spec (see the module doc).
    exact: bool = True

    @classmethod
    def parse(cls, text: str, base: Capabilities | None = None) -> Capabilities:
        """``"-multimodal,-exact"`` turns features off, ``"events"`` or ``"+events"`` on."""
        caps = cls() if base is None else base
        names = {f.name for f in attrs.fields(cls)}
        changes: dict[str, bool] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            on = not item.startswith("-")
            name = item.lstrip("+-").replace("-", "_")
            if name not in names:
                raise ValueError(
                    f"unknown capability {name!r}; expected one of {', '.join(sorted(names))}"
                )
            changes[name] = on
        return attrs.evolve(caps, **changes)

    def describe(self) -> str:
        """``exact, multimodal, ...`` or ``-exact, ...`` for the report header."""
        return ", ".join(
            ("" if getattr(self, f.name) else "-") + f.name for f in attrs.fields(type(self))
        )
