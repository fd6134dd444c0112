"""Rules for multimodal spans, private recompute windows and chunked prefill.

These rules live in a mixin of :class:`~.differential.DifferentialMachine`, so they
interleave with every text-only rule (shared prefixes, eviction pressure, preemption, bad
inputs) in the same runs. They draw requests that carry spans, a ``recompute_blocks``
window and a ``kv_token_limit``, and they add the checks of those features:

* ``LOST``: a match's lost reuse adds up to the uncached prompt, and an admission reports
  the same lost reuse and window as the match just before it;
* ``CAN-CONTINUE``: ``can_continue_prefill`` predicts ``continue_prefill`` on the same cache;
* ``CANCEL``: freeing a sequence mid-chunk leaves nothing matchable beyond what was
  matchable before it was admitted or what it committed (unwritten KV is never matchable).

A prompt's items are runs of :data:`~.strategies.PLACEHOLDER` tokens, so equal
tokens with different content are the common case. ``ITEM_KINDS`` mixes content and
modality so that every pair differs in exactly one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, multiple, precondition, rule

from prefixkv.spec import InvalidRequest, Match, MultimodalSpan, Namespace, Request, SeqId

from .base import DrivenCache
from .checks import Targets, bad_inputs_due, counted
from .steps import ProtocolSteps
from .strategies import (
    BAD_SPAN_ARGS,
    ITEM_KINDS,
    PLACEHOLDER,
    RichArgs,
    budgets,
    items,
    namespace_ids,
    prompts,
    rich_requests,
    sampled_tokens,
    window_sizes,
)

__all__ = ["BAD_FEATURE_KINDS", "BAD_SPANS", "FeatureRules", "build_request"]

#: Malformed feature inputs driven by ``bad_feature_input``.
BAD_FEATURE_KINDS = (
    "request",
    "span",
    "continue:unknown",
    "continue:can_unknown",
    "continue:budget",
    "continue:uncommitted",
)

#: How ``reuse_rich`` changes a remembered multimodal request.
REUSE_VARIANTS = ("same", "same", "other_item", "as_text", "half")

#: Keyword arguments of ``MultimodalSpan`` that must raise ``InvalidRequest``.
BAD_SPANS: tuple[dict[str, object], ...] = (
    {"start": 2, "end": 2, "modality": "image", "content_hash": b"a"},
    {"start": 3, "end": 1, "modality": "image", "content_hash": b"a"},
    {"start": -1, "end": 2, "modality": "image", "content_hash": b"a"},
    {"start": 0, "end": 2.0, "modality": "image", "content_hash": b"a"},
    {"start": True, "end": 2, "modality": "image", "content_hash": b"a"},
    {"start": 0, "end": 2, "modality": "", "content_hash": b"a"},
    {"start": 0, "end": 2, "modality": 3, "content_hash": b"a"},
    {"start": 0, "end": 2, "modality": "image", "content_hash": b""},
    {"start": 0, "end": 2, "modality": "image", "content_hash": 7},
)


def build_request(
    seq_id: SeqId,
    tokens: tuple[int, ...],
    namespace: Namespace,
    placed: list[tuple[int, int, int]],
    window: int,
    limit: int | None,
) -> Request:
    """A request whose prompt is ``tokens`` with placeholder items inserted.

    ``placed`` holds ``(position, length, kind)``; positions are clamped to the prompt and
    items are inserted from the back so earlier positions stay put. ``limit`` is raised to
    the longest item, since a span must fit in one chunk.
    """
    out = list(tokens)
    inserted: list[tuple[int, int, int]] = []
    for pos, length, kind in sorted(placed, key=lambda p: -min(p[0], len(tokens))):
        pos = min(pos, len(tokens))
        out[pos:pos] = [PLACEHOLDER] * length
        inserted = [(p + length, n, k) for p, n, k in inserted]
        inserted.append((pos, length, kind))
    spans = tuple(
        MultimodalSpan(pos, pos + length, *ITEM_KINDS[kind])
        for pos, length, kind in sorted(inserted)
    )
    if limit is not None and spans:
        limit = max(limit, *(s.length for s in spans))
    return Request(
        seq_id, tuple(out), namespace, spans=spans, recompute_blocks=window, kv_token_limit=limit
    )


class FeatureRules(ProtocolSteps):
    """Spans, windows and chunked prefill (mixed into ``DifferentialMachine``)."""

    seqs = Bundle("seqs")  # the live sequences (the same bundle in every mixin)

    # -- rules -----------------------------------------------------------------------------

    def _window(self, window: int) -> int:
        return window if self.caps.recompute_windows else 0

    def _rich_request(self, rich: RichArgs) -> Request:
        """Build a drawn request, without the features the candidate lacks."""
        ns, tokens, placed, window, limit = rich
        caps = self.caps
        return build_request(
            self._new_id(),
            self._prompt(tokens),
            self._ns(ns),
            placed if caps.multimodal else [],
            window if caps.recompute_windows else 0,
            limit * self.scale if caps.chunked_prefill and limit is not None else None,
        )

    def _prefill_steps(
        self, seq_id: SeqId, budget: int | None, chunks: int, sampled: tuple[int, ...]
    ) -> None:
        for _ in range(chunks):
            if not self._prefill_step(seq_id, budget, sampled):
                break

    def _probe_twins(self, req: Request) -> None:
        """Match the request's twins right after its blocks were published: the same
        placeholders with other contents or modalities, and as plain text. Each may hit
        only the blocks before the first item (INV-MATCH and the spec decide)."""
        if not req.spans:
            return
        for variant in ("other_item", "as_text"):
            twin = _variant(req, variant, "twin", 0)
            out = self.oracle.op("match", _matching(twin), pure=True)
            if not out.raised:
                self.oracle.check_match(twin, out.value, f"match ({variant} twin)")

    @rule(
        target=seqs,
        rich=rich_requests(),
        budget=budgets(),
        chunks=st.integers(0, 4),
        sampled=sampled_tokens(),
    )
    @counted
    def admit_rich(
        self, rich: RichArgs, budget: int | None, chunks: int, sampled: tuple[int, ...]
    ) -> Targets:
        """Admit a request with items, a recompute window and a chunk limit, then run up to
        ``chunks`` prefill steps (commit a chunk, reserve the next)."""
        req = self._rich_request(rich)
        # With chunks == 0, admit even when can_admit says no (to check the prediction).
        if self._admit(req, budget, only_if_possible=chunks > 0) is None:
            return multiple()
        self._prefill_steps(req.seq_id, budget, chunks, sampled)
        self._probe_twins(req)
        return req.seq_id if req.seq_id in self.oracle.views else multiple()

    @rule(
        rich=rich_requests(), budget=budgets(), chunks=st.integers(0, 3), sampled=sampled_tokens()
    )
    @counted
    def cancel_mid_chunk(
        self, rich: RichArgs, budget: int | None, chunks: int, sampled: tuple[int, ...]
    ) -> None:
        """Admit, run some prefill steps, free while a chunk is reserved but unwritten, then
        match the same prompt: nothing unwritten became matchable."""
        req = self._rich_request(rich)
        before = self.oracle.op("match", lambda c: c.match(req), pure=True)
        adm = self._admit(req, budget, only_if_possible=True)
        if adm is None or before.raised:
            return
        self._prefill_steps(req.seq_id, budget, chunks, sampled)
        self._run_scheduled([req.seq_id])  # a writer that always runs commits first
        view = self.oracle.view(req.seq_id)
        if view is None:
            return
        committed = view.num_computed - view.num_computed % self.block_size
        self._free([req.seq_id])
        after = self.oracle.op("match", lambda c: c.match(req), pure=True)
        if not after.raised:  # a hit on the cancelled writer's blocks is the root cause
            self.oracle.check_match(req, after.value, "match after the cancel")
        bound = max(before.value.num_cached_tokens, committed)
        if not after.raised and after.value.num_cached_tokens > bound:
            self.oracle.fail(
                "CANCEL",
                f"after a cancel at {view.num_computed}/{view.num_reserved} computed/reserved, "
                f"{after.value.num_cached_tokens} tokens match (at most {bound} may)",
            )

    @rule(
        rich=rich_requests(),
        evictions=st.integers(1, 3),
        window=window_sizes(),
        sampled=sampled_tokens(),
    )
    @counted
    def trim_and_reuse(
        self, rich: RichArgs, evictions: int, window: int, sampled: tuple[int, ...]
    ) -> None:
        """Prefill a multimodal request fully, free it, evict a few leaves (its deepest
        blocks go first, so an item may be cut in half), then match and admit it again."""
        req = self._rich_request(rich)
        if self._admit(req, None, only_if_possible=True) is None:
            return
        self._prefill_steps(req.seq_id, None, 8, sampled)
        self._probe_twins(req)
        self._free([req.seq_id])
        if self.caps.evict:
            self.oracle.op("evict", lambda c: c.evict(evictions))
        again = attrs.evolve(req, seq_id=self._new_id(), recompute_blocks=self._window(window))
        out = self.oracle.op("match", lambda c: c.match(again), pure=True)
        if out.raised:
            return
        self.oracle.check_match(again, out.value, "match after eviction")
        self._check_lost(again, "match after eviction", out.value.lost, out.value.num_cached_tokens)
        if self._admit(again, None, only_if_possible=True) is not None:
            self._free([again.seq_id])

    @precondition(lambda self: self.caps.chunked_prefill)
    @rule(seq=seqs, budget=budgets(), sampled=sampled_tokens())
    @counted
    def continue_prefill(self, seq: SeqId, budget: int | None, sampled: tuple[int, ...]) -> None:
        """Commit the current chunk if it is unwritten, then reserve the next one if prompt
        tokens are left (``bad_feature_input`` checks the refusals)."""
        self._commit_chunk(seq, sampled)
        view = self.oracle.view(seq)
        if view is not None and view.num_reserved < view.num_prompt_tokens:
            self._continue(seq, budget)

    @precondition(lambda self: self.caps.multimodal)
    @rule(
        target=seqs,
        pick=st.integers(0, 15),
        variant=st.sampled_from(REUSE_VARIANTS),
        window=window_sizes(),
        budget=budgets(),
        admit=st.booleans(),
        sampled=sampled_tokens(),
    )
    @counted
    def reuse_rich(
        self,
        pick: int,
        variant: str,
        window: int,
        budget: int | None,
        admit: bool,
        sampled: tuple[int, ...],
    ) -> Targets:
        """Send a recent multimodal prompt again: the same, with other item contents or
        modalities, as plain text, or cut in half. Match it (INV-MATCH, LOST) and maybe
        admit it and run its first prefill step."""
        if not self._rich:
            return multiple()
        old = self._rich[pick % len(self._rich)]
        req = _variant(old, variant, self._new_id(), self._window(window))
        out = self.oracle.op("match", lambda c: c.match(req), pure=True)
        if out.raised:
            return multiple()
        self.oracle.check_match(req, out.value, f"match ({variant})")
        self._check_lost(req, "match", out.value.lost, out.value.num_cached_tokens)
        if not admit or self._admit(req, budget, only_if_possible=True) is None:
            return multiple()
        self._prefill_step(req.seq_id, budget, sampled)
        return req.seq_id if req.seq_id in self.oracle.views else multiple()

    @precondition(lambda self: self.caps.multimodal)
    @rule(ns=namespace_ids(), tokens=prompts(), placed=items(), window=window_sizes())
    @counted
    def match_rich(
        self, ns: int, tokens: tuple[int, ...], placed: list[tuple[int, int, int]], window: int
    ) -> None:
        """A pure match of a request with items and a window (INV-MATCH, LOST)."""
        tokens = self._prompt(tokens)
        req = build_request("probe", tokens, self._ns(ns), placed, self._window(window), None)
        out = self.oracle.op("match", lambda c: c.match(req), pure=True)
        if not out.raised:
            self.oracle.check_match(req, out.value, "match")
            self._check_lost(req, "match", out.value.lost, out.value.num_cached_tokens)

    @precondition(lambda self: bad_inputs_due(self) and self.caps.chunked_prefill)
    @rule(
        kind=st.sampled_from(BAD_FEATURE_KINDS),
        seq=seqs,
        bad=st.sampled_from(BAD_SPAN_ARGS),
        span=st.sampled_from(BAD_SPANS),
        count=st.sampled_from((0, -1, True, 1.5, "2")),
    )
    @counted
    def bad_feature_input(
        self, kind: str, seq: SeqId, bad: dict[str, Any], span: dict[str, Any], count: Any
    ) -> None:
        """Malformed spans, windows and limits; continue_prefill on unknown ids, with bad
        budgets, or while the current chunk is unwritten."""
        self._since_bad = 0
        self.oracle.raised_in_rule = True
        type(self).coverage.variants[f"bad_feature_input:{kind}"] += 1
        if kind in ("request", "span"):
            build: Any = MultimodalSpan if kind == "span" else Request
            args: dict[str, Any] = (
                span
                if kind == "span"
                else {"seq_id": 1, "token_ids": (1, 2, 3, 4, 5, 6), "namespace": self._ns(0)} | bad
            )
            try:
                build(**args)
            except InvalidRequest:
                return
            self.oracle.fail("BAD-REQUEST", f"{build.__name__}(**{args!r}) did not raise")
            return
        ghost = self._ghost()
        if kind == "continue:unknown":
            self.oracle.op("continue_prefill", lambda c: c.continue_prefill(ghost))
        elif kind == "continue:can_unknown":
            self.oracle.op(
                "can_continue_prefill", lambda c: c.can_continue_prefill(ghost), pure=True
            )
        elif kind == "continue:budget":
            self.oracle.op(
                "can_continue_prefill", lambda c: c.can_continue_prefill(seq, count), pure=True
            )
            self.oracle.op("continue_prefill", lambda c: c.continue_prefill(seq, count))
        else:
            view = self.oracle.view(seq)
            if view is not None and view.num_computed == view.num_reserved:
                self._continue(seq, 1)  # reserve a chunk (or be refused: nothing left)
            self.oracle.op("continue_prefill", lambda c: c.continue_prefill(seq, 1))


def _variant(req: Request, variant: str, seq_id: SeqId, window: int) -> Request:
    """``req`` again under a new id and window, changed as ``variant`` says."""
    tokens, spans = req.token_ids, req.spans
    if variant == "other_item":  # same placeholders, another content or modality
        spans = tuple(
            MultimodalSpan(
                s.start,
                s.end,
                *ITEM_KINDS[(ITEM_KINDS.index((s.modality, s.content_hash)) + 1) % len(ITEM_KINDS)],
            )
            for s in spans
        )
    elif variant == "as_text":  # the placeholder ids typed as text
        spans = ()
    elif variant == "half":
        cut = max(1, len(tokens) // 2)
        tokens, spans = tokens[:cut], tuple(s for s in spans if s.end <= cut)
    return attrs.evolve(req, seq_id=seq_id, token_ids=tokens, spans=spans, recompute_blocks=window)


def _matching(req: Request) -> Callable[[DrivenCache], Match]:
    """``cache.match(req)`` as an operation for the oracle."""
    return lambda cache: cache.match(req)
