"""What a block manager under test supports and which policy it follows.

Two kinds of fields:

* **Features and operations** (``multimodal``, ``speculative``, ``evict``, ``reset``, ...).
  A rule that needs a missing one is skipped (its precondition is false), and the requests
  other rules draw are stripped of it. A missing operation is declared, never faked: the kit
  does not call it, and no check depends on it.
* **Policy** (``publish``, ``eviction``, ``duplicates``): where engines legitimately
  disagree with prefixkv's choices 1 to 3. Each value other than prefixkv's own swaps one
  policy check for the weakest safety property that still catches real bugs (see
  :mod:`prefixkv.conformance.safety` and docs/conformance.md, "Design differences").

``exact`` chooses the mode:

* ``exact=True``: the candidate must match :class:`~prefixkv.spec.SpecCache` step for step:
  the same results, errors, block ids, eviction order, statistics and events. This demands
  prefixkv's policy, so it refuses any other ``publish``, ``eviction`` or ``duplicates``.
* ``exact=False`` (safety mode): the candidate runs alone. Whatever its eviction order and
  block-id choices, every safety invariant must hold after every step, queries must be
  pure, ``can_*`` must predict the operation that follows, an admission must attach what
  the match before it found, and invalid operations must raise the right
  :class:`~prefixkv.spec.PrefixCacheError`.

One parser serves the pytest plugin and :func:`~prefixkv.conformance.run_conformance`:
``"publish=schedule,eviction=any,-reset,block-sizes=16|256"`` and
``run_conformance(factory, publish="schedule", reset=False, block_sizes=(16, 256))``
both go through :meth:`Capabilities.coerce`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

import attrs

__all__ = ["Capabilities", "Duplicates", "Eviction", "Publish"]

#: When a block becomes findable by other requests: after its KV is committed (prefixkv),
#: or as soon as it is scheduled (vLLM v1).
Publish = Literal["compute", "schedule"]
#: Which cached blocks may be evicted: leaves only (prefixkv), or any (content-addressed).
Eviction = Literal["leaf", "any"]
#: A second block with an identity already published: stays private (prefixkv), is published
#: too and shared (vLLM), or replaces the older one in the index (the older stays read-only).
Duplicates = Literal["private", "shared", "last-wins"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "publish": get_args(Publish),
    "eviction": get_args(Eviction),
    "duplicates": get_args(Duplicates),
}
_RANGES = ("num_blocks",)
_TUPLES = ("block_sizes",)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _positive_ints(value: object, what: str) -> tuple[int, ...]:
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    out = tuple(v for v in items if isinstance(v, int) and not isinstance(v, bool) and v >= 1)
    if not items or len(out) != len(items):
        raise ValueError(f"{what} must be positive ints, got {value!r}")
    return out


@attrs.frozen
class Capabilities:
    """Features and policy of the candidate; the defaults are prefixkv's own caches."""

    # -- policy (choices 1 to 3 of docs/design.md) --------------------------------------
    #: ``"compute"``: published only after commit. ``"schedule"``: published when
    #: allocated; a hit on a block whose writer can no longer write it is INV-PUBLISH.
    publish: Publish = "compute"
    #: ``"leaf"``: only leaves are evicted (INV-ANCESTOR). ``"any"``: any cached block; no
    #: match may reach past a broken chain, and unreachable blocks must stay evictable.
    eviction: Eviction = "leaf"
    #: ``"private"``, ``"shared"`` or ``"last-wins"`` (see :data:`Duplicates`).
    duplicates: Duplicates = "private"

    # -- operations ----------------------------------------------------------------------
    #: Several namespaces (LoRA adapters, tenant salts). ``False``: one namespace only.
    namespaces: bool = True
    #: Multi-token ``append`` and ``rollback`` (speculative decoding). ``False``: decode
    #: grows one token a step and nothing is rolled back.
    speculative: bool = True
    #: ``rollback(seq_id, n)`` of unwritten tail slots (with ``speculative``). ``False``:
    #: the engine keeps a rejected draft's slots and the next step fills them (MTP
    #: engines), or never gives slots back; the kit never calls it, and its decode steps
    #: reserve only the slots that are missing.
    rollback: bool = True
    #: A cancel (``free``, a preemption, ``reset``) between a writer's schedule and its
    #: commit. ``False``: a scheduled writer always runs its forward pass, so the kit
    #: commits the scheduled known tokens of a sequence before it cancels it.
    cancel_scheduled: bool = True
    #: An explicit ``evict(n)``.
    evict: bool = True
    #: ``reset(preserve_cache=...)``.
    reset: bool = True
    #: ``Request.kv_token_limit`` and ``continue_prefill`` (choice 8).
    chunked_prefill: bool = True
    #: An admission budget below the prompt (``admit(req, n)``). ``False``: whole prompts.
    partial_admission: bool = True

    # -- features ------------------------------------------------------------------------
    #: Multimodal spans in block identity (choice 5).
    multimodal: bool = True
    #: ``Request.recompute_blocks`` (choice 6).
    recompute_windows: bool = True
    #: ``Match.lost`` / ``Admission.lost`` split the uncached prompt by cause.
    lost_reuse: bool = True
    #: KV events (``record_events=True``, ``take_events``).
    events: bool = True
    #: Step-for-step equality with the spec (see the module doc).
    exact: bool = True
    #: Recurrent-state checkpoints beside the KV blocks (hybrid models, choice 7): the
    #: ``HybridPrefixCache`` operations, a factory that also takes ``max_num_seqs``,
    #: ``state_budget`` and ``decode_state_interval``, a snapshot with ``state_slots``, and
    #: INV-CKPT and the restore checks after every step (docs/conformance.md).
    checkpoints: bool = False
    #: Routed-expert data on commits and hits (choice 11); only with ``checkpoints``.
    routed_experts: bool = False

    # -- pool shapes ---------------------------------------------------------------------
    #: The block sizes a run may draw (e.g. ``(256,)`` for an engine that needs multiples
    #: of 256). Prompts are drawn in blocks, so every size exercises the same sharing.
    block_sizes: tuple[int, ...] = attrs.field(default=(1, 2, 3, 4), converter=tuple)
    #: The inclusive range of pool sizes a run may draw.
    num_blocks: tuple[int, int] = attrs.field(default=(4, 24), converter=tuple)

    def __attrs_post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"capability {name}={getattr(self, name)!r}; expected one of "
                    + ", ".join(allowed)
                )
        _positive_ints(self.block_sizes, "block_sizes")
        bounds = _positive_ints(self.num_blocks, "num_blocks")
        if len(bounds) != 2 or bounds[0] > bounds[1]:
            raise ValueError(f"num_blocks must be a range (low, high), got {self.num_blocks!r}")
        if self.routed_experts and not self.checkpoints:
            raise ValueError("routed_experts rides on the hybrid API: declare checkpoints too")
        if self.exact and self.policy_changes():
            raise ValueError(
                "exact mode demands prefixkv's policy step for step; declare -exact with "
                + ", ".join(self.policy_changes())
            )

    def policy_changes(self) -> list[str]:
        """The policy fields that differ from prefixkv's, as ``name=value``."""
        default = Capabilities.__attrs_attrs__
        return [
            f"{name}={getattr(self, name)}"
            for name in _CHOICES
            if getattr(self, name) != getattr(default, name).default
        ]

    @property
    def rolls_back(self) -> bool:
        """``rollback`` is called: drafts (``speculative``) and a rollback operation."""
        return self.speculative and self.rollback

    # -- the one parser --------------------------------------------------------------------

    @classmethod
    def coerce(cls, name: str, value: object) -> Any:
        """Check and convert one capability given as a keyword or as option text.

        Raises ``ValueError`` naming the capability and what it accepts.
        """
        field = getattr(attrs.fields(cls), name.replace("-", "_"), None)
        if field is None:
            names = ", ".join(f.name for f in attrs.fields(cls))
            raise ValueError(f"unknown capability {name!r}; expected one of {names}")
        name = field.name
        if name in _CHOICES:
            if value not in _CHOICES[name]:
                raise ValueError(
                    f"capability {name}={value!r}; expected one of {', '.join(_CHOICES[name])}"
                )
            return value
        if name in _TUPLES or name in _RANGES:
            if isinstance(value, str):
                sep = ".." if ".." in value else "|"
                try:
                    value = tuple(int(v) for v in value.split(sep))
                except ValueError:
                    raise ValueError(f"capability {name}={value!r} is not ints") from None
                if name in _RANGES and sep != "..":
                    value = (value[0], value[-1]) if len(value) <= 2 else value
            items = _positive_ints(value, name)
            if name in _RANGES:
                items = items * 2 if len(items) == 1 else items
                if len(items) != 2 or items[0] > items[1]:
                    raise ValueError(f"capability {name}={value!r}: expected LOW..HIGH")
            return items
        if isinstance(value, str):
            if value.lower() in _TRUE:
                return True
            if value.lower() in _FALSE:
                return False
        if not isinstance(value, bool):
            raise ValueError(f"capability {name} is on or off, got {value!r}")
        return value

    @classmethod
    def parse(cls, text: str, base: Capabilities | None = None) -> Capabilities:
        """``"-multimodal,publish=schedule,block-sizes=16|256,num-blocks=8..32"`` on top of
        ``base``: ``-name`` turns an operation or feature off, ``name`` or ``+name`` on."""
        changes: dict[str, object] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, eq, value = item.partition("=")
            if eq:
                changes[name.strip()] = value.strip()
            else:
                changes[name.lstrip("+-").strip()] = not name.startswith("-")
        return cls.evolve(base, changes)

    @classmethod
    def evolve(cls, base: Capabilities | None, changes: Mapping[str, object]) -> Capabilities:
        """``base`` (default: prefixkv's own) with ``changes`` (keywords or option text)."""
        caps = cls() if base is None else base
        coerced = {k.replace("-", "_"): cls.coerce(k, v) for k, v in changes.items()}
        # evolve runs __attrs_post_init__: exact with another policy is refused there
        return attrs.evolve(caps, **coerced)

    def describe(self) -> str:
        """``publish=schedule, -exact, ...``: what differs from prefixkv's own caches."""
        parts: list[str] = []
        for f in attrs.fields(type(self)):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            if isinstance(value, bool):
                parts.append(("" if value else "-") + f.name)
            elif isinstance(value, tuple):
                sep = ".." if f.name in _RANGES else "|"
                parts.append(f"{f.name}={sep.join(map(str, value))}")
            else:
                parts.append(f"{f.name}={value}")
        return ", ".join(parts) or "prefixkv's own (every feature, exact)"
