"""The hybrid model's recurrent-state traffic around one engine step.

The prefix cache (:class:`~prefixkv.impl.HybridPrefixCacheManager`) decides which state
slot holds which state; the :class:`~.hybrid.RecurrentStatePool` holds the tensors. This
object moves states between them at the three points of a step, asking the cache for every
slot and position (a :class:`~prefixkv.spec.StateRef`) instead of deriving them::

    before the forward   pending_restore -> copy the checkpoint into the runtime slot,
                         restore_issued; runtime_state -> the state the forward starts
                         from (its position must be the step's start); the positions to
                         capture: the checkpoint reservation's and, in decode, every token's
    after the forward    the state at each reservation -> its checkpoint slot
    after the commit     the state after the committed tokens -> the runtime slot, and
                         keep_state tells the cache (with drafts: the state after the last
                         accepted token; a rejected draft's state is never kept)
"""

from __future__ import annotations

import attrs

from prefixkv.impl.hybrid import HybridPrefixCacheManager

from .hybrid import RecurrentState, RecurrentStatePool, StaleRecurrentState
from .runner import RunnerOutput
from .step import Kind, StepPlan

__all__ = ["RecurrentStateIO", "StepStates"]


@attrs.frozen
class StepStates:
    """What the forward of one planned step needs and must keep, row by row."""

    #: The state each row starts from (``None``: the sequence starts at position 0).
    states: list[RecurrentState | None]
    #: The positions after which each row's states must be captured.
    capture: list[list[int]]
    #: ``(row, checkpoint slot, position)`` of each checkpoint to save.
    saves: list[tuple[int, int, int]]


class RecurrentStateIO:
    """Restores, reads, checkpoint saves and kept states for one hybrid engine."""

    def __init__(self, cache: HybridPrefixCacheManager, pool: RecurrentStatePool) -> None:
        self.cache = cache
        self.pool = pool

    def before_forward(self, plan: StepPlan) -> StepStates:
        """Issue the pending restores, read each row's starting state, and list the states
        the forward must capture (see the module doc)."""
        cache, pool = self.cache, self.pool
        states: list[RecurrentState | None] = []
        capture: list[list[int]] = []
        saves: list[tuple[int, int, int]] = []
        for row, s in enumerate(plan.seqs):
            restore = cache.pending_restore(s.seq_id)
            if restore is not None:
                copied = pool.copy(restore.slot, cache.state_slot(s.seq_id))
                if copied != restore.position:
                    raise StaleRecurrentState(
                        f"checkpoint slot {restore.slot} holds the state at {copied}, the cache "
                        f"restores {s.seq_id!r} from {restore.position}"
                    )
                cache.restore_issued(s.seq_id)
                pool.restores += 1
            held = cache.runtime_state(s.seq_id)
            assert held is not None, "the restore was issued above"
            if held.position != s.start:
                raise StaleRecurrentState(
                    f"the runtime slot of {s.seq_id!r} holds the state at {held.position}, "
                    f"the step starts at {s.start}"
                )
            states.append(None if s.start == 0 else pool.read(held.slot, held.position))
            # the verification decides only at the commit how many drafts survive
            want = list(range(s.start + 1, s.end)) if s.kind is Kind.DECODE else []
            reservation = cache.checkpoint_reservation(s.seq_id)
            if reservation is not None:
                saves.append((row, *reservation))
                want.append(reservation.position)
            capture.append(want)
        return StepStates(states, capture, saves)

    def save_checkpoints(self, step: StepStates, out: RunnerOutput) -> None:
        """Write the state at each reservation into its checkpoint slot."""
        for row, slot, position in step.saves:
            self.pool.write(slot, position, out.states[row][position])
            self.pool.saves += 1

    def keep_accepted(self, plan: StepPlan, out: RunnerOutput) -> None:
        """After the commit: keep, in each live sequence's runtime slot, the state after its
        committed tokens (with drafts, after the last accepted one), and tell the cache,
        which refuses any other position."""
        cache, pool = self.cache, self.pool
        live = set(cache.seq_ids())
        for row, s in enumerate(plan.seqs):
            if s.seq_id not in live:  # finished (or preempted) at the commit
                continue
            position = cache.num_computed_tokens(s.seq_id)
            pool.write(cache.state_slot(s.seq_id), position, out.states[row][position])
            cache.keep_state(s.seq_id, position)
