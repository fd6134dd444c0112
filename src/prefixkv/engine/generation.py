"""Per-request generation state for the reference scheduler.

A :class:`GenerationRequest` is what a client submits: a prompt, how many tokens to
generate, and how the cache should treat it (namespace, multimodal items, chunking,
recompute window). A :class:`Generation` is the scheduler's record of one request over its
whole life, across preemptions::

    WAITING --admit--> PREFILL --last chunk committed--> DECODE --max tokens--> FINISHED
       ^                  |                                 |
       +---- preempted (freed, recomputed from prompt + output on re-admission) ----+

Torch-free: the scheduler and its tests run without the model.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from prefixkv.errors import require_int
from prefixkv.spec.errors import InvalidRequest
from prefixkv.spec.multimodal import MultimodalSpan
from prefixkv.spec.namespace import Namespace
from prefixkv.spec.request import Request, token_tuple

__all__ = ["Generation", "GenerationRequest", "MultimodalItem", "Status"]


class Status(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


@attrs.frozen
class MultimodalItem:
    """One image (or audio clip, or prompt embedding) at ``span``, with its raw content.

    The cache sees only ``span`` (its content hash enters the block identities); the model
    sees ``content``, which the encoder turns into the embeddings at the span's positions.
    """

    span: MultimodalSpan
    content: bytes


def _to_items(value: object) -> tuple[MultimodalItem, ...]:
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        raise InvalidRequest(f"multimodal must be a sequence of MultimodalItem, got {value!r}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, MultimodalItem):
            raise InvalidRequest(f"multimodal must hold MultimodalItem objects, got {item!r}")
    return items


def _check_max_new(_: object, __: attrs.Attribute[int], value: object) -> None:
    require_int(value, "max_new_tokens", minimum=1, error=InvalidRequest)


@attrs.frozen
class GenerationRequest:
    """A client request: generate ``max_new_tokens`` greedy tokens after ``prompt``."""

    request_id: str
    prompt: tuple[int, ...] = attrs.field(converter=token_tuple)
    max_new_tokens: int = attrs.field(validator=_check_max_new)
    namespace: Namespace
    multimodal: tuple[MultimodalItem, ...] = attrs.field(default=(), converter=_to_items)
    kv_token_limit: int | None = None
    recompute_blocks: int = 0

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise InvalidRequest(f"request_id must be a non-empty str, got {self.request_id!r}")
        # Build one cache request now so that a bad prompt fails at submission, not mid-step.
        self.cache_request(self.namespace, self.prompt)

    @property
    def spans(self) -> tuple[MultimodalSpan, ...]:
        return tuple(item.span for item in self.multimodal)

    def cache_request(
        self, namespace: Namespace, token_ids: Sequence[int], *, spans: bool = True
    ) -> Request:
        return Request(
            self.request_id,
            token_ids,
            namespace,
            spans=self.spans if spans else (),
            recompute_blocks=self.recompute_blocks,
            kv_token_limit=self.kv_token_limit,
        )


@attrs.define(eq=False)
class Generation:
    """The scheduler's mutable record of one request.

    ``tokens`` is the prompt followed by every sampled token. While the sequence is live in
    the cache, ``num_computed`` positions have KV written and ``num_prompt`` is the length
    of the prompt it was admitted with (the original prompt plus, after a preemption, the
    output generated before it, all recomputed as prompt).

    ::

        tokens     |<------------- prompt ------------->|<--- output --->|
        admitted   |<-------- num_prompt (re-admitted: prompt + output) -------->|
        KV         |<-------- num_computed -------->|  (the last sampled token has none)
    """

    request: GenerationRequest
    arrival: int
    status: Status = Status.WAITING
    tokens: list[int] = attrs.field(factory=list)
    num_prompt: int = 0
    num_computed: int = 0
    num_cached_at_admission: int = 0
    admissions: int = 0
    preemptions: int = 0
    first_token_step: int | None = None
    finish_step: int | None = None
    drafts_proposed: int = 0
    drafts_accepted: int = 0

    def __attrs_post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.request.prompt)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def output(self) -> tuple[int, ...]:
        return tuple(self.tokens[len(self.request.prompt) :])

    @property
    def num_output(self) -> int:
        return len(self.tokens) - len(self.request.prompt)

    @property
    def remaining(self) -> int:
        return self.request.max_new_tokens - self.num_output

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def prompt_left(self) -> int:
        """Prompt positions of the current admission whose KV is not yet computed."""
        return max(self.num_prompt - self.num_computed, 0)
