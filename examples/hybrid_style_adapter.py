"""The conformance adapter for :mod:`examples.hybrid_style`: translation only.

The KV side is :mod:`examples.radix_style_adapter`'s, unchanged. This adds the hybrid
calls (restores, reservations and the running state, each answered as a ``StateRef``),
turns the manager's own refusals into ``InvalidOperation``, and renders the state slots in
the snapshot: the free slots, each running request's slot and the position of its state,
and each checkpoint with the tree page that ends its prefix as its node.
"""

from __future__ import annotations

from typing import Any

import attrs
from prefixkv.spec import Admission, CacheState, CheckpointView, StateRef, StateSlotsView
from prefixkv.spec import Request as PkvRequest

from prefixkv.conformance import DeclaredAdapter, adapter
from prefixkv.conformance import toolkit as tk

from .hybrid_style import BUGS, Checkpoint, HybridRadixManager, HybridReq
from .radix_style_adapter import CAPABILITIES as RADIX_CAPABILITIES
from .radix_style_adapter import RadixStyleAdapter

__all__ = [
    "ALIGNED_BUG_FACTORIES",
    "BUG_FACTORIES",
    "CAPABILITIES",
    "HybridStyleAdapter",
    "make_aligned_manager",
    "make_manager",
]

CAPABILITIES = attrs.evolve(RADIX_CAPABILITIES, checkpoints=True)


def _ref(ck: Checkpoint | None) -> StateRef | None:
    return None if ck is None else StateRef(ck.slot, ck.length)


class HybridStyleAdapter(RadixStyleAdapter):  # the radix adapter, plus the state slots
    def __init__(self, manager: HybridRadixManager) -> None:
        super().__init__(manager)
        self.h = manager

    def _req(self, req: PkvRequest, budget: int | None) -> HybridReq:
        rid = tk.check_new(req, self.reqs, budget).seq_id
        return HybridReq(rid, req.token_ids, req.namespace.key())

    def _live(self, seq_id: Any) -> HybridReq:
        return tk.live(self.reqs, seq_id)  # type: ignore[return-value]

    def admit(self, req: PkvRequest, num_new_tokens: int | None = None) -> Admission:
        adm, r = super().admit(req, num_new_tokens), self._live(req.seq_id)
        slot = None if r.restore is None else r.restore.slot
        return attrs.evolve(adm, restore_slot=slot, state_slot=r.mamba_slot)

    def state_slot(self, seq_id: Any) -> int:
        return self._live(seq_id).mamba_slot

    def pending_restore(self, seq_id: Any) -> StateRef | None:
        return _ref(self._live(seq_id).restore)

    def checkpoint_reservation(self, seq_id: Any) -> StateRef | None:
        return _ref(self._live(seq_id).save)

    def runtime_state(self, seq_id: Any) -> StateRef | None:
        r = self._live(seq_id)
        return None if r.state_len is None else StateRef(r.mamba_slot, r.state_len)

    def restore_issued(self, seq_id: Any) -> None:
        with tk.refusal(ValueError, what=repr(seq_id)):
            self.h.restore_issued(self._live(seq_id))

    def keep_state(self, seq_id: Any, position: int) -> None:
        r = self._live(seq_id)
        with tk.refusal(ValueError, what=repr(seq_id)):
            self.h.keep_state(r, tk.check_count(position, "position", 0))

    def snapshot(self) -> CacheState:
        snap, h = super().snapshot(), self.h
        reqs: list[HybridReq] = list(self.reqs.values())  # type: ignore[arg-type]
        saves = [r.save for r in reqs if r.save is not None]
        ckpts = [CheckpointView(ck.slot, ck.status, ck.length, ck.owner,
                                None if ck.status == "reserved" else ck.page, ck.order)
                 for ck in sorted([*saves, *h.ckpts.values()], key=lambda ck: ck.slot)]  # fmt: skip
        free = tuple(sorted(h.mamba.free_slots))
        slots = StateSlotsView(h.max_running, h.extra_slots, h.save_every, free,
                               tuple((r.rid, r.mamba_slot) for r in reqs), tuple(ckpts),
                               tuple((r.rid, r.state_len) for r in reqs))  # fmt: skip
        stats = attrs.evolve(snap.stats, num_state_slots=h.mamba.size,
                             num_state_slots_used=h.mamba.size - len(free))  # fmt: skip
        return attrs.evolve(snap, state_slots=slots, stats=stats)


def factory_for(
    cls: type[HybridRadixManager] = HybridRadixManager, save_align_pages: int = 1
) -> DeclaredAdapter[HybridStyleAdapter]:
    """An adapter factory for ``cls(num_pages, page_size, max_running, extra_slots,
    save_every, save_align_pages)``."""

    @adapter(capabilities=CAPABILITIES)
    def make(
        num_blocks: int, block_size: int, *, record_events: bool, max_num_seqs: int,
        state_budget: int, decode_state_interval: int,
    ) -> HybridStyleAdapter:  # fmt: skip
        manager = cls(num_blocks, block_size, max_num_seqs, state_budget, decode_state_interval,
                      save_align_pages)  # fmt: skip
        return HybridStyleAdapter(manager)

    return make


make_manager = factory_for()
#: The same manager saving prompt states only every 2 pages: not prefixkv's save point, a
#: legitimate one (the safety mode accepts it; the exact one would not).
make_aligned_manager = factory_for(save_align_pages=2)
#: name -> factory of each bug, with each save alignment.
BUG_FACTORIES = {name: factory_for(cls) for name, cls in BUGS.items()}
ALIGNED_BUG_FACTORIES = {name: factory_for(cls, 2) for name, cls in BUGS.items()}
