"""Composite protocol steps: what an engine does with a cache, as sequences of operations.

Every step goes through the oracle and adds the checks that tie operations together:
``can_admit``/``can_append``/``can_continue_prefill`` must predict the operation that
follows on the same cache (``CAN-ADMIT``, ``CAN-APPEND``, ``CAN-CONTINUE``), and a yes must
be keepable by the counts on the candidate's snapshot (:mod:`prefixkv.conformance.room`:
checked before the operation runs, so a broken promise is named, not a crash), an admission
must attach exactly the blocks the match just before it found (``ADMIT-MATCH``), and lost
reuse must add up (``LOST``). Steps honour the declared capabilities: without
``speculative`` a decode step grows one token and rolls nothing back; without
``partial_admission`` every admission schedules its whole prompt.
"""

from __future__ import annotations

from collections.abc import Callable

from prefixkv.spec import Admission, LostReuse, Match, Request, SeqId

from ..room import Room, admission_room, append_room, continue_room
from .base import MachineBase

__all__ = ["ProtocolSteps", "admission_checks"]


class ProtocolSteps(MachineBase):
    """The composite steps rules are written in."""

    def _admit(
        self, req: Request, budget: int | None, *, only_if_possible: bool
    ) -> Admission | None:
        """match -> can_admit -> admit, checking that the three agree. Without
        ``partial_admission`` the budget is dropped: the whole prompt is scheduled."""
        if not self.caps.partial_admission:
            budget = None
        elif budget is not None:
            budget *= self.scale
        m = self.oracle.op("match", lambda c: c.match(req), pure=True)
        if m.raised:
            return None
        self.oracle.check_match(req, m.value, "match before admit")
        can = self.oracle.op("can_admit", lambda c: c.can_admit(req, budget), pure=True)
        if can.raised or (only_if_possible and not can.value):
            return None
        if can.value:
            room = admission_room(self.oracle.state, req, budget, m.value)
            self._promise(
                "CAN-ADMIT",
                room,
                lambda: (
                    f"admit({req.seq_id!r}, {budget}): a prompt of {req.num_tokens} tokens, "
                    f"{m.value.num_cached_tokens} cached in blocks {m.value.block_ids}"
                ),
            )
        supply = self._supply()
        out = self.oracle.op("admit", lambda c: c.admit(req, budget))
        if can.value != (not out.raised):
            self.oracle.fail(
                "CAN-ADMIT",
                f"can_admit said {can.value}, then admit {out.describe()}: a prompt of "
                f"{req.num_tokens} tokens ({-(-req.num_tokens // self.block_size)} blocks), "
                f"{m.value.num_cached_tokens} tokens matched in {len(m.value.block_ids)} "
                f"blocks, budget {budget}; the pool had {supply}",
            )
        if out.raised:
            return None
        adm: Admission = out.value
        k = adm.num_cached_tokens // self.block_size
        if adm.num_cached_tokens != m.value.num_cached_tokens or adm.block_ids[:k] != tuple(
            m.value.block_ids
        ):
            self.oracle.fail("ADMIT-MATCH", f"match {m.value!r} but admission {adm!r}")
        admission_checks(self, req, m.value, adm)
        hit = Match(req.num_tokens, adm.num_cached_tokens, adm.block_ids[:k])
        self.oracle.check_match(req, hit, "admission")
        self._seq_ns[req.seq_id] = self.namespaces.index(req.namespace)
        self._requests[req.seq_id] = req
        self._note_request(req)
        return adm

    def _promise(self, check: str, room: Room | None, asked: Callable[[], str]) -> None:
        """A room query said True: fail ``check`` with the counts, before the operation runs,
        when the promise cannot be kept (:mod:`prefixkv.conformance.room`); ``asked`` renders
        the operation's call for the message."""
        # NOTE: checked before the operation, not by reading its crash afterwards: the
        # promise is broken whatever the cache then does (crash, refuse, or evict a block a
        # sequence reads), and the replay ends at the query that made it.
        if room is not None and room.short:
            self.oracle.fail(check, room.broken(asked()))

    def _supply(self) -> str:
        """The pool's occupancy in words, for messages that show the counts involved."""
        st = self.oracle.state.stats
        return (
            f"{st.num_free_blocks} free, {st.num_cached_blocks} cached (evictable) and "
            f"{st.num_used_blocks} used blocks of {self.block_size} tokens"
        )

    def _append(self, seq_id: SeqId, n: int, *, only_if_possible: bool) -> bool:
        view = self.oracle.view(seq_id)
        can = self.oracle.op("can_append", lambda c: c.can_append(seq_id, n), pure=True)
        if can.raised or (only_if_possible and not can.value):
            return False
        if can.value:
            room = append_room(self.oracle.state, seq_id, n)
            self._promise(
                "CAN-APPEND",
                room,
                lambda: (
                    f"append({seq_id!r}, {n}): the sequence holds "
                    f"{view.num_reserved if view else '?'} slots in blocks "
                    f"{view.block_ids if view else '?'}"
                ),
            )
        supply = self._supply()
        out = self.oracle.op("append", lambda c: c.append(seq_id, n))
        if can.value != (not out.raised):
            held = (
                ""
                if view is None
                else f"; the sequence held {view.num_reserved} slots in "
                f"{len(view.block_ids)} blocks, so n={n} more needs "
                f"{-(-(view.num_reserved + n) // self.block_size) - len(view.block_ids)} "
                "new blocks"
            )
            self.oracle.fail(
                "CAN-APPEND",
                f"can_append({seq_id!r}, n={n}) said {can.value}, then append {out.describe()}"
                f"{held}; the pool had {supply}",
            )
        return not out.raised

    def _reserve(self, seq_id: SeqId, n: int) -> bool:
        """Append ``n`` slots; when the pool is full, preempt the newest other sequence.

        Only when the pool really is full: a cache that refuses ``can_append`` for reasons
        of its own (a watermark, a conservative estimate) must not turn the workload into
        one that preempts everything, so a refusal with room left just skips the step.
        """
        if self._append(seq_id, n, only_if_possible=True):
            return True
        view = self.oracle.view(seq_id)
        st = self.oracle.state.stats
        if view is not None:
            need = -(-(view.num_reserved + n) // self.block_size) - len(view.block_ids)
            if need <= st.num_free_blocks + st.num_cached_blocks:
                type(self).coverage.variants["reserve:refused_with_room"] += 1
                return False
        victims = [s for s in self.oracle.views if s != seq_id]
        if not victims:
            return False
        type(self).coverage.variants["reserve:preempt"] += 1
        self._free([victims[-1]])
        return self._append(seq_id, n, only_if_possible=True)

    def _commit(self, seq_id: SeqId, n: int, accepted: tuple[int, ...]) -> bool:
        return not self.oracle.op("commit", lambda c: c.commit(seq_id, n, accepted)).raised

    def _commit_prefill(self, seq_id: SeqId, adm: Admission, sampled: tuple[int, ...]) -> None:
        """The forward over the scheduled tokens ran; a token is sampled if the prompt ended."""
        view = self.oracle.view(seq_id)
        assert view is not None
        done = adm.num_cached_tokens + adm.num_scheduled_tokens == len(view.token_ids)
        self._commit(seq_id, adm.num_scheduled_tokens, sampled[:1] if done else ())

    def _advance(self, seq_id: SeqId, k: int, a: int, sampled: tuple[int, ...]) -> None:
        """One engine step for ``seq_id``: the next prefill chunk, or a speculative decode.

        Decode: reserve slots for the unwritten known token plus ``k`` drafts, accept ``a``
        of them plus a bonus token, commit, and roll the rejected drafts back.
        """
        view = self.oracle.view(seq_id)
        if not self.caps.speculative:  # decode grows one token a step, no drafts
            k = a = 0
        if view is None:
            return
        c, r, known = view.num_computed, view.num_reserved, len(view.token_ids)
        by_chunks = view.kv_token_limit is not None or k % 2 == 0
        if self.caps.chunked_prefill and r < view.num_prompt_tokens and by_chunks:
            # prefill by chunks (choice 8); odd k on an unlimited sequence grows by append
            self._prefill_step(seq_id, (k + 1) * self.scale, sampled)
            return
        pending = known - c
        if pending >= 2:  # prefill, chunk by chunk
            chunk = min(pending, (k + 1) * self.scale)
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
        view = self.oracle.view(seq_id)
        assert view is not None
        unwritten = view.num_reserved - view.num_computed
        if unwritten and self.caps.rolls_back:
            self.oracle.op("rollback", lambda cache: cache.rollback(seq_id, unwritten))
        # without a rollback the rejected drafts' slots stay reserved: the next step's
        # tokens fill them (it reserves only what is missing)

    def _run_scheduled(self, seq_ids: list[SeqId]) -> None:
        """Without ``cancel_scheduled``, a scheduled writer always runs its forward pass:
        commit each sequence's scheduled known tokens before it is cancelled."""
        if self.caps.cancel_scheduled:
            return
        for seq_id in seq_ids:
            view = self.oracle.view(seq_id)
            if view is None:
                continue
            n = min(view.num_reserved, len(view.token_ids)) - view.num_computed
            if n > 0:
                self._commit(seq_id, n, ())

    def _free(self, seq_ids: list[SeqId]) -> bool:
        self._run_scheduled(seq_ids)
        self._remember(seq_ids)
        out = self.oracle.op("free", lambda c: c.free(list(seq_ids)))
        self._prune_seqs()
        self._check_reclaimable()
        return not out.raised

    def _check_reclaimable(self) -> None:
        """Nothing leaks (``LEAK``): once no sequence is live, the snapshot's blocks are all
        free or evictable, so a fresh prompt that needs the whole pool must be admissible.

        A pure ``can_admit``, asked only in the safety mode (in the exact mode the reference
        shows a leak as a difference). It holds under every policy: leaf-only eviction
        reaches every cached block once nothing is held, leaf after leaf. A block that no
        sequence holds but the engine still keeps (a lock never dropped, a reference never
        released) looks evictable in the snapshot and is not; EVICT finds it only where
        ``evict(n)`` must reach every cached block (``eviction="any"``), this finds it
        under any policy, and without an ``evict`` operation.
        """
        if self.oracle.views or not self.oracle.alone or self.cfg is None:
            return
        n = self.cfg.num_blocks
        req = Request("leak-probe", (0,) * (n * self.block_size), self._ns(0))
        out = self.oracle.op("can_admit", lambda c: c.can_admit(req, None), pure=True)
        if out.raised or out.value:
            return
        st = self.oracle.state.stats
        self.oracle.fail(
            "LEAK",
            f"no sequence is live and the snapshot shows {st.num_free_blocks} free and "
            f"{st.num_cached_blocks} cached (evictable) blocks of {n}, yet can_admit refuses "
            f"a fresh prompt of {n} blocks ({len(req.token_ids)} tokens): some blocks are "
            "held by nothing and never come back (a lock or reference not dropped on "
            "finish)",
        )

    def _check_lost(self, req: Request, what: str, lost: LostReuse, cached: int) -> None:
        if not self.caps.lost_reuse:
            return
        if (
            lost.total != req.num_tokens - cached
            or min(lost.window, lost.span, lost.cap, lost.evicted, lost.never_cached) < 0
        ):
            self.oracle.fail(
                "LOST", f"{what}: {lost!r} for {req.num_tokens} tokens, {cached} cached"
            )
        if lost.window > req.recompute_blocks * self.block_size:
            self.oracle.fail("LOST", f"{what}: window {lost.window} over {req.recompute_blocks}")

    def _continue(self, seq_id: SeqId, budget: int | None) -> int | None:
        """can_continue_prefill then continue_prefill; the tokens scheduled, or None."""
        can = self.oracle.op(
            "can_continue_prefill", lambda c: c.can_continue_prefill(seq_id, budget), pure=True
        )
        if can.raised:
            return None
        if can.value:
            req = self._requests.get(seq_id)
            room = continue_room(self.oracle.state, seq_id, budget, req.spans if req else ())
            self._promise("CAN-CONTINUE", room, lambda: f"continue_prefill({seq_id!r}, {budget})")
        out = self.oracle.op("continue_prefill", lambda c: c.continue_prefill(seq_id, budget))
        if can.value != (not out.raised):
            self.oracle.fail(
                "CAN-CONTINUE",
                f"can_continue_prefill said {can.value}, then continue_prefill {out.describe()}",
            )
        return None if out.raised else int(out.value)

    def _commit_chunk(self, seq_id: SeqId, sampled: tuple[int, ...]) -> bool:
        """The forward over the reserved, unwritten prompt tokens ran: commit them, with a
        sampled token if the prompt is done. False if there was nothing to commit."""
        view = self.oracle.view(seq_id)
        if view is None or view.num_computed >= view.num_reserved:
            return False
        n = min(view.num_reserved, view.num_prompt_tokens) - view.num_computed
        if n <= 0:
            return False
        done = view.num_computed + n == len(view.token_ids)
        return self._commit(seq_id, n, sampled[:1] if done else ())

    def _prefill_step(self, seq_id: SeqId, budget: int | None, sampled: tuple[int, ...]) -> bool:
        """One prefill step of a sequence with prompt tokens left: commit the reserved chunk,
        or reserve the next one. False when the prompt is fully reserved."""
        view = self.oracle.view(seq_id)
        if view is None or view.num_reserved >= view.num_prompt_tokens:
            return False
        if view.num_computed < view.num_reserved:
            return self._commit_chunk(seq_id, sampled)
        if not self.caps.chunked_prefill:  # no continue_prefill: grow the reservation
            rest = view.num_prompt_tokens - view.num_reserved
            return self._append(seq_id, min(rest, budget or rest), only_if_possible=True)
        return self._continue(seq_id, budget) is not None


def admission_checks(machine: ProtocolSteps, req: Request, match: Match, adm: Admission) -> None:
    """Checks every admission gets: its lost reuse and window are the match's."""
    machine._check_lost(req, "match before admit", match.lost, match.num_cached_tokens)
    if (adm.lost, adm.num_window_blocks) != (match.lost, match.num_window_blocks):
        machine.oracle.fail(
            "LOST",
            f"admission lost {adm.lost!r} / window {adm.num_window_blocks}, but match "
            f"{match.lost!r} / window {match.num_window_blocks}",
        )
