"""The joint model (:mod:`.model`) checked on :class:`HybridSpecCache`'s reachable states.

Every reachable state of the spec, abstracted, satisfies the joint invariants, every restore
the spec makes is RESTORE-SAFE, and two runs that differ only in routed-expert data stay
equal in everything else (EXPERTS).

Random runs of the hybrid spec (6 blocks, ``BS`` 2, commits with and without routed
experts, evictions, restores, resets) are abstracted after every step to the joint model's
state: blocks are nodes; a sequence's hit is its cached prefix; checkpoints keep their slots;
routed-expert bytes become non-zero integers. The ghosts are kept by the harness: a block
gets a new ``gen`` whenever it becomes published or its identity changes, its ``pgen`` is
its parent's gen at that moment, and a checkpoint's ``sgen`` is its node's gen when it
became Ready. The model's own invariant formulas are then evaluated on those values, and
at each ``restore_issued`` (before it) and each restoring admission (after it) the model's
``restore_safe`` formula must hold.

What this checks and what it does not: Reserved checkpoints are not part of the joint model
(they are the checkpoint model's, :mod:`..ckpt.drift`), so they abstract to free slots. J-REF
counts hits only, while the spec's refcounts also count private blocks, so J-REF is left to
the main encoding's INV-REF, and is not evaluated here. Step-by-step agreement of each
transition is the business of the two drift checks the model is composed of
(:mod:`..kv.drift`, :mod:`..ckpt.drift`); this check ties their composition to the spec.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import attrs
import z3
from prefixkv.spec import Admission, HybridSpecCache, Match, Namespace, PrefixCacheError, Request
from prefixkv.spec.state import CacheState

from ..driver import DriftError, Substituter, drive
from . import model as jt
from .obligations import JointModel

__all__ = ["BS", "ExpertsReport", "JointDriftReport", "run_experts_lockstep", "run_joint_drift"]

NS = Namespace("joint-proofs@1")
BS = 2
BLOCKS = 6
SEQ_IDS = ("j0", "j1")
CHECKED = ("J-TREE", "J-GEN", "J-HIT", "J-CKPT", "J-EXP")
_PREFIXES = ((1, 2, 3, 4, 5, 6, 7), (1, 2, 3, 4, 2, 2, 3), (5, 5, 6, 6, 7, 7, 1))


def _fields(x: jt.JState) -> list[Any]:
    return [
        *x.pub,
        *x.gen,
        *x.par,
        *x.pgen,
        *x.dep,
        *x.rc,
        *x.exp,
        *x.live,
        *x.h,
        *x.held,
        *[t for p in x.path for t in p],
        *x.rs,
        *x.kind,
        *x.node,
        *x.bnd,
        *x.sgen,
        *x.owner,
        x.clock,
    ]


@dataclass
class JointDriftReport:
    checks: int = 0
    successes: int = 0
    rejections: int = 0
    invariant_checks: int = 0
    restores: int = 0  # RESTORE-SAFE checks (admissions that restore, restore_issued)
    stale: int = 0  # checkpoints released because their node was evicted
    republished: int = 0  # blocks published again after an eviction (new gen)
    seconds: float = 0.0
    by_op: dict[str, int] = field(default_factory=dict)


class _Ghosts:
    """The model's ghost variables, kept alongside a concrete run."""

    def __init__(self) -> None:
        self.clock = 1
        self.gen = [0] * BLOCKS
        self.pgen = [0] * BLOCKS
        self.ident: list[object] = [None] * BLOCKS
        self.sgen: dict[tuple[int, int, int], int] = {}  # (slot, node, order) -> gen
        self.ever: set[int] = set()

    def update(self, cache: HybridSpecCache, report: JointDriftReport) -> None:
        snap = cache.snapshot()
        for v in sorted(snap.blocks, key=lambda v: v.depth):  # parents first
            ident = (v.namespace, v.parent, v.token_ids, v.extra_keys) if v.published else None
            b = v.block_id
            if ident is not None and ident != self.ident[b]:
                report.republished += b in self.ever
                self.ever.add(b)
                self.gen[b] = self.clock
                self.clock += 1
                self.pgen[b] = 0 if v.parent is None else self.gen[v.parent]
            self.ident[b] = ident
        view = snap.state_slots
        assert view is not None
        live_keys = set()
        for ck in view.checkpoints:
            if ck.status in ("ready", "pinned") and ck.node is not None:
                key = (ck.slot, ck.node, ck.order)
                live_keys.add(key)
                self.sgen.setdefault(key, self.gen[ck.node])
        for key in list(self.sgen):
            if key not in live_keys:
                del self.sgen[key]


def _experts(data: bytes | None) -> int:
    if data is None:
        return 0
    return 1 + int.from_bytes(hashlib.sha256(data).digest()[:4], "big")


def abstract(cache: HybridSpecCache, g: _Ghosts, m: JointModel) -> list[int | bool]:
    """The joint model's state of ``cache``, in :func:`_fields` order."""
    snap = cache.snapshot()
    view = snap.state_slots
    assert view is not None
    S, K, D = m.S, m.K, m.D
    assert m.N == BLOCKS, "one model node per block"
    pub = [v.published for v in snap.blocks]
    par = [-1 if v.parent is None else v.parent for v in snap.blocks]
    dep = [v.depth if v.published else 0 for v in snap.blocks]
    rc = [v.refcount for v in snap.blocks]
    exp = [_experts(v.routed_experts) for v in snap.blocks]
    live, h, rs = [False] * S, [0] * S, [-1] * S
    path = [[0] * D for _ in range(S)]
    slot_of = {sid: i for i, sid in enumerate(SEQ_IDS)}
    for sv in snap.sequences:
        s = slot_of[str(sv.seq_id)]
        live[s] = True
        h[s] = sv.num_cached_tokens // BS
        for j, b in enumerate(sv.block_ids[: h[s]]):
            path[s][j] = b
    kind, node, bnd, sgen, owner = [jt.FREE] * K, [0] * K, [0] * K, [0] * K, [-1] * K
    for ck in view.checkpoints:
        if ck.status not in ("ready", "pinned") or ck.node is None:
            continue  # Reserved: the checkpoint model's business
        k = ck.slot
        kind[k] = jt.READY if ck.status == "ready" else jt.PINNED
        node[k], bnd[k] = ck.node, ck.boundary // BS
        sgen[k] = g.sgen[(ck.slot, ck.node, ck.order)]
        if ck.status == "pinned":
            owner[k] = slot_of[str(ck.owner)]
            rs[owner[k]] = k
    return [
        *pub,
        *g.gen,
        *par,
        *g.pgen,
        *dep,
        *rc,
        *exp,
        *live,
        *h,
        *h,  # held: the hit only (J-REF, which counts the rest, is not evaluated here)
        *[b for p in path for b in p],
        *rs,
        *kind,
        *node,
        *bnd,
        *sgen,
        *owner,
        g.clock,
    ]


class _Checker:
    def __init__(self, m: JointModel) -> None:
        x = m.fresh("d.")
        self.m = m
        self.sub = Substituter(_fields(x))
        invs = m.invariants(x)
        self.invs = {name: invs[name] for name in CHECKED}
        self.r = z3.Int("d.r")
        self.s = z3.Int("d.s")
        path = [jt.sel([x.path[q][j] for q in range(m.S)], self.s) for j in range(m.D)]
        self.safe = m.restore_safe(x, self.r, jt.sel(x.h, self.s), path)
        self.sub_rs = Substituter([*_fields(x), self.r, self.s])

    def failing(self, vals: list[int | bool]) -> list[str]:
        return [n for n, f in self.invs.items() if not z3.is_true(self.sub(f, vals))]

    def restore_safe(self, vals: list[int | bool], r: int, s: int) -> bool:
        return bool(z3.is_true(self.sub_rs(self.safe, [*vals, r, s])))


_OPS = ("admit", "commit", "append", "rollback", "restore_issued", "free", "evict", "reset")
_WEIGHTS = (5, 6, 1, 1, 2, 2, 2, 0.5)


def _request(rng: random.Random, seq_id: str) -> Request:
    base = rng.choice(_PREFIXES)
    n = len(base) if rng.random() < 0.5 else rng.randint(3, len(base))
    return Request(seq_id, base[:n], NS, kv_token_limit=rng.choice((None, None, 2, 4)))


class _Run:
    def __init__(
        self,
        cache: HybridSpecCache,
        checker: _Checker,
        rng: random.Random,
        report: JointDriftReport,
    ) -> None:
        self.cache, self.c, self.rng, self.r = cache, checker, rng, report
        self.g = _Ghosts()
        self.g.update(cache, report)

    def state(self) -> list[int | bool]:
        return abstract(self.cache, self.g, self.c.m)

    def check(self, where: str) -> None:
        bad = self.c.failing(self.state())
        self.r.invariant_checks += 1
        if bad:
            raise DriftError(f"after {where} the spec's state breaks {', '.join(bad)}")

    def pinned_slot(self, sid: str) -> int | None:
        view = self.cache.snapshot().state_slots
        assert view is not None
        for ck in view.checkpoints:
            if ck.status == "pinned" and ck.owner == sid:
                return ck.slot
        return None

    def step(self) -> None:
        rng, cache = self.rng, self.cache
        live = [str(s) for s in cache.seq_ids()]
        op = rng.choices(_OPS, _WEIGHTS)[0]
        if op == "admit" or not live:
            free = [s for s in SEQ_IDS if s not in live]
            op = "admit" if free else "commit"
        sid = (
            rng.choice([s for s in SEQ_IDS if s not in live])
            if op == "admit"
            else rng.choice(live or list(SEQ_IDS))
        )
        before = self.state()
        stale_before = cache.stats().checkpoints_released_stale
        restore_slot = self.pinned_slot(sid) if op == "restore_issued" and sid in live else None
        action = self.action(op, sid)
        self.r.checks += 1
        self.r.by_op[op] = self.r.by_op.get(op, 0) + 1
        try:
            result = action()
        except PrefixCacheError:
            self.r.rejections += 1
            return
        self.r.successes += 1
        s = SEQ_IDS.index(sid)
        if op == "restore_issued" and restore_slot is not None:
            self.r.restores += 1
            if not self.c.restore_safe(before, restore_slot, s):
                raise DriftError(f"restore_issued({sid}) read slot {restore_slot}: not safe")
        self.g.update(cache, self.r)
        self.r.stale += cache.stats().checkpoints_released_stale - stale_before
        if isinstance(result, Admission) and result.restore_slot is not None:
            slot = result.restore_slot
            self.r.restores += 1
            if not self.c.restore_safe(self.state(), slot, s):
                raise DriftError(f"admit({sid}) restored slot {slot}: not safe")
        self.check(f"{op}({sid})")

    def action(self, op: str, sid: str) -> Callable[[], object]:
        """The spec call of ``op`` on ``sid``, its random arguments drawn (some when it runs)."""
        rng, cache = self.rng, self.cache
        if op == "admit":
            req = _request(rng, sid)
            return lambda: cache.admit(req, rng.choice((None, 2, 4)))
        if op == "commit":
            return self.commit_action(sid)
        if op == "append":
            return lambda: cache.append(sid, rng.randint(1, 3))
        if op == "rollback":
            return lambda: cache.rollback(sid, rng.randint(1, 2))
        if op == "restore_issued":
            return lambda: cache.restore_issued(sid)
        if op == "free":
            return lambda: cache.free([sid])
        if op == "evict":
            return lambda: cache.evict(rng.randint(1, 3))
        keep = rng.random() < 0.5
        return lambda: cache.reset(preserve_cache=keep)

    def commit_action(self, sid: str) -> Callable[[], object]:
        """A commit of most of the reservation, with routed experts half of the time."""
        rng, cache = self.rng, self.cache
        seq = cache._s.seqs.get(sid)  # the driver reads the spec's state to pick counts
        room = seq.num_reserved - seq.num_computed if seq else 0
        delta = room if rng.random() < 0.7 else rng.randint(0, max(0, room))
        need = (seq.num_computed + delta - len(seq.tokens)) if seq else 0
        accepted = [rng.randrange(8) for _ in range(max(0, need))]
        first = seq.num_computed // BS if seq else 0
        stop = (seq.num_computed + delta) // BS if seq else 0
        experts = (
            [rng.choice((b"e1", b"e2")) for _ in range(stop - first)]
            if rng.random() < 0.5
            else None
        )
        return lambda: cache.commit(sid, delta, accepted, routed_experts=experts)


def run_joint_drift(
    checks: int,
    seed: int = 0,
    cache_type: type[HybridSpecCache] = HybridSpecCache,
    steps_per_run: int = 40,
    report: JointDriftReport | None = None,
) -> JointDriftReport:
    """About ``checks`` steps of random hybrid runs, each state checked."""
    rep = report or JointDriftReport()
    checker = _Checker(JointModel(jt.JointBounds(nodes=BLOCKS, seqs=len(SEQ_IDS))))

    def start(rng: random.Random) -> _Run:
        cache = cache_type(
            BLOCKS,
            BS,
            max_num_seqs=2,
            state_budget=rng.choice((1, 2)),
            decode_state_interval=rng.choice((0, 4)),
        )
        return _Run(cache, checker, rng, rep)

    return drive(rep, checks, lambda r: r.checks, start, seed=seed, steps_per_run=steps_per_run)


# -- EXPERTS in the spec: two runs that differ only in routed-expert data ---------------------


@dataclass
class ExpertsReport:
    steps: int = 0
    matches: int = 0  # match() results compared
    replays: int = 0  # admissions that replayed routed experts in the run that has them
    seconds: float = 0.0


def _strip(x: object) -> object:
    """A result or snapshot without its routed-expert data."""
    if isinstance(x, Admission | Match):
        return attrs.evolve(x, routed_experts=None)
    if isinstance(x, CacheState):
        return attrs.evolve(x, blocks=tuple(attrs.evolve(v, routed_experts=None) for v in x.blocks))
    return x


def _calls(
    rng: random.Random, a: HybridSpecCache, op: str, sid: str
) -> list[Callable[[HybridSpecCache], object]]:
    """The same operation for both runs; a commit carries different routed experts."""
    if op == "admit":
        req, nn = _request(rng, sid), rng.choice((None, 2, 4))
        return [lambda c: c.admit(req, nn)] * 2
    if op == "commit":
        seq = a._s.seqs[sid]  # the driver reads the spec's state to pick counts
        delta = seq.num_reserved - seq.num_computed
        need = seq.num_computed + delta - len(seq.tokens)
        acc = [rng.randrange(8) for _ in range(max(0, need))]
        k = (seq.num_computed + delta) // BS - seq.num_computed // BS
        ea = [rng.choice((b"e1", b"e2")) for _ in range(k)]
        eb = rng.choice((None, [b"other"] * k))
        return [
            lambda c: c.commit(sid, delta, acc, routed_experts=ea),
            lambda c: c.commit(sid, delta, acc, routed_experts=eb),
        ]
    n = rng.randint(1, 3)
    keep = rng.random() < 0.5
    table: dict[str, Callable[[HybridSpecCache], object]] = {
        "append": lambda c: c.append(sid, n),
        "rollback": lambda c: c.rollback(sid, min(n, 2)),
        "restore_issued": lambda c: c.restore_issued(sid),
        "free": lambda c: c.free([sid]),
        "evict": lambda c: c.evict(n),
        "reset": lambda c: c.reset(preserve_cache=keep),
    }
    return [table[op]] * 2


def run_experts_lockstep(
    steps: int,
    seed: int = 0,
    cache_type: type[HybridSpecCache] = HybridSpecCache,
    report: ExpertsReport | None = None,
) -> ExpertsReport:
    """EXPERTS on the spec: run A commits routed experts, run B the same operations with
    other expert data or none. After every step the results, the snapshots and the matches
    of a few prompts must be equal once routed-expert data is stripped."""
    rng = random.Random(seed)
    rep = report or ExpertsReport()
    t0 = time.perf_counter()
    while rep.steps < steps:
        budget, interval = rng.choice((1, 2)), rng.choice((0, 4))
        a, b = (
            cache_type(
                BLOCKS, BS, max_num_seqs=2, state_budget=budget, decode_state_interval=interval
            )
            for _ in range(2)
        )
        for _ in range(40):
            live = [str(s) for s in a.seq_ids()]
            op = rng.choices(_OPS, _WEIGHTS)[0]
            free = [s for s in SEQ_IDS if s not in live]
            if op == "admit" or not live:
                op = "admit" if free else "commit"
            sid = rng.choice(free) if op == "admit" else rng.choice(live)
            calls = _calls(rng, a, op, sid)
            outs: list[object] = []
            for cache, call in zip((a, b), calls, strict=True):
                try:
                    outs.append(_strip(call(cache)))
                except PrefixCacheError as e:
                    outs.append(type(e))
            rep.steps += 1
            if outs[0] != outs[1]:
                raise DriftError(f"{op}({sid}) with and without routed experts: {outs}")
            if _strip(a.snapshot()) != _strip(b.snapshot()):
                raise DriftError(f"after {op}({sid}) the states differ beyond routed experts")
            for probe in (_request(rng, "probe") for _ in range(2)):
                ma, mb = a.match(probe), b.match(probe)
                rep.matches += 1
                rep.replays += ma.routed_experts is not None
                if _strip(ma) != _strip(mb):
                    raise DriftError(f"after {op}({sid}) a match depends on routed experts")
            if rep.steps >= steps:
                break
    rep.seconds = time.perf_counter() - t0
    return rep
