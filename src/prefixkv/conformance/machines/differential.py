"""The differential state machine: a reference cache and a candidate, driven in lockstep.

Every rule runs the same operations on both caches (see :meth:`DifferentialMachine._op`).
After **every operation**:

1. both raised the same exception type, or neither raised (``DIFF-RAISE``);
2. ``invariants.check`` holds on the candidate's snapshot (``INV-*``) and on the reference's
   (``SPEC:INV-*``: a bug in the spec itself);
3. an operation that raised, or a pure one (``match``, ``can_admit``, queries), changed
   nothing on either cache, statistics and pending events included (``INV-TXN``, ``PURE``);
4. the return values are equal (``DIFF-RESULT``);
5. the two snapshots are equal, field by field (``DIFF-STATE(<field>)``).

Rules add their own checks: ``check_match`` on every match and admission (``INV-MATCH``),
``can_admit``/``can_append`` must predict the operation that follows on the same cache
(``CAN-ADMIT``, ``CAN-APPEND``), and an admission must attach exactly the blocks the match
just before it found (``ADMIT-MATCH``).

A failure raises :class:`CheckFailed`, whose message starts with the check's name in
brackets; Hypothesis then shrinks the run and prints it as a short program.

The machine class is built by :func:`build_machine` from a :data:`PairFactory`, so the same
rules can drive any pair of caches with the :class:`~prefixkv.spec.PrefixCache` API plus
``snapshot()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import attrs
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    multiple,
    precondition,
    rule,
)

from prefixkv.spec import (
    Admission,
    CacheState,
    DuplicateSequence,
    InvalidOperation,
    InvalidRequest,
    InvariantViolation,
    Match,
    MultimodalSpan,
    Namespace,
    OutOfBlocks,
    PrefixCacheError,
    Request,
    SeqId,
    SeqView,
    UnknownSequence,
)
from prefixkv.spec import invariants as inv

from ..capabilities import Capabilities
from ..events_check import EventStreams
from .checks import CheckFailed, bad_inputs_due, counted, failure_listeners
from .coverage import RuleCoverage
from .factories import PairFactory, PoolConfig
from .features import FeatureRules, admission_checks
from .replay import HEADER, Recording
from .strategies import (
    BAD_ACCEPTED,
    BAD_COUNTS,
    BAD_REQUEST_ARGS,
    NAMESPACES,
    NOT_A_REQUEST,
    budgets,
    namespace_ids,
    prompts,
    sampled_tokens,
)

__all__ = [
    "BAD_ARGUMENT_KINDS",
    "BAD_REQUEST_KINDS",
    "BAD_SEQUENCE_KINDS",
    "CheckFailed",
    "DifferentialMachine",
    "Outcome",
    "all_rule_names",
    "build_machine",
    "failure_listeners",
]


@attrs.frozen
class Outcome:
    """What one operation did on one cache: a value, or an exception."""

    value: Any = None
    error: BaseException | None = None

    @property
    def raised(self) -> bool:
        return self.error is not None

    def describe(self) -> str:
        if self.error is not None:
            return f"raised {type(self.error).__name__}({self.error})"
        return f"returned {self.value!r}"


def _run(fn: Callable[[Any], Any], cache: Any) -> Outcome:
    try:
        return Outcome(value=fn(cache))
    except Exception as exc:  # the candidate may raise anything; the comparison decides
        return Outcome(error=exc)


def _normal(value: Any) -> Any:
    """Compare lists as tuples and KV events by type as well as fields."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple event
        return (type(value).__name__, *(_normal(v) for v in value))
    if isinstance(value, (list, tuple)):
        return tuple(_normal(v) for v in value)
    return value


BAD_SEQUENCE_KINDS = (
    "unknown:append",
    "unknown:can_append",
    "unknown:commit",
    "unknown:rollback",
    "unknown:continue_prefill",
    "unknown:block_table",
    "unknown:num_computed_tokens",
    "unknown:free",
    "double_free",
    "free_unknown_in_batch",
    "admit_live_id",
    "free_one_id",
    "free_not_iterable",
    "bad_seq_id_type",
)

BAD_ARGUMENT_KINDS = (
    "append",
    "can_append",
    "commit",
    "rollback",
    "evict",
    "admit_budget",
    "can_admit_budget",
    "commit_past_reserved",
    "commit_unknown_tokens",
    "rollback_past_computed",
    "accepted_tokens",
    "reset_flag",
    "admit_over_capacity",
)

BAD_REQUEST_KINDS = (
    "construct",
    "bad_namespace",
    "not_a_request:match",
    "not_a_request:can_admit",
    "not_a_request:admit",
)


#: The error each bad sequence operation must raise, whatever the state.
_SEQUENCE_ERRORS: dict[str, type[Exception]] = {
    **{kind: UnknownSequence for kind in BAD_SEQUENCE_KINDS if kind.startswith("unknown:")},
    "double_free": DuplicateSequence,
    "free_unknown_in_batch": UnknownSequence,
    "free_one_id": InvalidRequest,
    "free_not_iterable": InvalidRequest,
    "bad_seq_id_type": InvalidRequest,
}

#: The error a bad argument must raise whatever the state (kinds whose counts may be valid,
#: such as ``commit(seq, 0)`` or an admission budget of ``None``, are not listed).
_ARGUMENT_ERRORS: dict[str, type[Exception]] = {
    "commit_past_reserved": InvalidOperation,
    "commit_unknown_tokens": InvalidOperation,
    "rollback_past_computed": InvalidOperation,
    "accepted_tokens": InvalidRequest,
    "reset_flag": InvalidRequest,
    "admit_over_capacity": OutOfBlocks,
}


#: Pure reads left out of replays once they have passed (``match`` and ``can_*`` stay:
#: they show what the candidate promised before the step that broke the promise).
_QUIET = frozenset({"seq_ids", "stats", "block_table", "num_computed_tokens"})


class DifferentialMachine(FeatureRules, RuleBasedStateMachine):
    """Rules over the whole :class:`~prefixkv.spec.PrefixCache` API; see the module doc.

    Do not run this class directly: :func:`build_machine` makes a runnable subclass with a
    pair factory, the pool shapes to draw and its own coverage counters.
    """

    coverage: ClassVar[RuleCoverage] = RuleCoverage()
    namespaces: ClassVar[tuple[Namespace, ...]] = NAMESPACES
    #: What the candidate supports; rules for missing features never fire.
    caps: ClassVar[Capabilities] = Capabilities()
    #: The ``CacheState`` fields that must be equal after every step (``None``: all of them).
    #: An adapter for a block manager that cannot render, say, its free queue order can
    #: compare fewer; the invariants are still checked on the whole snapshot.
    compared_fields: ClassVar[frozenset[str] | None] = None

    #: The candidate calls of the latest run, as source (see :mod:`.replay`).
    last_calls: ClassVar[list[str]] = []
    #: Rule steps of the latest run (``init`` included).
    last_steps: ClassVar[int] = 0

    seqs = Bundle("seqs")

    def __init__(self) -> None:
        super().__init__()
        self.ref: Any = None
        self.cand: Any = None
        self._recorded: Any = None
        self.cfg: PoolConfig | None = None
        self._snap_r: CacheState | None = None
        self._snap_c: CacheState | None = None
        self._views: dict[SeqId, SeqView] = {}
        self._seq_ns: dict[SeqId, int] = {}
        self._history: list[tuple[int, tuple[int, ...], tuple[MultimodalSpan, ...]]] = []
        self._requests: dict[SeqId, Request] = {}
        self._rich: list[Request] = []
        self._freed: list[SeqId] = []
        self._next_id = 0
        self._since_bad = 3  # rules since the last bad-input rule (the first may fire at once)
        self._rule_raised = False
        self._streams = EventStreams(False)

    # -- plumbing --------------------------------------------------------------------------

    @staticmethod
    def make_pair(cfg: PoolConfig) -> tuple[Any, Any]:
        raise NotImplementedError("build the machine with build_machine(make_pair=...)")

    @property
    def block_size(self) -> int:
        assert self.cfg is not None
        return self.cfg.block_size

    def _start(self, cfg: PoolConfig) -> None:
        self.cfg = cfg
        self.ref, self.cand = type(self).make_pair(cfg)
        self._streams = EventStreams(cfg.record_events)
        calls = [
            HEADER,
            f"cache = make(num_blocks={cfg.num_blocks}, block_size={cfg.block_size}, "
            f"record_events={cfg.record_events})",
        ]
        type(self).last_calls = calls
        type(self).last_steps = 0
        self._recorded = Recording(self.cand, calls)
        type(self).coverage.variants[f"block_size={cfg.block_size}"] += 1
        if self.ref is None:  # candidate alone: the safety invariants only
            for attr in ("num_blocks", "block_size"):
                if getattr(self.cand, attr) != getattr(cfg, attr):
                    raise CheckFailed(
                        f"SHAPE({attr})",
                        f"asked for {getattr(cfg, attr)}, candidate has {getattr(self.cand, attr)}",
                    )
            self._snap_c = self._snapshot_candidate("construction")
            self._check_invariants("construction", None, self._snap_c)
            return
        for attr in ("num_blocks", "block_size"):
            r, c = getattr(self.ref, attr), getattr(self.cand, attr)
            if r != c:
                raise CheckFailed("DIFF-RESULT(" + attr + ")", f"reference {r}, candidate {c}")
        self._snap_r = self.ref.snapshot()
        self._snap_c = self._snapshot_candidate("construction")
        self._check_states("construction", self._snap_r, self._snap_c)

    def _snapshot_candidate(self, what: str) -> CacheState:
        try:
            snap: CacheState = self.cand.snapshot()
        except Exception as exc:
            raise CheckFailed(
                "SNAPSHOT", f"candidate.snapshot() after {what} raised {exc!r}"
            ) from exc
        return snap

    def _op(
        self,
        name: str,
        fn: Callable[[Any], Any],
        *,
        pure: bool = False,
        must_raise: type[Exception] | None = None,
    ) -> Outcome:
        """Run ``fn`` on both caches and check everything; returns the reference's outcome
        (the candidate's when it runs alone). ``must_raise``: the operation is invalid
        whatever the state, and must raise that error type."""
        cov = type(self).coverage
        cov.ops[name] += 1
        logged = len(type(self).last_calls)
        if self.ref is None:
            out = self._op_alone(name, fn, pure=pure)
        else:
            out = self._op_pair(name, fn, pure=pure)
        if name in _QUIET and not out.raised:
            # A read that passed every check cannot have caused a later failure: keep it
            # out of the replay (runs cut short in shrinking would be full of them).
            del type(self).last_calls[logged:]
        if must_raise is not None and not isinstance(out.error, must_raise):
            raise CheckFailed(
                f"MUST-RAISE({name})", f"expected {must_raise.__name__}, {out.describe()}"
            )
        return out

    def _op_alone(self, name: str, fn: Callable[[Any], Any], *, pure: bool) -> Outcome:
        """The candidate alone: no crash, invariants, INV-TXN and purity."""
        before = self._snap_c
        assert before is not None
        out = _run(fn, self._recorded)
        if out.raised:
            self._rule_raised = True
            type(self).coverage.op_errors[name] += 1
            if not isinstance(out.error, PrefixCacheError):
                raise CheckFailed(
                    f"CRASH({name})", f"candidate {out.describe()}: not a PrefixCacheError"
                ) from out.error
        snap = self._snapshot_candidate(name)
        self._check_invariants(name, None, snap)
        self._streams.after(name, "candidate", out.value, out.raised, snap)
        if out.raised or pure:
            try:
                inv.check_unchanged(before, snap, name)
            except InvariantViolation as exc:
                raise CheckFailed("INV-TXN" if out.raised else "PURE", str(exc)) from None
        self._snap_c = snap
        self._views = {v.seq_id: v for v in snap.sequences}
        return out

    def _op_pair(self, name: str, fn: Callable[[Any], Any], *, pure: bool) -> Outcome:
        """Reference and candidate in lockstep: everything must agree."""
        cov = type(self).coverage
        before_r, before_c = self._snap_r, self._snap_c
        assert before_r is not None and before_c is not None
        out_r = _run(fn, self.ref)
        out_c = _run(fn, self._recorded)
        if out_r.raised:
            self._rule_raised = True
            cov.op_errors[name] += 1
        if out_r.raised and not isinstance(out_r.error, PrefixCacheError):
            raise CheckFailed(
                f"SPEC:CRASH({name})", f"reference {out_r.describe()}"
            ) from out_r.error
        if type(out_r.error) is not type(out_c.error):
            raise CheckFailed(
                f"DIFF-RAISE({name})",
                f"reference {out_r.describe()}, candidate {out_c.describe()}",
            ) from out_c.error
        snap_r = self.ref.snapshot()
        snap_c = self._snapshot_candidate(name)
        self._check_invariants(name, snap_r, snap_c)
        self._streams.after(name, "candidate", out_c.value, out_c.raised, snap_c)
        self._streams.after(name, "reference", out_r.value, out_r.raised, snap_r)
        if out_r.raised or pure:
            check = "INV-TXN" if out_r.raised else "PURE"
            for who, before, after in (
                ("candidate", before_c, snap_c),
                ("reference", before_r, snap_r),
            ):
                try:
                    inv.check_unchanged(before, after, name)
                except InvariantViolation as exc:
                    prefix = "" if who == "candidate" else "SPEC:"
                    raise CheckFailed(f"{prefix}{check}", f"{who}: {exc}") from None
        if _normal(out_r.value) != _normal(out_c.value):
            raise CheckFailed(
                f"DIFF-RESULT({name})",
                f"reference {out_r.describe()}, candidate {out_c.describe()}",
            )
        self._check_states(name, snap_r, snap_c)
        self._snap_r, self._snap_c = snap_r, snap_c
        self._views = {v.seq_id: v for v in snap_r.sequences}
        return out_r

    @staticmethod
    def _check_invariants(name: str, snap_r: CacheState | None, snap_c: CacheState) -> None:
        for prefix, snap in (("", snap_c), ("SPEC:", snap_r)):
            if snap is None:
                continue
            found = inv.violations(snap)
            if found:
                who = "candidate" if not prefix else "reference"
                raise CheckFailed(
                    prefix + found[0].invariant,
                    f"after {name}, {who}: " + "; ".join(str(v) for v in found),
                )

    def _check_states(self, name: str, snap_r: CacheState, snap_c: CacheState) -> None:
        fields = self.compared_fields
        if (
            fields is None
            and snap_r == snap_c
            and _normal(snap_r.pending_events) == _normal(snap_c.pending_events)
        ):
            return
        for field in attrs.fields(CacheState):
            if fields is not None and field.name not in fields:
                continue
            r, c = getattr(snap_r, field.name), getattr(snap_c, field.name)
            if _normal(r) == _normal(c):
                continue
            detail = f"reference {r!r}\ncandidate {c!r}"
            if isinstance(r, tuple) and isinstance(c, tuple) and len(r) == len(c):
                for x, y in zip(r, c, strict=True):
                    if _normal(x) != _normal(y):
                        detail = f"first difference: reference {x!r}, candidate {y!r}"
                        break
            raise CheckFailed(f"DIFF-STATE({field.name})", f"after {name}: {detail}")

    def _check_match(self, req: Request, match: Match, what: str) -> None:
        for prefix, snap in (("", self._snap_c), ("SPEC:", self._snap_r)):
            if snap is None:
                continue
            try:
                inv.check_match(snap, req, match)
            except InvariantViolation as exc:
                raise CheckFailed(prefix + "INV-MATCH", f"{what}: {exc}") from None

    def _new_id(self) -> SeqId:
        n = self._next_id
        self._next_id += 1
        return f"r{n}" if n % 3 == 2 else n

    def _view(self, seq_id: SeqId) -> SeqView | None:
        return self._views.get(seq_id)

    def _ns(self, ns: int) -> Namespace:
        return self.namespaces[ns % len(self.namespaces)]

    def _prune_seqs(self) -> None:
        """Drop ids that are no longer live from the bundle (freed in a batch or a reset)."""
        bundle = self.bundle("seqs")  # type: ignore[no-untyped-call]
        values = getattr(self, "names_to_values", None)
        if values is None:  # pragma: no cover - other Hypothesis internals
            return
        bundle[:] = [ref for ref in bundle if values[ref.name] in self._views]

    def _remember(self, seq_ids: list[SeqId]) -> None:
        """Keep the histories of sequences about to be freed, for multi-turn re-admission."""
        for seq_id in seq_ids:
            view = self._view(seq_id)
            if view is None:
                continue
            req = self._requests.get(seq_id)
            spans = req.spans if req is not None else ()
            self._history.append((self._seq_ns.get(seq_id, 0), view.token_ids, spans))
            self._freed.append(seq_id)
        del self._history[:-16]
        del self._freed[:-16]

    # -- composite steps -------------------------------------------------------------------

    def _admit(
        self, req: Request, budget: int | None, *, only_if_possible: bool
    ) -> Admission | None:
        """match -> can_admit -> admit, checking that the three agree."""
        m = self._op("match", lambda c: c.match(req), pure=True)
        if m.raised:
            return None
        self._check_match(req, m.value, "match before admit")
        can = self._op("can_admit", lambda c: c.can_admit(req, budget), pure=True)
        if can.raised or (only_if_possible and not can.value):
            return None
        out = self._op("admit", lambda c: c.admit(req, budget))
        if can.value != (not out.raised):
            raise CheckFailed(
                "CAN-ADMIT", f"can_admit said {can.value}, then admit {out.describe()}"
            )
        if out.raised:
            return None
        adm: Admission = out.value
        k = adm.num_cached_tokens // self.block_size
        if adm.num_cached_tokens != m.value.num_cached_tokens or adm.block_ids[:k] != tuple(
            m.value.block_ids
        ):
            raise CheckFailed("ADMIT-MATCH", f"match {m.value!r} but admission {adm!r}")
        admission_checks(self, req, m.value, adm)
        hit = Match(req.num_tokens, adm.num_cached_tokens, adm.block_ids[:k])
        self._check_match(req, hit, "admission")
        self._seq_ns[req.seq_id] = self.namespaces.index(req.namespace)
        self._requests[req.seq_id] = req
        self._note_request(req)
        return adm

    def _append(self, seq_id: SeqId, n: int, *, only_if_possible: bool) -> bool:
        can = self._op("can_append", lambda c: c.can_append(seq_id, n), pure=True)
        if can.raised or (only_if_possible and not can.value):
            return False
        out = self._op("append", lambda c: c.append(seq_id, n))
        if can.value != (not out.raised):
            raise CheckFailed(
                "CAN-APPEND", f"can_append said {can.value}, then append {out.describe()}"
            )
        return not out.raised

    def _reserve(self, seq_id: SeqId, n: int) -> bool:
        """Append ``n`` slots; when the pool is full, preempt the newest other sequence."""
        if self._append(seq_id, n, only_if_possible=True):
            return True
        victims = [s for s in self._views if s != seq_id]
        if not victims:
            return False
        self._free([victims[-1]])
        return self._append(seq_id, n, only_if_possible=True)

    def _commit(self, seq_id: SeqId, n: int, accepted: tuple[int, ...]) -> bool:
        return not self._op("commit", lambda c: c.commit(seq_id, n, accepted)).raised

    def _commit_prefill(self, seq_id: SeqId, adm: Admission, sampled: tuple[int, ...]) -> None:
        """The forward over the scheduled tokens ran; a token is sampled if the prompt ended."""
        view = self._view(seq_id)
        assert view is not None
        done = adm.num_cached_tokens + adm.num_scheduled_tokens == len(view.token_ids)
        self._commit(seq_id, adm.num_scheduled_tokens, sampled[:1] if done else ())

    def _advance(self, seq_id: SeqId, k: int, a: int, sampled: tuple[int, ...]) -> None:
        """One engine step for ``seq_id``: the next prefill chunk, or a speculative decode.

        Decode: reserve slots for the unwritten known token plus ``k`` drafts, accept ``a``
        of them plus a bonus token, commit, and roll the rejected drafts back.
        """
        view = self._view(seq_id)
        if view is None:
            return
        c, r, known = view.num_computed, view.num_reserved, len(view.token_ids)
        by_chunks = view.kv_token_limit is not None or k % 2 == 0
        if self.caps.chunked_prefill and r < view.num_prompt_tokens and by_chunks:
            # prefill by chunks (choice 8); odd k on an unlimited sequence grows by append
            self._prefill_step(seq_id, k + 1, sampled)
            return
        pending = known - c
        if pending >= 2:  # prefill, chunk by chunk
            chunk = min(pending, k + 1)
            if r < c + chunk and not self._reserve(seq_id, c + chunk - r):
                return
            self._commit(seq_id, chunk, sampled[:1] if c + chunk == known else ())
            return
        if r < c + pending + k and not self._reserve(seq_id, c + pending + k - r):
            return
        a = min(a, k)
        accepted = (sampled * (a + 1))[: a + 1]
        if not self._commit(seq_id, pending + a, accepted):
            return
        view = self._view(seq_id)
        assert view is not None
        unwritten = view.num_reserved - view.num_computed
        if unwritten:
            self._op("rollback", lambda cache: cache.rollback(seq_id, unwritten))

    def _free(self, seq_ids: list[SeqId]) -> bool:
        self._remember(seq_ids)
        out = self._op("free", lambda c: c.free(list(seq_ids)))
        self._prune_seqs()
        return not out.raised

    # -- initialization --------------------------------------------------------------------
    # build_machine adds the @initialize rule, with the pool shapes it was asked for.

    # -- admission rules -------------------------------------------------------------------

    @rule(target=seqs, ns=namespace_ids(), tokens=prompts(), budget=budgets())
    @counted
    def admit(self, ns: int, tokens: tuple[int, ...], budget: int | None) -> Any:
        """match, can_admit and admit a fresh sequence (admit even when it cannot fit)."""
        req = Request(self._new_id(), tokens, self._ns(ns))
        adm = self._admit(req, budget, only_if_possible=False)
        return multiple() if adm is None else req.seq_id

    @rule(
        target=seqs,
        ns=namespace_ids(),
        tokens=prompts(),
        n=st.integers(2, 3),
        steps=st.integers(0, 4),
        sampled=sampled_tokens(),
        finish=st.sampled_from(["none", "first", "group"]),
    )
    @counted
    def parallel_sampling(
        self,
        ns: int,
        tokens: tuple[int, ...],
        n: int,
        steps: int,
        sampled: tuple[int, ...],
        finish: str,
    ) -> Any:
        """Parallel sampling: one prompt admitted ``n`` times in one step (same-step duplicate
        prompts), prefilled together, then each sample decodes its own tokens. ``finish``:
        the first sample finishes early, or the whole group finishes in one batched free
        (the samples share their prompt blocks: each must be released once per holder)."""
        admitted: list[tuple[SeqId, Admission]] = []
        for _ in range(n):
            req = Request(self._new_id(), tokens, self._ns(ns))
            adm = self._admit(req, None, only_if_possible=True)
            if adm is not None:
                admitted.append((req.seq_id, adm))
        for i, (seq_id, adm) in enumerate(admitted):
            self._commit_prefill(seq_id, adm, sampled[i % len(sampled) :] + sampled)
        live = [seq_id for seq_id, _ in admitted]
        if finish == "first" and live:
            self._free(live[:1])
            live = live[1:]
        for step in range(steps):
            for i, seq_id in enumerate(live):
                rotated = sampled[(i + step) % len(sampled) :] + sampled
                self._advance(seq_id, 1, 1, rotated)
        if finish == "group" and live:
            self._free([seq_id for seq_id in live if seq_id in self._views])
            live = []
        return multiple(*(seq_id for seq_id in live if seq_id in self._views))

    @rule(
        target=seqs,
        ns=namespace_ids(),
        tokens=prompts(),
        budget=budgets(),
        steps=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=3),
        sampled=sampled_tokens(),
        finish=st.booleans(),
    )
    @counted
    def engine_step(
        self,
        ns: int,
        tokens: tuple[int, ...],
        budget: int | None,
        steps: list[tuple[int, int]],
        sampled: tuple[int, ...],
        finish: bool,
    ) -> Any:
        """A request's life in an engine: admit, prefill (chunked), speculative decode
        steps, and (if ``finish``) completion."""
        req = Request(self._new_id(), tokens, self._ns(ns))
        adm = self._admit(req, budget, only_if_possible=True)
        if adm is None:
            return multiple()
        self._commit_prefill(req.seq_id, adm, sampled)
        for k, a in steps:
            self._advance(req.seq_id, k, a, sampled)
        if finish and req.seq_id in self._views:
            self._free([req.seq_id])
            return multiple()
        return req.seq_id if req.seq_id in self._views else multiple()

    @rule(target=seqs, seq=seqs, slack=st.integers(-1, 1), filler=st.integers(1, 4))
    @counted
    def admit_at_the_edge(self, seq: SeqId, slack: int, filler: int) -> Any:
        """Share a live sequence's computed blocks in a prompt sized to the pool's edge.

        The new blocks it needs are the free and evictable blocks, ``slack`` more or less.
        Hits on blocks a live sequence holds cost no supply, so this is where a
        ``can_admit`` (or an ``admit``) that counts them as new allocations is wrong.
        """
        view = self._view(seq)
        snap = self._snap_c
        if view is None or snap is None:
            return multiple()
        bs = self.block_size
        shared = view.token_ids[: min(view.num_computed, len(view.token_ids)) // bs * bs]
        supply = snap.stats.num_free_blocks + snap.stats.num_cached_blocks
        new = max(1, (supply + slack) * bs - bs // 2)
        req = Request(self._new_id(), shared + (filler,) * new, self._ns(self._seq_ns.get(seq, 0)))
        adm = self._admit(req, None, only_if_possible=False)
        return multiple() if adm is None else req.seq_id

    @rule(ns=namespace_ids(), tokens=prompts(), repeats=st.integers(1, 6))
    @counted
    def hot_prefix(self, ns: int, tokens: tuple[int, ...], repeats: int) -> None:
        """A hot prompt: many short requests, one after another, each admitted (a hit after
        the first), prefilled and finished. Cached blocks are released over and over."""
        for i in range(repeats):
            req = Request(self._new_id(), tokens, self._ns(ns))
            adm = self._admit(req, None, only_if_possible=True)
            if adm is None:
                return
            self._commit_prefill(req.seq_id, adm, (i % 4 + 1,))
            self._free([req.seq_id])

    @rule(target=seqs, seq=consumes(seqs), budget=budgets(), sampled=sampled_tokens())
    @counted
    def preempt(self, seq: SeqId, budget: int | None, sampled: tuple[int, ...]) -> Any:
        """Preemption: free a sequence, then re-admit it under the same id to recompute."""
        view = self._view(seq)
        if view is None:
            return multiple()
        ns = self._seq_ns.get(seq, 0)
        self._free([seq])
        req = self._requests.get(seq)
        again = (
            Request(seq, view.token_ids, self._ns(ns))
            if req is None
            else attrs.evolve(req, token_ids=view.token_ids)
        )
        adm = self._admit(again, budget, only_if_possible=True)
        if adm is None:
            return multiple()
        self._commit_prefill(seq, adm, sampled)
        return seq

    @rule(target=seqs, pick=st.integers(0, 15), extra=sampled_tokens(), budget=budgets())
    @counted
    def next_turn(self, pick: int, extra: tuple[int, ...], budget: int | None) -> Any:
        """Multi-turn: re-admit a finished sequence's history plus new user tokens."""
        if not self._history:
            self._history.append((0, (7, 7, 7), ()))
        ns, tokens, spans = self._history[pick % len(self._history)]
        req = Request(self._new_id(), tokens + extra, self._ns(ns), spans=spans)
        adm = self._admit(req, budget, only_if_possible=True)
        if adm is None:
            return multiple()
        self._commit_prefill(req.seq_id, adm, extra)
        return req.seq_id

    # -- growth, commit, rollback ----------------------------------------------------------

    @rule(
        seq=seqs,
        k=st.integers(0, 4),
        a=st.integers(0, 4),
        sampled=sampled_tokens(),
    )
    @counted
    def advance(self, seq: SeqId, k: int, a: int, sampled: tuple[int, ...]) -> None:
        """The next engine step of a live sequence: a prefill chunk or a speculative decode."""
        self._advance(seq, k, a, sampled)

    @rule(seq=seqs, n=st.integers(1, 6))
    @counted
    def append(self, seq: SeqId, n: int) -> None:
        """can_append then append several slots (append even when it cannot fit)."""
        self._append(seq, n, only_if_possible=False)

    @rule(seq=seqs, n=st.integers(0, 7), accepted=st.lists(st.integers(1, 4), max_size=3))
    @counted
    def commit(self, seq: SeqId, n: int, accepted: list[int]) -> None:
        """Commit ``n`` slots with some accepted tokens; ``n`` is clamped to what is valid,
        except that ``n == 7`` commits one slot past the reservation (an engine error)."""
        view = self._view(seq)
        if view is None:
            return
        unwritten = view.num_reserved - view.num_computed
        if n == 7:
            self._commit(seq, unwritten + 1, tuple(accepted) or (1,))
            return
        known = len(view.token_ids) + len(accepted)
        n = max(0, min(n, unwritten, known - view.num_computed))
        self._commit(seq, n, tuple(accepted))

    @rule(seq=seqs, n=st.integers(1, 6))
    @counted
    def rollback(self, seq: SeqId, n: int) -> None:
        """Roll back up to ``n`` unwritten slots (reserve some first if there are none)."""
        view = self._view(seq)
        if view is None:
            return
        unwritten = view.num_reserved - view.num_computed
        if not unwritten:
            if not self._append(seq, n, only_if_possible=True):
                return
            unwritten = n
        n = min(n, unwritten)
        self._op("rollback", lambda c: c.rollback(seq, n))

    # -- release, eviction, reset ----------------------------------------------------------

    @rule(first=consumes(seqs), more=st.integers(0, 2))
    @counted
    def free(self, first: SeqId, more: int) -> None:
        """Batched free of ``first`` and up to ``more`` other live sequences."""
        others = [s for s in self._views if s != first][-more:] if more else []
        self._free([first, *others])

    @rule(n=st.integers(0, 4))
    @counted
    def evict(self, n: int) -> None:
        """Evict up to ``n`` cached leaves."""
        self._op("evict", lambda c: c.evict(n))

    @precondition(lambda self: self.caps.reset)
    @rule(mode=st.sampled_from(["preserve", "full", "drain_then_full"]))
    @counted
    def reset(self, mode: str) -> None:
        """reset(preserve_cache=True), a full reset (refused while live), or both in turn."""
        if mode != "full":
            self._remember(list(self._views))
            self._op("reset", lambda c: c.reset(preserve_cache=True))
            self._prune_seqs()
        if mode != "preserve":
            self._op("reset", lambda c: c.reset(preserve_cache=False))

    # -- queries ---------------------------------------------------------------------------

    @rule(ns=namespace_ids(), tokens=prompts())
    @counted
    def match(self, ns: int, tokens: tuple[int, ...]) -> None:
        """A pure match, checked against INV-MATCH."""
        req = Request("probe", tokens, self._ns(ns))
        out = self._op("match", lambda c: c.match(req), pure=True)
        if not out.raised:
            self._check_match(req, out.value, "match")

    @rule(seq=seqs)
    @counted
    def inspect(self, seq: SeqId) -> None:
        """block_table and num_computed_tokens of a live sequence."""
        self._op("block_table", lambda c: c.block_table(seq), pure=True)
        self._op("num_computed_tokens", lambda c: c.num_computed_tokens(seq), pure=True)

    @rule()
    @counted
    def observe(self) -> None:
        """seq_ids and stats."""
        self._op("seq_ids", lambda c: c.seq_ids(), pure=True)
        self._op("stats", lambda c: c.stats(), pure=True)

    @rule()
    @counted
    def take_events(self) -> None:
        """Drain the KV events (the state check compares the pending ones every step)."""
        self._op("take_events", lambda c: c.take_events())

    # -- bad inputs ------------------------------------------------------------------------

    def _ghost(self) -> SeqId:
        """An id that is not live: a freed one when there is one, else one never used."""
        for seq_id in reversed(self._freed):
            if seq_id not in self._views:
                return seq_id
        return "ghost"

    @precondition(bad_inputs_due)
    @rule(kind=st.sampled_from(BAD_SEQUENCE_KINDS), seq=seqs, tokens=prompts())
    @counted
    def bad_sequence_op(self, kind: str, seq: SeqId, tokens: tuple[int, ...]) -> None:
        """Unknown ids, double frees, duplicates in a batch, an id admitted twice."""
        self._since_bad = 0
        if kind.endswith("continue_prefill") and not self.caps.chunked_prefill:
            return
        type(self).coverage.variants[f"bad_sequence_op:{kind}"] += 1
        ghost = self._ghost()
        ops: dict[str, Callable[[Any], Any]] = {
            "unknown:append": lambda c: c.append(ghost, 1),
            "unknown:can_append": lambda c: c.can_append(ghost, 1),
            "unknown:commit": lambda c: c.commit(ghost, 0, (1,)),
            "unknown:rollback": lambda c: c.rollback(ghost, 1),
            "unknown:continue_prefill": lambda c: c.continue_prefill(ghost),
            "unknown:block_table": lambda c: c.block_table(ghost),
            "unknown:num_computed_tokens": lambda c: c.num_computed_tokens(ghost),
            "unknown:free": lambda c: c.free([ghost]),
            "double_free": lambda c: c.free([seq, seq]),
            "free_unknown_in_batch": lambda c: c.free([seq, ghost]),
            "free_one_id": lambda c: c.free(str(seq)),
            "free_not_iterable": lambda c: c.free(12345),
            "bad_seq_id_type": lambda c: c.block_table(1.5),
        }
        if kind == "admit_live_id":
            req = Request(seq, tokens, self._ns(self._seq_ns.get(seq, 0)))
            self._op("can_admit", lambda c: c.can_admit(req), pure=True)
            self._op("admit", lambda c: c.admit(req), must_raise=DuplicateSequence)
        else:
            self._op(kind.split(":")[-1], ops[kind], must_raise=_SEQUENCE_ERRORS[kind])
        self._rule_raised = True

    @precondition(bad_inputs_due)
    @rule(
        kind=st.sampled_from(BAD_ARGUMENT_KINDS),
        seq=seqs,
        count=st.sampled_from(BAD_COUNTS),
        accepted=st.sampled_from(BAD_ACCEPTED),
    )
    @counted
    def bad_argument(self, kind: str, seq: SeqId, count: Any, accepted: Any) -> None:
        """Out-of-range counts, over-committing, over-rolling-back, bad tokens, overflow."""
        self._since_bad = 0
        type(self).coverage.variants[f"bad_argument:{kind}"] += 1
        view = self._view(seq)
        assert view is not None and self.cfg is not None
        c, r, known = view.num_computed, view.num_reserved, len(view.token_ids)
        req = Request(self._new_id(), (1, 2, 3), self._ns(0))
        over = Request(
            self._new_id(), (1, 2, 3) * (self.cfg.num_blocks * self.cfg.block_size), self._ns(1)
        )
        ops: dict[str, Callable[[Any], Any]] = {
            "append": lambda x: x.append(seq, count),
            "can_append": lambda x: x.can_append(seq, count),
            "commit": lambda x: x.commit(seq, count),
            "rollback": lambda x: x.rollback(seq, count),
            "evict": lambda x: x.evict(count),
            "admit_budget": lambda x: x.admit(req, count),
            "can_admit_budget": lambda x: x.can_admit(req, count),
            "commit_past_reserved": lambda x: x.commit(
                seq, r - c + 1, (1,) * max(1, r - known + 1)
            ),
            "commit_unknown_tokens": lambda x: x.commit(seq, known - c + 1),
            "rollback_past_computed": lambda x: x.rollback(seq, r - c + 1),
            "accepted_tokens": lambda x: x.commit(seq, 0, accepted),
            "reset_flag": lambda x: x.reset(preserve_cache=1),
            "admit_over_capacity": lambda x: x.admit(over),
        }
        if kind == "commit_unknown_tokens" and r - c < known - c + 1:
            # Not enough reserved slots to reach past the known tokens: reserve them first.
            self._append(seq, known - r + 1, only_if_possible=True)
        if kind == "admit_over_capacity":
            can = self._op("can_admit", lambda x: x.can_admit(over), pure=True)
            if can.value:
                raise CheckFailed(
                    "CAN-ADMIT", f"can_admit({over!r}) is True for an oversize prompt"
                )
        pure = kind.startswith("can_")
        out = self._op(kind, ops[kind], pure=pure, must_raise=_ARGUMENT_ERRORS.get(kind))
        if kind.startswith("admit") and not out.raised:  # count=None is a valid budget
            self._op("free", lambda x: x.free([req.seq_id]))
        self._rule_raised = True

    @precondition(bad_inputs_due)
    @rule(
        kind=st.sampled_from(BAD_REQUEST_KINDS),
        bad=st.sampled_from(BAD_REQUEST_ARGS),
        obj=st.sampled_from(NOT_A_REQUEST),
    )
    @counted
    def bad_request(self, kind: str, bad: dict[str, Any], obj: Any) -> None:
        """Malformed requests and namespaces raise InvalidRequest; non-Requests are refused."""
        self._since_bad = 0
        type(self).coverage.variants[f"bad_request:{kind}"] += 1
        self._rule_raised = True
        if kind == "construct":
            args: dict[str, Any] = {"seq_id": 1, "token_ids": (1, 2), "namespace": self._ns(0)}
            args.update(bad)
            try:
                Request(**args)
            except InvalidRequest:
                return
            raise CheckFailed("BAD-REQUEST", f"Request(**{args!r}) did not raise InvalidRequest")
        if kind == "bad_namespace":
            for kwargs in (
                {"model": ""},
                {"model": 3},
                {"model": "m", "adapter": b"x"},
                {"model": "m", "salt": "s"},
            ):
                try:
                    Namespace(**kwargs)
                except InvalidRequest:
                    continue
                raise CheckFailed("BAD-REQUEST", f"Namespace(**{kwargs!r}) did not raise")
            return
        op = kind.split(":")[1]
        out = self._op(op, lambda c: getattr(c, op)(obj), pure=op != "admit")
        if not isinstance(out.error, InvalidRequest):
            raise CheckFailed("BAD-REQUEST", f"{op}({obj!r}) {out.describe()}")


def build_machine(
    name: str,
    make_pair: PairFactory,
    *,
    num_blocks: tuple[int, int] = (4, 24),
    block_sizes: tuple[int, int] = (1, 4),
    record_events: tuple[bool, ...] = (True, False),
    compared_fields: frozenset[str] | None = None,
    caps: Capabilities | None = None,
) -> type[DifferentialMachine]:
    """A runnable machine class driving the pair ``make_pair`` returns.

    ``num_blocks`` and ``block_sizes`` are inclusive ranges drawn once per run;
    ``record_events`` lists the event-recording settings a run may draw;
    ``compared_fields`` restricts the snapshot comparison. The class owns a
    fresh :class:`RuleCoverage` (``cls.coverage``), and ``cls.TestCase`` runs it under
    pytest or unittest.
    """

    class Machine(DifferentialMachine):
        coverage = RuleCoverage()
        namespaces = NAMESPACES

        @initialize(
            num_blocks=st.integers(*num_blocks),
            block_size=st.integers(*block_sizes),
            record_events=st.sampled_from(
                record_events if caps is None or caps.events else (False,)
            ),
        )
        @counted
        def init(self, num_blocks: int, block_size: int, record_events: bool) -> None:
            """Build the pair on a freshly drawn pool."""
            self._start(PoolConfig(num_blocks, block_size, record_events))

    Machine.make_pair = staticmethod(make_pair)  # type: ignore[method-assign,assignment]
    Machine.compared_fields = compared_fields
    Machine.caps = Capabilities() if caps is None else caps
    Machine.__name__ = Machine.__qualname__ = name
    return Machine


def all_rule_names(machine: type[DifferentialMachine]) -> list[str]:
    """Every rule and initialize rule of ``machine``, by function name."""
    state = machine.setup_state()  # type: ignore[no-untyped-call]
    return sorted(r.function.__name__ for r in (*state.rules, *state.initializers))
