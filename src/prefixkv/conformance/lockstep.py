"""The lockstep oracle: one operation on a reference and a candidate, then every check.

:class:`Lockstep` needs no Hypothesis: the state machines drive it, and so can a scripted
test or another fuzzer::

    oracle = Lockstep[BlockManagerAdapter](SpecCache(8, 2), my_adapter)  # or (None, my_adapter)
    oracle.start()
    out = oracle.op("admit", lambda c: c.admit(req))
    oracle.op("match", lambda c: c.match(req), pure=True)
    oracle.op("free", lambda c: c.free(["x"]), must_raise=UnknownSequence)

After **every operation**:

1. the candidate raised nothing but a :class:`~prefixkv.spec.PrefixCacheError`
   (``CRASH(<op>)``); with a reference (exact mode), both raised the same exception type,
   or neither did (``DIFF-RAISE``);
2. every invariant holds on the candidate's snapshot, under its declared policy
   (:func:`~prefixkv.conformance.safety.safety_violations`; ``SPEC:INV-*`` on the
   reference: a bug in the spec itself), and no admission hit a block whose KV nobody
   wrote (INV-PUBLISH, see :class:`~prefixkv.conformance.safety.KVLedger`);
3. an operation that raised, or a pure one, changed nothing on either cache, statistics
   and pending events included (``INV-TXN``, ``PURE``);
4. the return values are equal (``DIFF-RESULT``) and so are the snapshots, field by field
   (``DIFF-STATE(<field>)``);
5. ``must_raise``: the operation is invalid whatever the state and raised that error type
   (``MUST-RAISE(<op>)``).

Operations are grouped into steps, one forward pass each: :meth:`Lockstep.end_step` closes
the current one, and a cancel (``free``, ``rollback``, ``reset``) always opens a new step,
since it takes effect between steps (the step model of :mod:`.safety`). An adapter may
implement an optional ``end_step()`` hook, which is then called (and recorded in replays) at
every boundary; without one, a boundary only moves the kit's own step count.

A failure raises :class:`~prefixkv.conformance.failures.CheckFailed`. Checks named in
``ignore`` are skipped where they are evaluated (the invariants) and otherwise left to the
caller to swallow, after which :meth:`Lockstep.resync` re-reads both caches.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from typing import Any, Generic, TypeVar, cast

import attrs

from prefixkv.spec import (
    CacheBusy,
    CacheState,
    Inspectable,
    InvariantViolation,
    Match,
    OutOfBlocks,
    PrefixCacheError,
    Request,
    SeqId,
    SeqView,
)
from prefixkv.spec import invariants as inv
from prefixkv.spec.invariant_ids import InvariantId
from prefixkv.spec.invariants import Violation

from .capabilities import Capabilities
from .compare import normal, normal_events, same_state
from .events_check import EventStreams
from .failures import CheckFailed, fingerprint, is_ignored, message_shape
from .replay import CallLog, Recording
from .safety import KVLedger, root_cause_first, safety_violations

__all__ = ["CANCELS", "PLAIN_WORDS", "Lockstep", "Outcome"]

#: Errors that answer about the state (no room, sequences live), not refusals of the
#: workload: the coverage does not count them as refused.
_STATE_ANSWERS = (OutOfBlocks, CacheBusy)

#: Operations that cancel scheduled work, and so take effect between steps.
CANCELS = frozenset({"free", "rollback", "reset"})


#: The candidate: anything that renders a snapshot (the operations are whatever ``op`` calls).
A = TypeVar("A", bound=Inspectable)


@attrs.frozen
class Outcome:
    """What one operation did on one cache: a value, or an exception."""

    #: NOTE: ``Any``, not ``object``: an operation returns what its cache returns (a
    #: ``Match``, an ``Admission``, a count), and a rule reads it as that; the equality
    #: check compares the two sides' values whatever they are.
    value: Any = None
    error: BaseException | None = None

    @property
    def raised(self) -> bool:
        return self.error is not None

    def describe(self) -> str:
        if self.error is not None:
            return f"raised {type(self.error).__name__}({self.error})"
        return f"returned {self.value!r}"


def _run(fn: Callable[[A], object], cache: A) -> Outcome:
    try:
        return Outcome(value=fn(cache))
    except Exception as exc:  # the candidate may raise anything; the comparison decides
        return Outcome(error=exc)


def _end_step(cache: object) -> None:
    """The step boundary on one cache: its ``end_step()`` hook, if it has one."""
    hook = getattr(cache, "end_step", None)
    if callable(hook):
        hook()


#: Every this many operations on an unchanged state, the invariants run in full anyway (a
#: cross-check of the shortcut in :meth:`Lockstep.check_invariants`).
FULL_CHECK_EVERY = 16


#: Pure reads left out of replays once they have passed (``match`` and ``can_*`` stay:
#: they show what the candidate promised before the step that broke the promise).
_QUIET = frozenset({"seq_ids", "stats", "block_table", "num_computed_tokens"})

#: Plain words after a terse invariant message, for an engine developer who has not read
#: the spec: ``substring -> explanation``.
PLAIN_WORDS: dict[str, str] = {
    "is not published": (
        "the cache returned a block for this prompt that its own index no longer (or never) "
        "lists: a stale hash entry, a block freed or evicted after the lookup, or a block "
        "that was never published; its KV may belong to another prompt"
    ),
    "has another identity than the request": (
        "the cache served a block whose stored tokens, namespace, multimodal keys or "
        "parent differ from the prompt's: a hit trusted a hash (or a partial key) without "
        "verifying it, so the request would read another prompt's KV"
    ),
    "has refcount": (
        "the block's reference count disagrees with the number of block tables holding "
        "it: a release was counted twice or not at all, so the block will be reused "
        "while still read, or never freed"
    ),
    "is published but only": (
        "the cache made this block findable before its KV was computed. If that is the "
        "design (publish at schedule time, as vLLM v1 does), declare publish=schedule: "
        "the kit then checks instead that no request is served it once its writer is gone"
    ),
    "which is not private": (
        "a sequence is about to write KV into a block other sequences can read"
    ),
}


def _explain(message: str) -> str:
    head = message.split("\n", 1)[0]
    for key, words in PLAIN_WORDS.items():
        if key in head:
            return f"{message}\n  in plain words: {words}"
    return message


class Lockstep(Generic[A]):
    """A reference (``None``: the candidate alone, safety mode) and a candidate in lockstep.

    Generic over the adapter type ``A`` (see :mod:`.adapters`): the reference (normally a
    :class:`~prefixkv.spec.SpecCache`) and the candidate are both ``A``, since every
    operation (``op``) runs on each. ``log`` receives every candidate call as source
    (:mod:`.replay`); ``ops`` and ``op_errors`` count operations by name;
    ``raised_in_rule`` is set whenever an operation raised (the caller resets it).
    """

    def __init__(
        self,
        ref: A | None = None,
        cand: A | None = None,
        *,
        caps: Capabilities | None = None,
        compared_fields: frozenset[str] | None = None,
        ignore: Collection[str] = (),
        log: CallLog | None = None,
    ) -> None:
        self.caps = Capabilities(exact=ref is not None) if caps is None else caps
        self.compared_fields = compared_fields
        self.ignore = frozenset(ignore)
        #: The operation being checked (failures name it in their fingerprint).
        self.operation = ""
        #: Failure classes this run looked past (ignored), in order: a later failure
        #: carries them as its likely root causes (:attr:`CheckFailed.after`).
        self.suppressed: list[str] = []
        self._shapes_past: set[tuple[str, str]] = set()
        self.ops: Counter[str] = Counter()
        self.op_errors: Counter[str] = Counter()
        self.raised_in_rule = False
        #: Set whenever an operation raised something else than ``OutOfBlocks`` or
        #: ``CacheBusy``: the candidate refused the workload, not answered about the pool's
        #: room or its live sequences (the caller resets it).
        self.refused_in_rule = False
        self.log: CallLog = CallLog() if log is None else log
        self.ref: A | None = None
        self.cand: A | None = None
        self.snap_r: CacheState | None = None
        self.snap_c: CacheState | None = None
        self.views: dict[SeqId, SeqView] = {}
        self.ledger = KVLedger()
        #: The candidate state the ledger last followed (``update``) to.
        self._ledger_state: CacheState | None = None
        #: ``"" | "SPEC:"`` -> the last state every invariant was checked on and held, with
        #: the ledger's part the checks read: an operation that leaves both as they were
        #: cannot break an invariant (see :meth:`check_invariants`).
        self._clean: dict[str, tuple[CacheState, object]] = {}
        #: Operations whose invariants that shortcut skipped, and those checked in full.
        self.checks_skipped = 0
        self.checks_run = 0
        self._repeats = 0
        #: Operations that changed (or could change) a cache in the current step.
        self.step_ops = 0
        #: INV-EVENTS: the drained-event mirrors, on when the run records events.
        self.events = EventStreams(False)
        #: Called after every operation with its name and the reference's snapshots
        #: before and after (the candidate's when it runs alone).
        self.observers: list[Callable[[str, CacheState | None, CacheState | None], None]] = []
        if cand is not None:
            self.bind(ref, cand)

    # -- setup ----------------------------------------------------------------------------

    def bind(self, ref: A | None, cand: A, *, record_events: bool = False) -> None:
        """Use these caches (both freshly built) from now on; ``record_events``: they
        record KV events, and every step checks INV-EVENTS on what they emit."""
        self.ref, self.cand = ref, cand
        # the recording proxy answers every call the candidate does, and logs it
        self._recorded = cast(A, Recording(cand, self.log))
        self.ledger = KVLedger()
        self._ledger_state = None
        self._clean = {}
        self.step_ops = 0
        self.events = EventStreams(record_events)
        self.suppressed = []
        self._shapes_past = set()
        self.operation = ""

    def start(self) -> None:
        """Check the freshly built caches: same shape, every invariant."""
        if self.ref is None:
            self.snap_c = self.snapshot_candidate("construction")
            self._ledger_state = self.snap_c  # a fresh ledger: nothing allocated yet
            self.check_invariants("construction", None, self.snap_c)
        else:
            for attr in ("num_blocks", "block_size"):
                r, c = getattr(self.ref, attr), getattr(self.cand, attr)
                if r != c:
                    self.fail(f"DIFF-RESULT({attr})", f"reference {r}, candidate {c}")
            self.snap_r = self.ref.snapshot()
            self.snap_c = self.snapshot_candidate("construction")
            self.check_states("construction", self.snap_r, self.snap_c)
        self._set_views()

    def resync(self) -> None:
        """Re-read both caches after a check was ignored mid-operation."""
        if self.cand is None:
            return
        if self.ref is not None:
            self.snap_r = self.ref.snapshot()
        before = self.snap_c
        self.snap_c = self.snapshot_candidate("resync")
        if before is not None and self.ref is None:
            self.ledger.update(before, self.snap_c)
            self._ledger_state = self.snap_c
        self._set_views()

    def _set_views(self) -> None:
        snap = self.snap_r if self.ref is not None else self.snap_c
        assert snap is not None
        self.views = {v.seq_id: v for v in snap.sequences}

    # -- the public surface ---------------------------------------------------------------

    @property
    def alone(self) -> bool:
        """The candidate runs alone (safety mode)."""
        return self.ref is None

    def view(self, seq_id: SeqId) -> SeqView | None:
        """The live sequence ``seq_id`` as of the last operation."""
        return self.views.get(seq_id)

    @property
    def state(self) -> CacheState:
        """The candidate's snapshot after the last operation."""
        assert self.snap_c is not None
        return self.snap_c

    @property
    def step(self) -> int:
        """The current step (0 is the first)."""
        return self.ledger.step

    def end_step(self) -> None:
        """Close the current step: its forward pass ran (see :mod:`.safety`).

        NOTE: the adapter's ``end_step()`` hook is optional. Without it the kit only counts
        the step; with it, the hook runs as an operation like any other (every invariant
        is checked after it, and a replay shows the call), so an engine that does work per
        step (a deferred free, a batch's bookkeeping) does it where the kit expects.
        """
        if callable(getattr(self.cand, "end_step", None)):
            self.op("end_step", _end_step)
        self.ledger.end_step()
        self.step_ops = 0

    def fail(self, check: str, message: str) -> None:
        """Raise :class:`CheckFailed`, unless ``check`` or its failure class is ignored (then
        it is remembered in :attr:`suppressed`)."""
        if self._looked_past(check, message):
            return
        raise CheckFailed(
            check, _explain(message), operation=self.operation, after=tuple(self.suppressed)
        )

    def _looked_past(self, check: str, message: str) -> bool:
        """Whether a failure is ignored; if so, remember its class."""
        if not self.ignore:
            return False
        fp = fingerprint(check, self.operation, message)
        shape = (check, message_shape(message).split(": ", 1)[-1])
        # NOTE: a broken state stays broken: once a class is looked past, the same check
        # and message shape after any later operation is that failure again, not another.
        if not is_ignored(check, self.ignore, fp) and shape not in self._shapes_past:
            return False
        self._shapes_past.add(shape)
        if fp not in self.suppressed:
            self.suppressed.append(fp)
        return True

    def op(
        self,
        name: str,
        fn: Callable[[A], object],
        *,
        pure: bool = False,
        must_raise: type[Exception] | None = None,
    ) -> Outcome:
        """Run ``fn`` on both caches and check everything; returns the reference's outcome
        (the candidate's when it runs alone). ``must_raise``: the operation is invalid
        whatever the state, and must raise that error type."""
        if name in CANCELS and self.step_ops:
            self.end_step()  # a cancel takes effect between steps
        self.operation = name
        self.ops[name] += 1
        if not pure and name != "end_step":
            self.step_ops += 1
        logged = len(self.log)
        before = self.snap_r if self.ref is not None else self.snap_c
        out = (
            self._op_alone(name, fn, pure=pure)
            if self.ref is None
            else self._op_pair(name, fn, pure=pure)
        )
        if name in _QUIET and not out.raised:
            # A read that passed every check cannot have caused a later failure: keep it
            # out of the replay (runs cut short in shrinking would be full of them).
            del self.log[logged:]
        crashed = out.raised and not isinstance(out.error, PrefixCacheError)
        # (a crash is reported as CRASH(<op>) already; ignoring it must not re-report it)
        if must_raise is not None and not crashed and not isinstance(out.error, must_raise):
            self.fail(f"MUST-RAISE({name})", f"expected {must_raise.__name__}, {out.describe()}")
        after = self.snap_r if self.ref is not None else self.snap_c
        for observer in self.observers:
            observer(name, before, after)
        return out

    def check_match(self, req: Request, match: Match, what: str) -> None:
        """INV-MATCH on a match (or an admission's hit) against the state it was made on;
        alone, also that every matched block holds written KV (INV-PUBLISH)."""
        for prefix, snap in (("", self.snap_c), ("SPEC:", self.snap_r)):
            if snap is None:
                continue
            # with several copies per identity, a parent may be any copy (as INV-PUBLISH)
            by_identity = not prefix and self.caps.duplicates != "private"
            try:
                inv.check_match(snap, req, match, parents_by_identity=by_identity)
            except InvariantViolation as exc:
                self.fail(prefix + InvariantId.MATCH, f"{what}: {exc}")
        if self.ref is None and self.snap_c is not None:
            found = self.ledger.unwritten(match.block_ids, self.snap_c, what)
            if found:
                self.fail(InvariantId.PUBLISH, "; ".join(found))

    # -- the checks -----------------------------------------------------------------------

    def snapshot_candidate(self, what: str) -> CacheState:
        try:
            assert self.cand is not None, "bind a candidate first"
            snap = self.cand.snapshot()
        except Exception as exc:
            raise CheckFailed(
                "SNAPSHOT", f"candidate.snapshot() after {what} raised {exc!r}"
            ) from exc
        return snap

    def _op_alone(self, name: str, fn: Callable[[A], object], *, pure: bool) -> Outcome:
        """The candidate alone: no crash, invariants under its policy, INV-TXN, purity."""
        before = self.snap_c
        assert before is not None
        out = _run(fn, self._recorded)
        if out.raised:
            self.raised_in_rule = True
            self.refused_in_rule |= not isinstance(out.error, _STATE_ANSWERS)
            self.op_errors[name] += 1
            if not isinstance(out.error, PrefixCacheError):
                self.snap_c = self.snapshot_candidate(name)
                self._set_views()
                self.fail(f"CRASH({name})", f"candidate {out.describe()}: not a PrefixCacheError")
        snap = self.snapshot_candidate(name)
        same = same_state(before, snap)
        if same and before is self._ledger_state:
            # NOTE: following an operation that changed nothing leaves the ledger as it is
            # (KVLedger.update of a state onto itself is the identity once it followed that
            # state), and makes no hit; the copy is for a change the checks may reject.
            ledger, found = self.ledger, []
        else:
            ledger = self.ledger.copy()
            hits = ledger.update(before, snap)
            found = [Violation(InvariantId.PUBLISH, h) for h in hits]
        self.check_invariants(name, None, snap, ledger=ledger, more=found)
        self.events.after(name, "candidate", out.value, out.raised, snap)
        if (out.raised or pure) and not same:
            try:
                inv.check_unchanged(before, snap, name)
            except InvariantViolation as exc:
                self.fail(InvariantId.TXN if out.raised else "PURE", str(exc))
        self.snap_c, self.ledger, self._ledger_state = snap, ledger, snap
        self._set_views()
        return out

    def _op_pair(self, name: str, fn: Callable[[A], object], *, pure: bool) -> Outcome:
        """Reference and candidate in lockstep: everything must agree."""
        before_r, before_c = self.snap_r, self.snap_c
        assert self.ref is not None and before_r is not None and before_c is not None
        out_r = _run(fn, self.ref)
        out_c = _run(fn, self._recorded)
        if out_r.raised:
            self.raised_in_rule = True
            self.refused_in_rule |= not isinstance(out_r.error, _STATE_ANSWERS)
            self.op_errors[name] += 1
        if out_r.raised and not isinstance(out_r.error, PrefixCacheError):
            raise CheckFailed(
                f"SPEC:CRASH({name})", f"reference {out_r.describe()}"
            ) from out_r.error
        if type(out_r.error) is not type(out_c.error):
            # A candidate that raised something no check names crashed: say so, as alone.
            crashed = out_c.raised and not isinstance(out_c.error, PrefixCacheError)
            self.fail(
                f"CRASH({name})" if crashed else f"DIFF-RAISE({name})",
                f"reference {out_r.describe()}, candidate {out_c.describe()}"
                + (": not a PrefixCacheError" if crashed else ""),
            )
        snap_r = self.ref.snapshot()
        snap_c = self.snapshot_candidate(name)
        self.check_invariants(name, snap_r, snap_c)
        self.events.after(name, "candidate", out_c.value, out_c.raised, snap_c)
        self.events.after(name, "reference", out_r.value, out_r.raised, snap_r)
        if out_r.raised or pure:
            check = InvariantId.TXN if out_r.raised else "PURE"
            for who, before, after in (
                ("candidate", before_c, snap_c),
                ("reference", before_r, snap_r),
            ):
                if same_state(before, after):
                    continue
                try:
                    inv.check_unchanged(before, after, name)
                except InvariantViolation as exc:
                    prefix = "" if who == "candidate" else "SPEC:"
                    self.fail(f"{prefix}{check}", f"{who}: {exc}")
        if normal(out_r.value) != normal(out_c.value):
            self.fail(
                f"DIFF-RESULT({name})",
                f"reference {out_r.describe()}, candidate {out_c.describe()}",
            )
        self.check_states(name, snap_r, snap_c)
        self.snap_r, self.snap_c = snap_r, snap_c
        self._set_views()
        return out_r

    def check_invariants(
        self,
        name: str,
        snap_r: CacheState | None,
        snap_c: CacheState,
        *,
        ledger: KVLedger | None = None,
        more: list[Violation] | None = None,
    ) -> None:
        """Every invariant, root cause first; the candidate's under its declared policy.

        NOTE: the invariants are functions of the state, the capabilities and (the
        candidate's) the ledger's writers, written blocks and readers. So an operation that
        leaves the state and that part of the ledger equal to the last ones they all held
        on cannot break one: it is not re-checked (most operations are reads, refusals and
        no-ops). Every :data:`FULL_CHECK_EVERY`-th such operation is checked in full all
        the same, and so is the end of every run (:meth:`final_check`): an adapter whose
        snapshot shares mutable parts with the engine would otherwise go unseen.
        """
        clean = False  # the candidate's state holds every invariant
        for prefix, snap in (("", snap_c), ("SPEC:", snap_r)):
            if snap is None:
                continue
            if prefix and clean and self.caps.exact and same_state(snap_c, snap):
                # NOTE: in the exact mode the candidate's policy is prefixkv's, so its checks
                # are the reference's: on an equal state that just held them, they hold.
                self.checks_skipped += 1
                continue
            led = ledger or self.ledger
            key: object = None if prefix else (led.writer, led.written, led.readers)
            last = self._clean.get(prefix)
            if not more and last is not None and last[1] == key and same_state(last[0], snap):
                self._repeats += 1
                if self._repeats % FULL_CHECK_EVERY:
                    self.checks_skipped += 1
                    clean = not prefix
                    continue
            self.checks_run += 1
            if prefix:
                found = inv.violations(snap)
            else:
                found = root_cause_first([*(more or ()), *safety_violations(snap, self.caps, led)])
            if not found:
                clean = not prefix
                frozen = None if prefix else (dict(led.writer), set(led.written), dict(led.readers))
                self._clean[prefix] = (snap, frozen)
            else:
                self._clean.pop(prefix, None)
            who = "candidate" if not prefix else "reference"
            found = [
                v
                for v in found
                if not self._looked_past(prefix + v.invariant, f"after {name}, {who}: {v}")
            ]
            if found:
                counts = Counter(v.invariant for v in found[1:])
                also = [f"{n} x {k}" if n > 1 else k for k, n in counts.items()]
                head = f"after {name}, {who}: {found[0]}"
                rest = "; ".join(str(v) for v in found[1:])
                self.fail(
                    prefix + found[0].invariant,
                    head + (f"\n  also failing ({', '.join(also)}): {rest}" if rest else ""),
                )

    def final_check(self) -> None:
        """Every invariant on the last states, in full (the end of a run)."""
        if self.snap_c is None:
            return
        self._clean = {}
        self.check_invariants("the last operation", self.snap_r, self.snap_c)

    def check_states(self, name: str, snap_r: CacheState, snap_c: CacheState) -> None:
        """The two snapshots are equal (on ``compared_fields`` if set)."""
        fields = self.compared_fields
        if (
            fields is None
            and snap_r == snap_c
            and normal_events(snap_r.pending_events) == normal_events(snap_c.pending_events)
        ):
            return
        for field in attrs.fields(CacheState):
            if fields is not None and field.name not in fields:
                continue
            r, c = getattr(snap_r, field.name), getattr(snap_c, field.name)
            if normal(r) == normal(c):
                continue
            detail = f"reference {r!r}\ncandidate {c!r}"
            if isinstance(r, tuple) and isinstance(c, tuple) and len(r) == len(c):
                for x, y in zip(r, c, strict=True):
                    if normal(x) != normal(y):
                        detail = f"first difference: reference {x!r}, candidate {y!r}"
                        break
            self.fail(f"DIFF-STATE({field.name})", f"after {name}: {detail}")
