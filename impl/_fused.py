"""An optimization of :mod:`prefixkv.spec.steps`: fused decode steps equal to the definitions.

Each call here is one of the spec's definitions, written out so that the common decode step
skips the contract's checks when a few predicates vouch for its input, and costs no more
than its own work. Each must equal its definition:

* ``advance`` is :meth:`prefixkv.spec.steps.StepCalls.advance` (``commit``,
  ``rollback(num_rejected)``, ``append(num_reserve)``, one transaction);
* ``advance_batch`` is :func:`prefixkv.spec.steps.apply_batch` (each step ``advance``, in
  order, each atomic, up to the first that raises);
* ``advance_columns`` is :meth:`prefixkv.spec.steps.StepCalls.advance_columns`
  (``advance_batch`` of the steps :func:`prefixkv.spec.steps.check_columns` reads off the
  columns);
* ``commit``'s fast path is the semantic core's ``commit`` (the contract's
  :func:`~prefixkv.spec.contract.check_commit`, then the commit applied) for a list or
  tuple of tokens.

The differential machines hold every call shape (per call, fused, batched, columnar) to
the spec's states, outcomes and errors.

NOTE: the fused steps are a mixin (:class:`FusedSteps`) that
:class:`~prefixkv.impl.cache.PrefixCacheManager` puts in front of its semantic core
(``cache._ManagerCore``), the way the spec's ``SpecCache`` takes ``StepCalls``: ``commit``'s
fast path then falls back to the core's ``commit`` with ``super()``, and every call keeps
the cost of a method on the manager. Module functions taking the manager would cost a call
more per decode step, and the fast commit would have to stay inlined in the core's
``commit`` (its fast path is worth doing only without a call).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING

from prefixkv.spec.contract import check_growth, check_rollback
from prefixkv.spec.errors import PrefixCacheError
from prefixkv.spec.request import SeqId
from prefixkv.spec.steps import (
    BatchOutcome,
    DecodeStep,
    check_batch,
    check_columns,
    check_step_counts,
)

from ._sequence import SeqState

if TYPE_CHECKING:
    # NOTE: typed against the core it is mixed into (every field and call of the manager);
    # at run time a plain mixin, so that the core's module can import this one.
    from .cache import _ManagerCore
else:
    _ManagerCore = object

__all__ = ["FusedSteps"]

#: Builds a NamedTuple result from its fields without a Python frame.
_new_outcome = tuple.__new__

#: The outcome of a one-step batch that applied and allocated nothing (immutable, shared).
_ONE_STEP = BatchOutcome(((),))

#: The id types a batch's fast check accepts as they are (any other goes to the contract).
_PLAIN_IDS = frozenset((int, str))


def _column_of(counts: object, n: int) -> Iterable[int] | None:
    """``advance_columns``' ``num_rejected`` or ``num_reserve`` as a column of ``n``: an
    int repeated, a list or tuple of ``n`` as it is, or None (the definition checks it)."""
    if type(counts) is int:
        return repeat(counts, n)
    if (type(counts) is list or type(counts) is tuple) and len(counts) == n:
        return counts
    return None


def _applied(n: int, allocated: list[tuple[int, tuple[int, ...]]]) -> tuple[tuple[int, ...], ...]:
    """``new_blocks`` of a batch's first ``n`` steps, given (by position) the steps that
    allocated: () for every other step."""
    steps: list[tuple[int, ...]] = [()] * n
    for i, new in allocated:
        steps[i] = new
    return tuple(steps)


class FusedSteps(_ManagerCore):
    """``advance``, ``advance_batch``, ``advance_columns`` and the commit fast path (module
    doc), over the manager's semantic core."""

    # -- the commit fast path ----------------------------------------------------------------

    def commit(self, seq_id: SeqId, num_computed: int, accepted_tokens: Sequence[int] = ()) -> None:
        """The core's ``commit``, with the valid commit of a list or tuple inlined.

        Args:
            seq_id: the sequence.
            num_computed: the tokens the last forward computed.
            accepted_tokens: the tokens accepted (sampled) by that forward.
        """
        # Hot path (every decode step): the valid commit is inlined.
        seq = self._seqs.get(seq_id) if type(seq_id) is str or type(seq_id) is int else None
        # A list or tuple of tokens is checked here in a few cheap predicates, exactly those
        # of _check_commit_args (the contract's check_commit) for such a list: advance's
        # predicate at num_rejected = num_reserve = 0 (see the NOTE there); a commit that
        # completes no block is then two field updates and a token append, one that does
        # goes to _apply_commit (publication). Anything else, bad input included, takes the
        # core's checked commit, which raises the same typed errors.
        if (
            seq is not None
            and type(num_computed) is int
            and (type(accepted_tokens) is tuple or type(accepted_tokens) is list)
        ):
            held = seq.num_computed
            now = held + num_computed
            if held <= now <= seq.num_reserved and now <= len(seq.tokens) + len(accepted_tokens):
                for t in accepted_tokens:
                    if type(t) is not int or not 0 <= t <= 4294967295:  # MAX_TOKEN_ID
                        break
                else:
                    bs = self._block_size
                    if now // bs == held // bs and self._fused_inline:
                        seq.tokens.extend(accepted_tokens)
                        seq.num_computed = now
                    else:
                        self._apply_commit(seq, accepted_tokens, now)
                    return
        super().commit(seq_id, num_computed, accepted_tokens)

    # -- engine-shaped calls (prefixkv.spec.steps) -----------------------------------------

    def advance(
        self,
        seq_id: SeqId,
        num_computed: int,
        accepted_tokens: Sequence[int] = (),
        *,
        num_rejected: int = 0,
        num_reserve: int = 1,
    ) -> list[int]:
        """``commit``, ``rollback(num_rejected)``, ``append(num_reserve)``: one transaction.

        Three paths, each taken only when it applies exactly:

        * the common decode step: no rollback, the commit completes no block (nothing to
          publish), the reservation fits the blocks the sequence holds (nothing to
          allocate), the sequence is past its prompt (no chunk rule applies), and every
          argument passes its check. Then no part can raise, and the step is two counter
          updates and a token append;
        * :meth:`_advance_valid`: the same checks, but the commit publishes blocks or the
          reservation allocates (the step that completes a block and reserves the next);
        * :meth:`_advance_general` for anything else: a rollback, a prefill chunk rule, a
          reservation the supply cannot cover, and every bad input, which raises the same
          typed error as always.

        The predicates are exactly the checks' conditions, so an input that fails any check
        falls through to the general path.
        """
        # NOTE: the predicate is written out here, in the batch loop (_apply_steps) and, at
        # num_rejected = num_reserve = 0, in commit, not called from one helper: one helper
        # function for all three costs more than the fused steps are allowed to (measured in
        # docs/benchmarks.md, "The fused steps in their own layer"). tests/impl/test_fused.py
        # reads the three copies off the source and proves them one predicate: the same
        # conjuncts, modulo local names, the types checked before the values, and the same
        # check per token.
        seq = self._seqs.get(seq_id) if type(seq_id) is int or type(seq_id) is str else None
        if (
            seq is not None
            and type(num_computed) is int
            and type(num_reserve) is int
            and type(num_rejected) is int
            and not num_rejected
            and (type(accepted_tokens) is tuple or type(accepted_tokens) is list)
            and self._fused_inline
        ):
            done = seq.num_computed
            now = done + num_computed
            reserved = seq.num_reserved
            grown = reserved + num_reserve
            if (
                done <= now <= reserved
                and now <= len(seq.tokens) + len(accepted_tokens)
                and reserved <= grown
                and (reserved >= seq.prompt_len or grown == reserved)
            ):
                for t in accepted_tokens:
                    if type(t) is not int or not 0 <= t <= 4294967295:  # MAX_TOKEN_ID
                        break
                else:
                    bs = self._block_size
                    # blocks: ceil(reserved / bs), so this is "nothing to allocate"
                    if now // bs == done // bs and grown <= len(seq.blocks) * bs:
                        seq.tokens.extend(accepted_tokens)
                        seq.num_computed = now
                        seq.num_reserved = grown
                        return []
                    new = self._advance_valid(seq, accepted_tokens, now, grown)
                    if new is not None:
                        return new
        return self._advance_general(
            seq_id, num_computed, accepted_tokens, num_rejected, num_reserve
        )

    def _advance_valid(
        self, seq: SeqState, accepted: Sequence[int], now: int, grown: int
    ) -> list[int] | None:
        """A checked step without rollback that publishes or allocates: applied, returning
        the new blocks; or None, with nothing changed, when the reservation needs blocks the
        supply may not cover (:meth:`_advance_general` then raises or runs it saved).

        The caller checked every argument (the commit's to ``now`` computed, the
        reservation's to ``grown`` slots, past the prompt or not growing), so only the
        supply is left to check, exactly as :meth:`_advance_general` bounds it: the pool's
        supply less the most blocks the commit's publication can anchor
        (:meth:`_anchorable`).
        """
        bs = self._block_size
        blocks = seq.blocks
        need = -(-grown // bs) - len(blocks)
        if need > 0:
            pool = self._pool
            supply = pool.supply
            first, stop = seq.num_computed // bs, now // bs
            # NOTE: ``_anchorable`` is at most ``stop - 1``: a supply that covers the need
            # past that bound needs no closer look (a pool with room, the common case).
            if stop > first and need > supply - (stop - 1):
                supply -= self._anchorable(seq, first, stop)
            if need > supply:
                return None
        # Nothing below can raise.
        self._apply_commit(seq, accepted, now)
        seq.num_reserved = grown
        if need <= 0:
            return []
        new, _ = self._allocate(need)
        blocks.extend(new)
        return new

    def _advance_general(
        self,
        seq_id: SeqId,
        num_computed: int,
        accepted_tokens: Sequence[int],
        num_rejected: int,
        num_reserve: int,
    ) -> list[int]:
        """Every ``advance``, checked in the spec's order before anything changes.

        Everything the three calls could raise is checked first, except one case: the
        reservation needs eviction and the supply is within reach of the blocks the
        commit's publication can anchor (publishing under a *canonical twin* takes the twin
        and its unanchored ancestors out of the eviction supply; :meth:`_anchorable` bounds
        how many). Only then do the calls run under a saved copy of the state.
        """
        if (type(num_rejected) is not int or num_rejected < 0) or (
            type(num_reserve) is not int or num_reserve < 0
        ):
            check_step_counts(num_rejected, num_reserve)
        seq = self._seq(seq_id)
        accepted, new_computed = self._check_commit_args(seq, num_computed, accepted_tokens)
        bs = self._block_size
        reserved = seq.num_reserved
        if num_rejected:
            reserved = check_rollback(seq.seq_id, num_rejected, reserved, new_computed, seq.spans)
        kept = min(len(seq.blocks), -(-reserved // bs))
        need = 0
        if num_reserve:
            grown = reserved + num_reserve
            if reserved < seq.prompt_len:
                check_growth(
                    seq.seq_id,
                    reserved,
                    grown,
                    new_computed,
                    seq.prompt_len,
                    seq.kv_token_limit,
                    seq.spans,
                )
            need = -(-grown // bs) - kept
            if need > 0:
                dropped = len(seq.blocks) - kept
                supply = self._pool.supply + dropped
                if need > supply:
                    raise self._out_of_blocks(need, supply)
                first, stop = seq.num_computed // bs, new_computed // bs
                if (
                    stop > first
                    and need > supply - (stop - 1)
                    and need > supply - self._anchorable(seq, first, stop)
                ):
                    return self._advance_saved(
                        seq_id, num_computed, accepted_tokens, num_rejected, num_reserve
                    )
        # Nothing below can raise.
        if not self._fused_inline:
            # NOTE: with a checkpoint store every part must reach its hook, so the public
            # calls run in turn, in the definition's order. Every check they make
            # passed above, on the values they will see, so none of them raises and no saved
            # copy of the state is needed: a copy would cost O(pool) per decode step.
            self.commit(seq_id, num_computed, accepted_tokens)
            if num_rejected:
                self.rollback(seq_id, num_rejected)
            return self.append(seq_id, num_reserve) if num_reserve else []
        self._apply_commit(seq, accepted, new_computed)
        if num_rejected:
            seq.num_reserved = reserved
            if kept < len(seq.blocks):
                dropped_blocks = seq.blocks[kept:]
                del seq.blocks[kept:]
                self._release(dropped_blocks)
        if not num_reserve:
            return []
        seq.num_reserved = reserved + num_reserve
        if need <= 0:
            return []
        new, _ = self._allocate(need)
        seq.blocks.extend(new)
        return new

    def _anchorable(self, seq: SeqState, first: int, stop: int) -> int:
        """At most how many unanchored blocks publishing ``seq``'s blocks ``first..stop-1``
        (``stop > first``) can anchor, taking them out of the eviction supply.

        Only a block published under a *canonical twin* anchors anything new (the twin and
        its unanchored ancestors; the twins form one chain, so ``stop - 1`` at most). Its
        own parents are held, hence anchored already: when the sequence's block
        ``first - 1`` is published (or ``first`` is the root), only a twin found by this
        commit can anchor, so ``stop - 1 - first`` at most; and none at all when none of
        the blocks' keys is filed in the index (the admission computed the prompt blocks'
        keys), because then no block of the run has a twin and each is published under the
        one before it.

        NOTE: the last bound is what keeps a full pool off the saved copy of the state: the
        step that commits a prefill and reserves its first decode slot publishes a whole
        prompt's new blocks, and a pool whose supply is within that many blocks of the need
        (an engine that keeps its pool full) otherwise copied the whole state on that step.
        """
        if first and not self._pool.depth[seq.blocks[first - 1]]:
            return stop - 1
        keys = seq.prompt_keys
        if stop <= len(keys) and self._index.none_filed(keys[first:stop]):
            return 0
        return stop - 1 - first

    def _advance_saved(
        self,
        seq_id: SeqId,
        num_computed: int,
        accepted_tokens: Sequence[int],
        num_rejected: int,
        num_reserve: int,
    ) -> list[int]:
        """``advance`` by its definition, under a saved copy of the whole state."""
        saved = copy.deepcopy(self.__dict__, {id(self): self})
        try:
            self.commit(seq_id, num_computed, accepted_tokens)
            if num_rejected:
                self.rollback(seq_id, num_rejected)
            return self.append(seq_id, num_reserve) if num_reserve else []
        except PrefixCacheError:
            self.__dict__.clear()
            self.__dict__.update(saved)
            raise

    def advance_batch(self, steps: Iterable[DecodeStep]) -> BatchOutcome:
        """``advance`` per step, in order, each atomic, up to the first that raises.

        :func:`prefixkv.spec.steps.apply_batch` is the definition (the spec runs it); this
        is the same loop with :meth:`advance`'s paths written out per step, so that a step
        of a batch costs less than a call of ``advance``. The differential machines hold
        the two to the same outcomes.
        """
        return self._apply_steps(check_batch(steps))

    def advance_columns(
        self,
        seq_ids: Sequence[SeqId],
        num_computed: Sequence[int],
        accepted_tokens: Sequence[Sequence[int]],
        num_rejected: int | Sequence[int] = 0,
        num_reserve: int | Sequence[int] = 1,
    ) -> BatchOutcome:
        """``advance_batch`` of the steps given as parallel columns, without a record per
        step (:meth:`prefixkv.spec.steps.StepCalls.advance_columns` is the definition).

        The columns are checked once per batch: lists or tuples of one length, every id a
        plain int or str and none twice. Anything else goes through the definition's
        :func:`~prefixkv.spec.steps.check_columns`, which raises what the spec raises or
        returns the steps.

        Args:
            seq_ids: each step's sequence (no sequence twice).
            num_computed: each step's tokens computed by the last forward.
            accepted_tokens: each step's accepted tokens.
            num_rejected: each step's rejected drafts, or one int for every step.
            num_reserve: each step's slots to reserve, or one int for every step.

        Returns:
            What ``advance_batch`` of those steps returns.
        """
        # NOTE: the common shapes are checked here in a few predicates, the same verdicts
        # as the definition's check_columns (which anything else goes through): the steps
        # themselves are checked as they are applied, as in advance_batch.
        n = len(seq_ids) if type(seq_ids) is list or type(seq_ids) is tuple else -1
        if (
            n >= 0
            and (type(num_computed) is list or type(num_computed) is tuple)
            and (type(accepted_tokens) is list or type(accepted_tokens) is tuple)
            and len(num_computed) == n
            and len(accepted_tokens) == n
        ):
            if n == 1 and type(num_rejected) is int and type(num_reserve) is int:
                seq_id = seq_ids[0]
                if type(seq_id) is int or type(seq_id) is str:
                    # One step is one advance, each atomic: its outcome, without the loop.
                    try:
                        new = self.advance(
                            seq_id,
                            num_computed[0],
                            accepted_tokens[0],
                            num_rejected=num_rejected,
                            num_reserve=num_reserve,
                        )
                    except PrefixCacheError as exc:
                        return _new_outcome(BatchOutcome, ((), exc, seq_id))
                    return (
                        _new_outcome(BatchOutcome, ((tuple(new),), None, None))
                        if new
                        else _ONE_STEP
                    )
            elif set(map(type, seq_ids)) <= _PLAIN_IDS and len(set(seq_ids)) == n:
                rejected = _column_of(num_rejected, n)
                reserve = _column_of(num_reserve, n)
                if rejected is not None and reserve is not None:
                    return self._apply_steps(
                        zip(seq_ids, num_computed, accepted_tokens, rejected, reserve, strict=True)
                    )
        batch = check_columns(seq_ids, num_computed, accepted_tokens, num_rejected, num_reserve)
        return self._apply_steps(batch)

    def _apply_steps(
        self, steps: Iterable[tuple[SeqId, int, Sequence[int], int, int]]
    ) -> BatchOutcome:
        """The checked steps of a batch (each ``advance``'s positional arguments, every id a
        plain int or str, none twice), applied in order up to the first that raises."""
        seqs, bs = self._seqs, self._block_size
        if not self._fused_inline:
            seqs = {}  # every step takes the general path
        # The outcome holds () for a step that allocated nothing: only the others are kept,
        # by position, and the outcome is built once at the end.
        allocated: list[tuple[int, tuple[int, ...]]] = []
        i = 0
        for seq_id, num_computed, accepted_tokens, num_rejected, num_reserve in steps:
            # advance's paths and its predicate (see there), per step.
            seq = seqs.get(seq_id)  # check_batch: the id is a plain int or str
            if (
                seq is not None
                and type(num_computed) is int
                and type(num_reserve) is int
                and type(num_rejected) is int
                and not num_rejected
                and (type(accepted_tokens) is tuple or type(accepted_tokens) is list)
            ):
                done = seq.num_computed
                now = done + num_computed
                reserved = seq.num_reserved
                grown = reserved + num_reserve
                if (
                    done <= now <= reserved
                    and now <= len(seq.tokens) + len(accepted_tokens)
                    and reserved <= grown
                    and (reserved >= seq.prompt_len or grown == reserved)
                ):
                    for t in accepted_tokens:
                        if type(t) is not int or not 0 <= t <= 4294967295:  # MAX_TOKEN_ID
                            break
                    else:
                        if now // bs == done // bs and grown <= len(seq.blocks) * bs:
                            seq.tokens.extend(accepted_tokens)
                            seq.num_computed = now
                            seq.num_reserved = grown
                            i += 1
                            continue
                        new = self._advance_valid(seq, accepted_tokens, now, grown)
                        if new is not None:
                            if new:
                                allocated.append((i, tuple(new)))
                            i += 1
                            continue
            try:
                new = self._advance_general(
                    seq_id, num_computed, accepted_tokens, num_rejected, num_reserve
                )
            except PrefixCacheError as exc:
                return _new_outcome(BatchOutcome, (_applied(i, allocated), exc, seq_id))
            if new:
                allocated.append((i, tuple(new)))
            i += 1
        if allocated:
            return _new_outcome(BatchOutcome, (_applied(i, allocated), None, None))
        return _new_outcome(BatchOutcome, (((),) * i, None, None))
