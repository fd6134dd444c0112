"""The conformance adapter for :mod:`examples.mtp_engine`: the minimal engine's adapter,
with drafts and no rollback declared and a decode step's slots reserved in one call.

``append`` calls ``may_append`` directly (``append_asks_can_append = False``), as the
engine's scheduler does after its own ``can_append``: a room check that says yes wrongly is
caught as CAN-APPEND instead of being hidden by the adapter's question.
"""

from __future__ import annotations

from typing import Any

import attrs

from prefixkv.conformance import DeclaredAdapter, adapter
from prefixkv.conformance import toolkit as tk

from .minimal_engine_adapter import CAPABILITIES as MINIMAL
from .minimal_engine_adapter import MinimalEngineAdapter
from .mtp_engine import BUGS, MTPEngine

__all__ = ["CAPABILITIES", "MTPEngineAdapter", "make_manager"]

CAPABILITIES = attrs.evolve(MINIMAL, speculative=True, rollback=False)


class MTPEngineAdapter(MinimalEngineAdapter):  # the minimal engine's, drafts in one call
    append_asks_can_append = False
    e: MTPEngine

    def extend(self, seq_id: Any, num_tokens: int) -> list[int]:
        s = tk.live(self.reqs, seq_id)
        before = len(s.block_table)
        self._taking(lambda: self.e.may_append(s, num_tokens), seq_id)
        return s.block_table[before:]


def factory_for(cls: type[MTPEngine] = MTPEngine) -> DeclaredAdapter[MTPEngineAdapter]:
    """An adapter factory for ``cls(num_blocks, block_size)``."""

    @adapter(capabilities=CAPABILITIES)
    def make(num_blocks: int, block_size: int, *, record_events: bool) -> MTPEngineAdapter:
        return MTPEngineAdapter(cls(num_blocks, block_size))

    return make


make_manager = factory_for()
#: name -> factory of each bug.
BUG_FACTORIES = {name: factory_for(cls) for name, cls in BUGS.items()}
