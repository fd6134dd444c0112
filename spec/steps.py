"""Engine-shaped calls: one fused call per sequence per decode step, and a whole step at once.

An engine's decode step does the same three things to every running sequence: record what
the last forward wrote and which tokens were accepted (``commit``), give back the slots of
rejected draft tokens (``rollback``), and reserve the slots the next forward writes
(``append``). :meth:`StepCalls.advance` is those three calls as one transaction, and
:meth:`StepCalls.advance_batch` is ``advance`` over a whole scheduler step.

::

    advance(s, c, accepted, num_rejected=r, num_reserve=n)
        ==  commit(s, c, accepted); rollback(s, r) if r; return append(s, n) if n else []
        as one transaction: if any part raises, nothing changed (INV-TXN)

Speculative decoding with ``k`` drafts: the forward wrote the pending token and the ``k``
drafts (``k + 1`` reserved slots); ``a`` drafts were accepted plus one bonus token, so the
engine calls ``advance(s, a + 1, accepted_and_bonus, num_rejected=k - a, num_reserve=k + 1)``.

:meth:`StepCalls.advance_columns` is ``advance_batch`` with the steps given as parallel
columns (sequence ids, counts, token lists), as an engine's scheduler holds them, so that
a step costs the engine no record::

    advance_columns(ids, computed, tokens, num_rejected=r, num_reserve=n)
        ==  advance_batch([DecodeStep(ids[i], computed[i], tokens[i], r_i, n_i) ...])
        where r_i is r[i] for a column and r itself for an int (n_i likewise)

NOTE: ``advance_batch`` is *not* all-or-nothing across sequences. It applies the steps in
order, each one atomically, and stops at the first that raises: the result says exactly
which applied (a prefix of the batch), and the failing step and every step after it changed
nothing. An engine preempts the failing sequence and carries on, which an all-or-nothing
batch would force it to redo from scratch. A malformed batch (not an iterable of
:class:`DecodeStep`, or a sequence listed twice) raises before anything is applied, and so
do malformed columns (:func:`check_columns`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple

from prefixkv.errors import require_int

from .errors import DuplicateSequence, InvalidRequest, PrefixCacheError
from .request import SeqId, check_seq_id

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

__all__ = [
    "BatchOutcome",
    "DecodeStep",
    "StepCalls",
    "apply_batch",
    "check_batch",
    "check_columns",
    "check_step_counts",
]


class DecodeStep(NamedTuple):
    """One sequence's part of a scheduler step: the arguments of :meth:`StepCalls.advance`.

    Plain data, validated when applied by :func:`check_batch` and ``advance`` (so that
    building one costs an engine nothing), with the same typed errors as ``advance``.

    NOTE: a ``NamedTuple``, not an attrs class. An engine builds one per running sequence
    per step, so its construction is on the decode hot path: a frozen attrs instance costs
    about as much as the whole fused decode step (its ``__init__`` goes through
    ``object.__setattr__`` per field), a ``NamedTuple`` a fraction of that, and it stays
    immutable, hashable (when its tokens are), with a field-named repr, and it unpacks
    straight into the positional step call. What it adds: it is a tuple, so it compares
    equal to a plain tuple of the same fields and can be iterated. ``check_batch`` still
    accepts only ``DecodeStep`` items, by exact type, so a plain tuple is refused as before.
    A slotted plain class builds slightly faster but is mutable, and a frozen one costs as
    much as attrs.
    """

    seq_id: SeqId
    num_computed: int
    accepted_tokens: Sequence[int] = ()
    num_rejected: int = 0
    num_reserve: int = 1


class BatchOutcome(NamedTuple):
    """What :meth:`StepCalls.advance_batch` applied.

    ``new_blocks[i]`` is what ``advance`` returned for step ``i``, for each of the first
    ``num_applied`` steps. When ``error`` is set, step ``num_applied`` raised it and changed
    nothing, and the steps after it were not attempted.

    NOTE: a ``NamedTuple`` for the same reason as :class:`DecodeStep`: one is built per
    batch, and :func:`apply_batch` builds it through ``tuple.__new__`` without a Python
    frame.
    """

    new_blocks: tuple[tuple[int, ...], ...]
    error: PrefixCacheError | None = None
    failed_seq_id: SeqId | None = None

    @property
    def num_applied(self) -> int:
        return len(self.new_blocks)

    @property
    def ok(self) -> bool:
        return self.error is None

    def raise_for_error(self) -> None:
        """Raise the failing step's error, if any (for engines that treat it as fatal)."""
        if self.error is not None:
            raise self.error


def _check_count(value: object, what: str) -> int:
    return require_int(value, what, minimum=0, error=InvalidRequest)


def check_step_counts(num_rejected: object, num_reserve: object) -> None:
    """``num_rejected`` and ``num_reserve`` are ints >= 0 (``num_computed`` is commit's)."""
    _check_count(num_rejected, "num_rejected")
    _check_count(num_reserve, "num_reserve")


def check_batch(steps: object) -> Sequence[DecodeStep]:
    """The batch as a sequence, or ``InvalidRequest``/``DuplicateSequence`` (nothing
    applied)."""
    # NOTE: a list or tuple (what engines pass) is used as is, without the ABC checks or a
    # copy, and a one-step batch with a plain int or str id needs no duplicate check: the
    # same verdicts, without costing a decode step a microsecond.
    batch: Sequence[Any]
    if type(steps) is list or type(steps) is tuple:
        batch = steps
        if len(batch) == 1:
            step = batch[0]
            if type(step) is DecodeStep and (type(step.seq_id) is int or type(step.seq_id) is str):
                return batch
    else:
        if isinstance(steps, (str, bytes, DecodeStep)):
            raise InvalidRequest("advance_batch() takes an iterable of DecodeStep")
        if not isinstance(steps, Iterable):
            raise InvalidRequest(f"advance_batch() takes an iterable of DecodeStep, got {steps!r}")
        batch = list(steps)
    seen: set[SeqId] = set()
    for step in batch:
        if type(step) is not DecodeStep:
            raise InvalidRequest(f"advance_batch() takes DecodeStep items, got {step!r}")
        seq_id = step.seq_id
        if type(seq_id) is not str and type(seq_id) is not int:
            seq_id = check_seq_id(seq_id)
        if seq_id in seen:
            raise DuplicateSequence(f"sequence {seq_id!r} listed twice in one advance_batch()")
        seen.add(seq_id)
    return batch


def _column(value: object, what: str) -> Sequence[Any]:
    if type(value) is list or type(value) is tuple:
        return value
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise InvalidRequest(
            f"advance_columns() takes {what} as a list, tuple or array, got {value!r}"
        )
    return value


def check_columns(
    seq_ids: object,
    num_computed: object,
    accepted_tokens: object,
    num_rejected: object = 0,
    num_reserve: object = 1,
) -> Sequence[DecodeStep]:
    """The batch that ``advance_columns`` stands for (step ``i`` is ``DecodeStep(seq_ids[i],
    num_computed[i], accepted_tokens[i], r_i, n_i)``), or ``InvalidRequest`` /
    ``DuplicateSequence`` with nothing applied.

    ``seq_ids``, ``num_computed`` and ``accepted_tokens`` are sequences (a list, a tuple or
    an ``array``; not a string) of one length; ``num_rejected`` and ``num_reserve`` are each
    such a column or an int for every step. The values themselves are each step's
    arguments, checked when the step is applied, exactly as in ``advance_batch``.
    """
    columns = [
        _column(seq_ids, "seq_ids"),
        _column(num_computed, "num_computed"),
        _column(accepted_tokens, "accepted_tokens"),
    ]
    n = len(columns[0])
    for value, what in ((num_rejected, "num_rejected"), (num_reserve, "num_reserve")):
        columns.append(repeat(value, n) if type(value) is int else _column(value, what))  # type: ignore[arg-type]
    lengths = {len(c) for c in columns if not isinstance(c, repeat)}
    if len(lengths) != 1:
        raise InvalidRequest(
            f"advance_columns() takes columns of one length, got lengths {sorted(lengths)}"
        )
    return check_batch([DecodeStep(*row) for row in zip(*columns, strict=True)])


#: ``step(seq_id, num_computed, accepted_tokens, num_rejected, num_reserve)``: ``advance``
#: with every argument positional (a :class:`DecodeStep` unpacked), returning the new blocks.
StepFn = Callable[[SeqId, int, Sequence[int], int, int], Sequence[int]]

_new_outcome = tuple.__new__


def apply_batch(step: StepFn, steps: object) -> BatchOutcome:
    """``advance_batch`` over any cache's own positional ``advance``: check the batch, then
    apply each step in order, each atomic, up to the first that raises (module doc). Both
    caches call this, so the batch semantics are written once."""
    batch = check_batch(steps)
    done: list[tuple[int, ...]] = []
    for item in batch:
        try:
            new = step(*item)
        except PrefixCacheError as exc:
            return _new_outcome(BatchOutcome, (tuple(done), exc, item[0]))
        done.append(tuple(new))
    return _new_outcome(BatchOutcome, (tuple(done), None, None))


class StepCalls:
    """``advance`` and ``advance_batch`` by their definition: the per-call API, in one
    transaction. The spec uses this as is; :class:`prefixkv.impl.PrefixCacheManager` has
    its own, faster ``advance`` with the same observable behaviour.
    """

    if TYPE_CHECKING:

        def _transaction(self) -> AbstractContextManager[None]: ...

        def commit(
            self, seq_id: SeqId, num_computed: int, accepted_tokens: Sequence[int] = ()
        ) -> Any: ...

        def rollback(self, seq_id: SeqId, num_tokens: int) -> None: ...

        def append(self, seq_id: SeqId, num_tokens: int) -> list[int]: ...

    def advance(
        self,
        seq_id: SeqId,
        num_computed: int,
        accepted_tokens: Sequence[int] = (),
        *,
        num_rejected: int = 0,
        num_reserve: int = 1,
    ) -> list[int]:
        """Commit, roll back the rejected drafts, reserve the next slots: one transaction.

        Returns the block ids the reservation added (see the module doc).
        """
        return self._step(seq_id, num_computed, accepted_tokens, num_rejected, num_reserve)

    def _step(
        self,
        seq_id: SeqId,
        num_computed: int,
        accepted_tokens: Sequence[int],
        num_rejected: int,
        num_reserve: int,
    ) -> list[int]:
        """``advance`` with every argument positional (what :func:`apply_batch` calls)."""
        with self._transaction():
            check_step_counts(num_rejected, num_reserve)
            self.commit(seq_id, num_computed, accepted_tokens)
            if num_rejected:
                self.rollback(seq_id, num_rejected)
            return self.append(seq_id, num_reserve) if num_reserve else []

    def advance_batch(self, steps: Iterable[DecodeStep]) -> BatchOutcome:
        """``advance`` for each step in order, up to the first that raises (module doc)."""
        return apply_batch(self._step, steps)

    def advance_columns(
        self,
        seq_ids: Sequence[SeqId],
        num_computed: Sequence[int],
        accepted_tokens: Sequence[Sequence[int]],
        num_rejected: int | Sequence[int] = 0,
        num_reserve: int | Sequence[int] = 1,
    ) -> BatchOutcome:
        """``advance_batch`` of the steps given as parallel columns (module doc).

        Args:
            seq_ids: each step's sequence (no sequence twice).
            num_computed: each step's tokens computed by the last forward.
            accepted_tokens: each step's accepted tokens.
            num_rejected: each step's rejected drafts, or one int for every step.
            num_reserve: each step's slots to reserve, or one int for every step.

        Returns:
            What ``advance_batch`` of those steps returns: the applied prefix, and the
            first failing step's error and sequence.
        """
        batch = check_columns(seq_ids, num_computed, accepted_tokens, num_rejected, num_reserve)
        return apply_batch(self._step, batch)
