"""Scheduling policies of the reference scheduler, as pure functions.

Each decision the scheduler makes that is a *choice* rather than bookkeeping lives here, so
that it can be read and unit-tested without a cache or a model:

* :func:`split_budget`: how a step's token budget is shared between decode and prefill;
* :func:`rotate`: the round-robin order of decodes when not all fit in one step;
* :func:`fit_decode`: how many tokens (pending token plus drafts) a decode gets;
* :func:`choose_victim`: which running sequence is preempted when blocks run out;
* :func:`verify_greedy`: which draft tokens a greedy target accepts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import attrs

from prefixkv.errors import InvalidConfig, require_int
from prefixkv.spec.errors import InvalidRequest

__all__ = [
    "SchedulerConfig",
    "choose_victim",
    "fit_decode",
    "rotate",
    "split_budget",
    "verify_greedy",
]

T = TypeVar("T")


def _positive(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    require_int(value, attribute.name, minimum=1)


def _non_negative(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    require_int(value, attribute.name, minimum=0)


@attrs.frozen
class SchedulerConfig:
    """Knobs of the reference scheduler.

    * ``max_num_batched_tokens``: the per-step token budget (decode and prefill together).
    * ``max_num_seqs``: at most this many sequences live in the cache at once.
    * ``min_prefill_tokens``: while prompts wait, decodes leave at least this much of the
      budget to prefill, so a steady stream of decodes cannot starve admission.
    * ``num_draft_tokens``: speculative decoding: at most this many drafts per decode step.
    """

    max_num_batched_tokens: int = attrs.field(default=256, validator=_positive)
    max_num_seqs: int = attrs.field(default=16, validator=_positive)
    min_prefill_tokens: int = attrs.field(default=16, validator=_non_negative)
    num_draft_tokens: int = attrs.field(default=0, validator=_non_negative)

    def __attrs_post_init__(self) -> None:
        if self.min_prefill_tokens >= self.max_num_batched_tokens:
            raise InvalidConfig(
                f"min_prefill_tokens={self.min_prefill_tokens} must leave room for decode in "
                f"max_num_batched_tokens={self.max_num_batched_tokens}"
            )


def split_budget(
    budget: int, decode_demand: int, prefill_demand: int, min_prefill: int
) -> tuple[int, int]:
    """``(decode budget, prefill budget)`` for one step.

    Decode goes first (it holds blocks and a user is waiting on every token), but while
    prompts wait it leaves ``min(min_prefill, prefill_demand)`` tokens to prefill. Whatever
    decode does not use goes to prefill. Neither starves: decode gets at least
    ``budget - min_prefill >= 1`` tokens a step, prefill at least ``min_prefill``.
    """
    reserve = min(min_prefill, prefill_demand)
    decode = min(decode_demand, budget - reserve)
    return decode, budget - decode


def rotate(items: Sequence[T], offset: int) -> list[T]:
    """``items`` starting at ``offset`` (mod len): the round-robin order of decodes."""
    if not items:
        return []
    k = offset % len(items)
    return [*items[k:], *items[:k]]


def fit_decode(num_drafts: int, budget_left: int) -> int:
    """How many drafts a decode keeps with ``budget_left`` tokens; ``-1``: it does not run.

    The pending token is never dropped; drafts are trimmed from the end to fit.
    """
    if budget_left < 1:
        return -1
    return min(num_drafts, budget_left - 1)


def choose_victim(running: Sequence[T], protected: Sequence[T]) -> T | None:
    """The sequence to preempt when blocks run out: the most recently admitted one.

    ``running`` is in admission order. A sequence already given work this step
    (``protected``) is never chosen: its reservation is part of the plan.
    NOTE: newest first (as vLLM does) because it has the least sunk compute and the
    oldest requests keep their latency; recompute is cheaper with the prefix cache on, as
    its committed full blocks stay cached after the free.
    """
    for candidate in reversed(running):
        if not any(candidate is p for p in protected):
            return candidate
    return None


def verify_greedy(drafts: Sequence[int], targets: Sequence[int]) -> tuple[int, list[int]]:
    """Greedy verification: ``(number of drafts accepted, tokens to append)``.

    ``targets[i]`` is the model's greedy token after the pending token and drafts ``< i``.
    Drafts are accepted while they equal the target; the first mismatch (or the end) adds
    the target there as the bonus token, so a step always yields at least one token.
    """
    if len(targets) != len(drafts) + 1:
        raise InvalidRequest(
            f"{len(drafts)} drafts need {len(drafts) + 1} targets, got {len(targets)}"
        )
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == targets[accepted]:
        accepted += 1
    return accepted, [*drafts[:accepted], targets[accepted]]
