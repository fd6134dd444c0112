"""The base of every machine: the oracle, the workload's bookkeeping and the bundle.

:class:`MachineBase` owns a :class:`~prefixkv.conformance.lockstep.Lockstep` oracle
(``self.oracle``) that runs every operation on both caches and checks it; rule mixins call
``self.oracle.op(...)``, ``self.oracle.view(...)`` and ``self.oracle.check_match(...)``,
never the caches directly. The composite protocol steps
(:mod:`~prefixkv.conformance.machines.steps`) and the rule mixins (:mod:`.lifecycle`,
:mod:`.bad_inputs`, :mod:`.features`) build on it; :class:`~.differential.DifferentialMachine`
puts them together.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import ClassVar, Protocol, cast

from hypothesis.stateful import Bundle, RuleBasedStateMachine

from prefixkv.spec import (
    EngineSteps,
    HybridPrefixCache,
    Inspectable,
    MultimodalSpan,
    Namespace,
    Request,
    SeqId,
    SeqView,
)

from .._compat import prune_bundle
from ..adapters import BlockManagerAdapter
from ..capabilities import Capabilities
from ..failures import CheckFailed
from ..lockstep import Lockstep, Outcome
from ..replay import HEADER, CallLog
from .coverage import RuleCoverage
from .factories import PoolConfig
from .strategies import NAMESPACES, seq_id_of

__all__ = ["DrivenCache", "MachineBase"]


class DrivenCache(HybridPrefixCache, EngineSteps, Inspectable, Protocol):
    """Every operation a machine may call on a cache: the
    :class:`~prefixkv.spec.PrefixCache` ones, the hybrid ones (only under ``checkpoints``)
    and the engine-shaped steps (only in the step-call machines).

    NOTE: a candidate offers only what its capabilities declare, and the rules call nothing
    else (their preconditions read the capabilities; the runner checks the candidate has
    each operation they call for): so the pair a factory builds is driven as this type.
    """


class MachineBase(RuleBasedStateMachine):
    """State shared by every rule; see the module doc.

    Do not run this class directly: :func:`~.differential.build_machine` makes a runnable
    subclass with a pair factory, the pool shapes to draw and its own coverage counters.
    """

    coverage: ClassVar[RuleCoverage] = RuleCoverage()
    namespaces: ClassVar[tuple[Namespace, ...]] = NAMESPACES
    #: What the candidate supports; rules for missing features never fire.
    caps: ClassVar[Capabilities] = Capabilities()
    #: The ``CacheState`` fields that must be equal after every step (``None``: all of them).
    #: An adapter for a block manager that cannot render, say, its free queue order can
    #: compare fewer; the invariants are still checked on the whole snapshot.
    compared_fields: ClassVar[frozenset[str] | None] = None
    #: Checks (``INV-WRITE``) or check families (``CRASH``) this run looks past.
    ignored_checks: ClassVar[frozenset[str]] = frozenset()

    #: The candidate calls of the latest run, as source (see :mod:`..replay`).
    last_calls: ClassVar[CallLog] = CallLog()
    #: Rule steps of the latest run (``init`` included).
    last_steps: ClassVar[int] = 0

    seqs = Bundle("seqs")

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        self.oracle: Lockstep[DrivenCache] = Lockstep(
            caps=cls.caps, compared_fields=cls.compared_fields, ignore=cls.ignored_checks
        )
        self.oracle.ops = cls.coverage.ops
        self.oracle.op_errors = cls.coverage.op_errors
        self.cfg: PoolConfig | None = None
        self._seq_ns: dict[SeqId, int] = {}
        self._history: list[tuple[int, tuple[int, ...], tuple[MultimodalSpan, ...]]] = []
        self._requests: dict[SeqId, Request] = {}
        self._rich: list[Request] = []
        self._freed: list[SeqId] = []
        self._next_id = 0
        self._since_bad = 3  # rules since the last bad-input rule (the first may fire at once)

    # -- plumbing --------------------------------------------------------------------------

    @staticmethod
    def make_pair(cfg: PoolConfig) -> tuple[BlockManagerAdapter | None, BlockManagerAdapter]:
        raise NotImplementedError("build the machine with build_machine(make_pair=...)")

    @property
    def ref(self) -> DrivenCache | None:
        """The reference cache (``None`` in the safety mode)."""
        return self.oracle.ref

    @property
    def cand(self) -> DrivenCache | None:
        """The candidate cache (unrecorded: rules go through ``self.oracle.op``)."""
        return self.oracle.cand

    @property
    def block_size(self) -> int:
        assert self.cfg is not None
        return self.cfg.block_size

    @property
    def scale(self) -> int:
        """Tokens per drawn token: the workload is drawn for blocks of up to 4 tokens, so on
        larger blocks (an engine that needs 256) each drawn token becomes a run of
        ``block_size // 4`` tokens, and prompts still share, fill and outgrow blocks."""
        return max(1, self.block_size // 4)

    def _prompt(self, tokens: tuple[int, ...]) -> tuple[int, ...]:
        """A drawn prompt at this pool's scale (see :attr:`scale`)."""
        n = self.scale
        return tokens if n == 1 else tuple(t for t in tokens for _ in range(n))

    def _start(self, cfg: PoolConfig) -> None:
        self.cfg = cfg
        cls = type(self)
        ref, cand = cls.make_pair(cfg)
        calls = CallLog(
            [
                HEADER,
                f"cache = make(num_blocks={cfg.num_blocks}, block_size={cfg.block_size}, "
                f"record_events={cfg.record_events})",
            ]
        )
        cls.last_calls = calls
        cls.last_steps = 0
        self.oracle.log = calls
        self.oracle.bind(
            cast(DrivenCache | None, ref),
            cast(DrivenCache, cand),
            record_events=cfg.record_events,
        )
        cls.coverage.variants[f"block_size={cfg.block_size}"] += 1
        if ref is None:  # candidate alone: the pool it was asked for, then safety only
            for attr in ("num_blocks", "block_size"):
                if getattr(cand, attr) != getattr(cfg, attr):
                    raise CheckFailed(
                        f"SHAPE({attr})",
                        f"asked for {getattr(cfg, attr)}, candidate has {getattr(cand, attr)}",
                    )
        self.oracle.start()

    def teardown(self) -> None:
        """The end of a run: every invariant on the last states, in full (unless the run is
        ending on an error already)."""
        if sys.exc_info()[0] is None:
            self.oracle.final_check()

    # -- the names rule modules used before the oracle had a public surface -----------------
    # Kept so that rule modules written against them keep working; new rules call
    # ``self.oracle`` directly.

    def _op(
        self,
        name: str,
        fn: Callable[[DrivenCache], object],
        *,
        pure: bool = False,
        must_raise: type[Exception] | None = None,
    ) -> Outcome:
        return self.oracle.op(name, fn, pure=pure, must_raise=must_raise)

    def _view(self, seq_id: SeqId) -> SeqView | None:
        return self.oracle.view(seq_id)

    @property
    def _views(self) -> dict[SeqId, SeqView]:
        return self.oracle.views

    @property
    def _rule_raised(self) -> bool:
        return self.oracle.raised_in_rule

    @_rule_raised.setter
    def _rule_raised(self, value: bool) -> None:
        self.oracle.raised_in_rule = value

    # -- bookkeeping -----------------------------------------------------------------------

    def _new_id(self) -> SeqId:
        n = self._next_id
        self._next_id += 1
        return seq_id_of(n)

    def _ns(self, ns: int) -> Namespace:
        """The drawn namespace (always the first one without ``namespaces``)."""
        return self.namespaces[ns % len(self.namespaces) if self.caps.namespaces else 0]

    def _prune_seqs(self) -> None:
        """Drop ids that are no longer live from the bundle (freed in a batch or a reset)."""
        prune_bundle(self, "seqs", lambda seq_id: seq_id in self.oracle.views)

    def _remember(self, seq_ids: list[SeqId]) -> None:
        """Keep the histories of sequences about to be freed, for multi-turn re-admission."""
        for seq_id in seq_ids:
            view = self.oracle.view(seq_id)
            if view is None:
                continue
            req = self._requests.get(seq_id)
            spans = req.spans if req is not None else ()
            self._history.append((self._seq_ns.get(seq_id, 0), view.token_ids, spans))
            self._freed.append(seq_id)
        del self._history[:-16]
        del self._freed[:-16]

    def _note_request(self, req: Request) -> None:
        """Remember an admitted multimodal request, for ``reuse_rich``."""
        if req.spans:
            self._rich.append(req)
            del self._rich[:-16]

    def _ghost(self) -> SeqId:
        """An id that is not live: a freed one when there is one, else one never used."""
        for seq_id in reversed(self._freed):
            if seq_id not in self.oracle.views:
                return seq_id
        return "ghost"
