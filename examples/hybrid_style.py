"""A hybrid model's prefix cache written the way SGLang writes its Mamba radix cache.

A hybrid model (attention layers plus recurrent layers: Mamba, linear attention) reuses a
cached prefix only if it also has the recurrent state at exactly the prefix's end. This
manager keeps those states beside the KV pages of :mod:`examples.radix_style` (its KV side,
unchanged), in the shapes SGLang's ``mem_cache/mamba_radix_cache.py`` uses. It shares no
code with prefixkv and imports nothing from it; ``hybrid_style_adapter`` is the only
translation.

* **A pool of state slots** (``MambaPool``): ``max_running`` live requests hold one each
  (their running state), and ``extra_slots`` more hold checkpoints. The lowest free slot is
  taken; when none is free, the oldest Ready checkpoint that no restore waits for is
  dropped to make room.
* **Checkpoints keyed by prefix.** A checkpoint is the state after a page-aligned prefix
  of one namespace, kept under ``(namespace, prefix tokens)`` with the tree page that ends
  the prefix. A request reserves one at its *save point* (the last full page of what it
  has scheduled of its prompt, or in decode the last multiple of ``save_every``), saves
  into it during the forward, and the checkpoint becomes Ready when the tokens before it
  are written and accepted and the tree holds their pages.
* **Where to save is a choice.** ``save_align_pages=k`` saves the prompt's state only at
  multiples of ``k`` pages, the deepest one the scheduled prompt reaches, as a cache whose
  recurrent kernel works in chunks of ``k`` pages does (SGLang aligns its Mamba state
  tracking to the kernel's chunk size and to ``mamba_track_interval``). ``k = 1`` is the
  last full page. Fewer saves mean fewer hits, never a wrong one.
* **A hit ends at a checkpoint.** ``match`` walks the tree, then cuts the prefix back to
  the deepest page boundary with a Ready checkpoint. The admitted request pins it until the
  engine has copied it (``restore_issued``); an aborted request unpins it.
* **What the running slot holds.** ``state_len`` is the position of the state in the
  request's running slot: 0 at first, the checkpoint's once the restore is issued, then the
  committed length the engine reports after each forward (``keep_state``). With drafts the
  forward yields a state after every draft token; only the one after the accepted tokens
  may be kept.
* **Eviction.** When the tree evicts the page that ends a checkpoint's prefix, the
  checkpoint goes with it (a pinned one cannot: its request locks the page).

Bug variants (classic hybrid-cache bugs, each a subclass) are listed in :data:`BUGS`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Sequence
from typing import Any

from .radix_style import RadixKVManager, Req

__all__ = ["BUGS", "Checkpoint", "HybridRadixManager", "HybridReq", "MambaPool"]


class MambaPool:
    """``size`` recurrent-state slots; the lowest free one is taken first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.free_slots = list(range(size))  # a heap

    def alloc(self) -> int | None:
        return heapq.heappop(self.free_slots) if self.free_slots else None

    def free(self, slot: int) -> None:
        heapq.heappush(self.free_slots, slot)


class Checkpoint:
    """A reserved or saved recurrent state after ``length`` tokens."""

    def __init__(self, slot: int, length: int, owner: Any) -> None:
        self.slot, self.length, self.owner = slot, length, owner
        self.status = "reserved"  # then "ready"; "pinned" while a restore waits for it
        self.key: tuple[Hashable, tuple[int, ...]] | None = None  # (namespace, prefix), ready
        self.page = -1  # the tree page that ends the prefix, once ready
        self.order = 0  # ready checkpoints by saving time


class HybridReq(Req):
    """A request with its recurrent-state bookkeeping."""

    def __init__(self, rid: Any, origin_input_ids: Sequence[int], namespace: Hashable) -> None:
        super().__init__(rid, origin_input_ids, namespace)
        self.mamba_slot = -1  # the running state
        self.state_len: int | None = 0  # position of the running state; None: restore pending
        self.restore: Checkpoint | None = None  # pinned, to copy before the first forward
        self.save: Checkpoint | None = None  # reserved, to save into during the forward


class HybridRadixManager(RadixKVManager):
    """The radix-tree KV manager plus the state slots and checkpoints of the module doc."""

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        max_running: int,
        extra_slots: int,
        save_every: int,
        save_align_pages: int = 1,
    ) -> None:
        super().__init__(num_pages, page_size)
        if max_running < 1 or extra_slots < 0 or save_every < 0 or save_every % page_size:
            raise ValueError("bad state-slot configuration")
        if save_align_pages < 1:
            raise ValueError("save_align_pages must be at least 1")
        self.max_running, self.extra_slots, self.save_every = max_running, extra_slots, save_every
        self.save_align = save_align_pages * page_size  # prompt saves at multiples of this
        self.mamba = MambaPool(max_running + extra_slots)
        self.ckpts: dict[tuple[Hashable, tuple[int, ...]], Checkpoint] = {}  # ready, pinned
        self._order = itertools.count()
        self.saved = self.discarded = self.restored = self.released_stale = self.dropped = 0

    # -- slots ---------------------------------------------------------------------------

    def _take_slot(self) -> int | None:
        """A free slot, after dropping the oldest unpinned Ready checkpoint if none is."""
        if not self.mamba.free_slots:
            ready = [ck for ck in self.ckpts.values() if ck.status == "ready"]
            if not ready:
                return None
            self._drop(min(ready, key=lambda ck: ck.order))
            self.dropped += 1
        return self.mamba.alloc()

    def _drop(self, ck: Checkpoint) -> None:
        assert ck.key is not None
        del self.ckpts[ck.key]
        self.mamba.free(ck.slot)

    def save_point(self, req: HybridReq) -> int:
        align, done, end = self.save_align, req.kv_committed_len, req.kv_allocated_len
        point = min(end, len(req.origin_input_ids)) // align * align
        if self.save_every:
            point = max(point, end // self.save_every * self.save_every)
        return point if point > done else 0

    def _retarget(self, req: HybridReq) -> None:
        """Keep the reservation at the save point: drop one elsewhere, reserve if possible."""
        target = self.save_point(req)
        if req.save is not None:
            if req.save.length == target:
                return
            self.mamba.free(req.save.slot)
            req.save = None
            self.discarded += 1
        if target:
            slot = self._take_slot()
            if slot is not None:
                req.save = Checkpoint(slot, target, req.rid)

    def _drop_stale(self) -> None:
        """The tree evicted pages: a Ready checkpoint whose page went goes with it."""
        held = {page for page, *_ in self.tree.all_pages()}
        for ck in [ck for ck in self.ckpts.values() if ck.page not in held]:
            assert ck.status == "ready", "a pinned checkpoint's page is locked"
            self._drop(ck)
            self.released_stale += 1

    # -- the KV manager's operations, with states -----------------------------------------

    def ready_checkpoint(self, tokens: Sequence[int], namespace: Hashable) -> Checkpoint | None:
        ck = self.ckpts.get((namespace, tuple(tokens)))
        return ck if ck is not None and ck.status == "ready" else None

    def match(self, tokens: Sequence[int], namespace: Hashable) -> tuple[list[int], Any]:
        pages, node = super().match(tokens, namespace)
        n = len(pages)
        while n and self.ready_checkpoint(tokens[: n * self.page_size], namespace) is None:
            n -= 1
        if n < len(pages):
            pages, node = self.tree.match_prefix(tokens[: n * self.page_size], namespace)
        return pages, node

    def _slots_for(self, req: Req) -> bool:
        """A running slot can be had: free slots plus unpinned Ready checkpoints, less the
        one the admission pins."""
        if len(self.reqs) >= self.max_running:
            return False
        pins = 1 if self.match(req.origin_input_ids, req.namespace)[0] else 0
        ready = sum(1 for ck in self.ckpts.values() if ck.status == "ready")
        return len(self.mamba.free_slots) + ready - pins >= 1

    def can_admit(self, req: Req, budget: int | None = None) -> bool:
        return self._slots_for(req) and super().can_admit(req, budget)

    def admit(self, req: Req, budget: int | None = None) -> bool:
        assert isinstance(req, HybridReq)
        if not self._slots_for(req) or not super().admit(req, budget):
            return False
        ck = self._restore_source(req)
        if ck is not None:
            ck.status, ck.owner, req.restore, req.state_len = "pinned", req.rid, ck, None
        slot = self._take_slot()
        assert slot is not None, "checked by _slots_for"
        req.mamba_slot = slot
        self._retarget(req)
        return True

    def _restore_source(self, req: HybridReq) -> Checkpoint | None:
        """The Ready checkpoint at exactly the end of the admitted request's hit."""
        n = req.num_cached_tokens
        return self.ckpts[(req.namespace, tuple(req.fill_ids[:n]))] if n else None

    def _alloc(self, num_pages: int) -> list[int]:
        pages = super()._alloc(num_pages)
        self._drop_stale()
        return pages

    def evict(self, num_pages: int) -> int:
        n = super().evict(num_pages)
        self._drop_stale()
        return n

    def extend(self, req: Req, num_tokens: int) -> list[int] | None:
        assert isinstance(req, HybridReq)
        new = super().extend(req, num_tokens)
        if new is not None:
            self._retarget(req)
        return new

    def release_tail(self, req: Req, num_tokens: int) -> list[int]:
        assert isinstance(req, HybridReq)
        dropped = super().release_tail(req, num_tokens)
        self._retarget(req)
        return dropped

    def record_forward(self, req: Req, num_computed: int, output_ids: Sequence[int] = ()) -> None:
        """After a forward: cache the pages; a reservation it covers becomes Ready."""
        assert isinstance(req, HybridReq)
        super().record_forward(req, num_computed, output_ids)
        ck = req.save
        if ck is not None and ck.length <= req.kv_committed_len:
            req.save = None
            ck.key = (req.namespace, tuple(req.fill_ids[: ck.length]))
            pages, _ = self.tree.match_prefix(req.fill_ids[: ck.length], req.namespace)
            if len(pages) * self.page_size != ck.length or ck.key in self.ckpts:
                self.mamba.free(ck.slot)  # an equal checkpoint exists, or the prefix is gone
                self.discarded += 1
            else:
                ck.status, ck.owner, ck.page, ck.order = "ready", None, pages[-1], next(self._order)
                self.ckpts[ck.key] = ck
                self.saved += 1
        self._retarget(req)

    def restore_issued(self, req: HybridReq) -> None:
        """The engine copied the pinned checkpoint into the running slot."""
        ck = req.restore
        if ck is None:
            raise ValueError(f"request {req.rid!r} has no restore pending")
        ck.status, ck.owner, req.restore, req.state_len = "ready", None, None, ck.length
        self.restored += 1

    def keep_state(self, req: HybridReq, position: int) -> None:
        """The engine wrote the state after ``position`` tokens into the running slot."""
        if req.state_len is None:
            raise ValueError(f"request {req.rid!r} must issue its restore first")
        if position != req.kv_committed_len:
            raise ValueError(f"the state after {position} tokens is not the committed one")
        req.state_len = position

    def cache_finished_req(self, req: Req) -> None:
        assert isinstance(req, HybridReq)
        super().cache_finished_req(req)
        self.mamba.free(req.mamba_slot)
        if req.save is not None:
            self.mamba.free(req.save.slot)
            self.discarded += 1
        if req.restore is not None:  # aborted before the restore: Ready again
            req.restore.status, req.restore.owner = "ready", None

    def reset(self) -> bool:
        if not super().reset():
            return False
        for ck in list(self.ckpts.values()):
            self._drop(ck)
            self.released_stale += 1
        return True


# -- classic bugs ---------------------------------------------------------------------------


class CheckpointOutlivesItsPages(HybridRadixManager):
    """Evicting the tree's pages leaves their checkpoints behind: a later request with the
    same tokens, recomputed into other pages, restores a state whose KV prefix is gone."""

    def _drop_stale(self) -> None:
        pass


class SlotReusedUnderCheckpoint(HybridRadixManager):
    """Slot pressure hands out a Ready checkpoint's slot but forgets the checkpoint: a hit
    then restores whatever the slot's new holder wrote into it."""

    def _take_slot(self) -> int | None:
        if not self.mamba.free_slots:
            ready = [ck for ck in self.ckpts.values() if ck.status == "ready"]
            if not ready:
                return None
            self.mamba.free(min(ready, key=lambda ck: ck.order).slot)
        return self.mamba.alloc()


class SaveMidPage(HybridRadixManager):
    """The prefill save point is the end of the scheduled prompt, not its last full page:
    the state is saved where no page (and so no hit) ends."""

    def save_point(self, req: HybridReq) -> int:
        point = min(req.kv_allocated_len, len(req.origin_input_ids))
        return point if point > req.kv_committed_len else 0


class SavePastSchedule(HybridRadixManager):
    """The prompt's save point is rounded up to the alignment instead of down: the state is
    to be saved after tokens that no forward of this step computes (the engine saves the
    state at the end of its chunk, under a later position)."""

    def save_point(self, req: HybridReq) -> int:
        align, done, end = self.save_align, req.kv_committed_len, req.kv_allocated_len
        point = -(-min(end, len(req.origin_input_ids)) // align) * align
        if self.save_every:
            point = max(point, end // self.save_every * self.save_every)
        return point if point > done else 0


class RestoreSkipsTail(HybridRadixManager):
    """The hit keeps the whole KV match and restores the deepest checkpoint inside it: the
    tokens between the checkpoint and the end of the hit never reach the running state."""

    def match(self, tokens: Sequence[int], namespace: Hashable) -> tuple[list[int], Any]:
        return RadixKVManager.match(self, tokens, namespace)

    def _restore_source(self, req: HybridReq) -> Checkpoint | None:
        for n in range(req.num_cached_tokens, 0, -self.page_size):
            ck = self.ready_checkpoint(req.fill_ids[:n], req.namespace)
            if ck is not None:
                return ck
        return None


class DraftStateKept(HybridRadixManager):
    """``keep_state`` takes the state after any scheduled token: the state after the last
    draft is kept, and stays after the rejected drafts are rolled back."""

    def keep_state(self, req: HybridReq, position: int) -> None:
        if req.state_len is None:
            raise ValueError(f"request {req.rid!r} must issue its restore first")
        if not req.kv_committed_len <= position <= req.kv_allocated_len:
            raise ValueError(f"the state after {position} tokens was never computed")
        req.state_len = position


#: name -> the manager class with that bug.
BUGS: dict[str, type[HybridRadixManager]] = {
    "checkpoint_outlives_its_pages": CheckpointOutlivesItsPages,
    "slot_reused_under_checkpoint": SlotReusedUnderCheckpoint,
    "save_mid_page": SaveMidPage,
    "save_past_schedule": SavePastSchedule,
    "restore_skips_tail": RestoreSkipsTail,
    "draft_state_kept": DraftStateKept,
}
