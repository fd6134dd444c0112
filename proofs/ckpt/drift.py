"""No drift between the checkpoint model (:mod:`.transitions`) and :class:`HybridSpecCache`.

Random runs of the executable spec, step by step: the pre-state is abstracted to the model's
variables, the environment's choices (evicted nodes, published nodes, the index's node for the
reservation, the new save point) are read off the spec's own run, and the model's transition
with the pre-state, the arguments and the spec's successor substituted in must simplify to
``True``. When the spec rejects an operation for a checkpoint reason (no live sequence, no
runtime slot, no restore pending, a busy full reset), the model's guard must simplify to
``False``. Rejections on the KV side (a bad commit count, no free block) are the main drift
check's business and are only counted here. Every reachable pre-state must also satisfy the
model's invariant (and the spec's ``invariants.check``), so the two cannot drift apart. The
drifted models this check must catch are in :mod:`.seeded`.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3
from prefixkv.spec import (
    HybridSpecCache,
    Namespace,
    PrefixCacheError,
    Request,
    SpecCache,
    invariants,
)
from prefixkv.spec.cache import identity_chain
from prefixkv.spec.contract import save_point

from .. import ckpt as ck
from ..driver import DriftError, Substituter, drive
from ..terms import Term
from .model import (
    COUNTERS,
    FREE,
    PINNED,
    READY,
    RESERVED,
    RUNTIME,
    CkptArgs,
    CkptBounds,
)
from .transitions import CkptModel

__all__ = ["CkptDriftChecker", "CkptDriftReport", "run_ckpt_drift"]

SEQ_IDS = ("q0", "q1", "q2")
NS = Namespace("hybrid-proofs@1")
BS = 2
_KIND = {"reserved": RESERVED, "ready": READY, "pinned": PINNED}


def abstract(cache: HybridSpecCache, S: int) -> dict[str, Any]:
    """The model's view of a concrete hybrid cache (``checkpoints.read_state``'s shape)."""
    snap = cache.snapshot()
    h = snap.state_slots
    assert h is not None
    K = h.num_runtime_slots + h.state_budget
    bs = cache.block_size
    c: dict[str, Any] = {
        "kind": [FREE] * K,
        "owner": [-1] * K,
        "node": [-1] * K,
        "bnd": [0] * K,
        "order": [0] * K,
        "live": [False] * S,
        "rt": [-1] * S,
        "cached": [0] * S,
        "hit": [-1] * S,
        "comp": [0] * S,
        "sp": [0] * S,
        "pub": [v.published for v in snap.blocks],
        "depth": [v.depth if v.published else 0 for v in snap.blocks],
    }
    for sid, slot in h.runtime:
        c["kind"][slot], c["owner"][slot] = RUNTIME, SEQ_IDS.index(str(sid))
    for v in h.checkpoints:
        s = v.slot
        c["kind"][s], c["bnd"][s], c["order"][s] = _KIND[v.status], v.boundary // bs, v.order
        if v.boundary % bs:
            raise DriftError(f"checkpoint {s} at {v.boundary} is not block aligned")
        c["owner"][s] = -1 if v.owner is None else SEQ_IDS.index(str(v.owner))
        c["node"][s] = -1 if v.node is None else v.node
    runtime = dict(h.runtime)
    for seq in snap.sequences:
        q = SEQ_IDS.index(str(seq.seq_id))
        cached = seq.num_cached_tokens // bs
        c["live"][q], c["rt"][q], c["cached"][q] = True, runtime[seq.seq_id], cached
        c["hit"][q] = seq.block_ids[cached - 1] if cached else -1
        c["comp"][q] = seq.num_computed // bs
        c["sp"][q] = (
            save_point(
                seq.num_computed,
                seq.num_reserved,
                seq.num_prompt_tokens,
                bs,
                h.decode_state_interval,
            )
            // bs
        )
    stats = cache.stats()
    c["clock"] = cache._store.order
    c["ctr"] = {
        "saved": stats.checkpoints_saved,
        "discarded": stats.checkpoints_discarded,
        "restored": stats.checkpoints_restored,
        "stale": stats.checkpoints_released_stale,
        "evicted": stats.checkpoints_evicted,
    }
    return c


def _flat(c: dict[str, Any]) -> list[int | bool]:
    out = [x for f in ck.LIST_FIELDS for x in c[f]]
    return [*out, c["clock"], *(c["ctr"][k] for k in COUNTERS)]


def _arg_values(args: CkptArgs, vals: dict[str, Any]) -> list[int | bool]:
    out: list[int | bool] = []
    for name, var in args._asdict().items():
        if isinstance(var, list):
            out += list(vals[name])
        else:
            out.append(vals[name])
    return out


def _arg_vars(args: CkptArgs) -> list[Term]:
    out: list[Term] = []
    for var in args:
        out += var if isinstance(var, list) else [var]
    return out


@dataclass
class _Compiled:
    ok: Any
    guard: Any
    args: CkptArgs
    subst: Substituter
    guard_subst: Substituter


class CkptDriftChecker:
    """The model's transitions, compiled once per (operation, sequence slot)."""

    def __init__(self, model: CkptModel) -> None:
        self.model = model
        self.pre = model.fresh("p.")
        self.spost = model.fresh("q.")
        self._compiled: dict[tuple[str, int], _Compiled] = {}
        self._inv = model.inv(self.pre)
        self._inv_subst = Substituter(self.pre.leaves())

    def compiled(self, op: str, q: int) -> _Compiled:
        key = (op, q)
        if key not in self._compiled:
            args = self.model.fresh_args(op)
            st = self.model.step(op, self.pre, q, args)
            avars = _arg_vars(args)
            self._compiled[key] = _Compiled(
                ok=z3.And(st.guard, self.model.same(st.post, self.spost)),
                guard=st.guard,
                args=args,
                subst=Substituter([*self.pre.leaves(), *self.spost.leaves(), *avars]),
                guard_subst=Substituter([*self.pre.leaves(), *avars]),
            )
        return self._compiled[key]

    def invariant_holds(self, c: dict[str, Any]) -> bool:
        return bool(z3.is_true(self._inv_subst(self._inv, _flat(c))))

    def check(
        self,
        op: str,
        q: int,
        pre: dict[str, Any],
        vals: dict[str, Any],
        post: dict[str, Any] | None,
        what: str,
    ) -> str:
        comp = self.compiled(op, q)
        a = _arg_values(comp.args, vals)
        if post is None:
            if z3.is_false(comp.guard_subst(comp.guard, [*_flat(pre), *a])):
                return "rejected"
            raise DriftError(
                f"the spec rejects {what} but the model allows it\n" + ck.format_cstate(pre)
            )
        if z3.is_true(comp.subst(comp.ok, [*_flat(pre), *_flat(post), *a])):
            return "ok"
        guard = comp.guard_subst(comp.guard, [*_flat(pre), *a])
        lines = [
            f"drift on {what}: "
            + (
                "the model rejects a step the spec takes"
                if z3.is_false(guard)
                else "model and spec reach different states"
            ),
            "pre-state:",
            ck.format_cstate(pre),
            f"arguments: {vals}",
            "spec post-state:",
            ck.format_cstate(post),
        ]
        if not z3.is_false(guard):
            st = self.model.step(op, self.pre, q, comp.args)
            pairs = [
                (v, z3.BoolVal(bool(x)) if z3.is_bool(v) else z3.IntVal(int(x)))
                for v, x in zip(comp.guard_subst.vars, [*_flat(pre), *a], strict=True)
            ]
            mpost = ck.read_state(st.post, lambda t: z3.simplify(z3.substitute(t, *pairs)))
            lines += ["model post-state:", ck.format_cstate(mpost)]
        raise DriftError("\n".join(lines))


@dataclass
class CkptDriftReport:
    checks: int = 0
    successes: int = 0
    rejections: int = 0
    kv_rejections: int = 0
    invariant_checks: int = 0
    seconds: float = 0.0
    by_op: dict[str, int] = field(default_factory=dict)
    fates: dict[str, int] = field(default_factory=dict)
    """How often each checkpoint counter moved: evidence that the runs exercise the lifecycle."""


# -- random runs ----------------------------------------------------------------------------

_PREFIXES = ((1, 2, 3, 4, 5, 6, 7, 8, 9, 1), (1, 2, 3, 4, 2, 2, 3, 3), (5, 5, 6, 6, 7, 7))


def _request(rng: random.Random, seq_id: str) -> Request:
    base = rng.choice(_PREFIXES)
    if rng.random() < 0.5:  # the same prompt again: twins and full-boundary hits
        return Request(seq_id, base, NS)
    n = rng.randint(2, len(base))
    tokens = list(base[:n]) + [rng.randrange(4) for _ in range(rng.randint(0, 2))]
    limit = rng.choice((None, None, 2, 3, 4))
    return Request(seq_id, tokens, NS, kv_token_limit=limit)


def _published(cache: SpecCache) -> dict[str, Any]:
    return {"pub": [v.published for v in cache.snapshot().blocks]}


def _newly(pre: dict[str, Any], post: dict[str, Any], was: bool) -> list[bool]:
    return [p == was and q != was for p, q in zip(pre["pub"], post["pub"], strict=True)]


_OPS = (
    "admit",
    "commit",
    "append",
    "continue_prefill",
    "rollback",
    "restore_issued",
    "free",
    "evict",
    "reset_keep",
    "reset_full",
)
_WEIGHTS = (5, 6, 2, 2, 1, 2, 2, 1, 0.3, 0.5)


class _Runner:
    def __init__(
        self,
        checker: CkptDriftChecker,
        cache: HybridSpecCache,
        rng: random.Random,
        report: CkptDriftReport,
    ) -> None:
        self.checker, self.cache, self.rng, self.report = checker, cache, rng, report
        self.S = checker.model.S

    def step(self) -> None:
        cache = self.cache
        op, sid = self.pick()
        q = SEQ_IDS.index(sid) if op in ck.SEQ_OPS else 0
        pre = abstract(cache, self.S)
        self.report.invariant_checks += 1
        if not self.checker.invariant_holds(pre):
            raise DriftError(
                "a reachable state breaks the model's invariant\n" + ck.format_cstate(pre)
            )
        vals: dict[str, Any] = {}
        trial: HybridSpecCache | None = None
        if op == "admit":
            action, kv_trial, trial = self.admit_action(sid, vals)
            try:
                kv_trial()
            except PrefixCacheError:
                self._kv_rejected(op, action)
                return
        else:
            action = self.action(op, sid)
        try:
            action()
        except PrefixCacheError:
            if op in ("admit", "restore_issued", "reset_full") or (
                not pre["live"][q] and op in ck.SEQ_OPS
            ):
                self._fill_rejected(op, vals, pre, sid, trial)
                self._record(op, q, pre, vals, None)
            else:
                self.report.kv_rejections += 1
            return
        post = abstract(cache, self.S)
        self._fill(op, vals, pre, post, sid, trial)
        self._record(op, q, pre, vals, post)

    def pick(self) -> tuple[str, str]:
        """A random operation and the sequence it acts on (mostly a live one, or a free slot
        for ``admit``; now and then one that makes the spec refuse)."""
        rng = self.rng
        live = [str(s) for s in self.cache._s.seqs]
        free = [s for s in SEQ_IDS[: self.S] if s not in live]
        op = rng.choices(_OPS, _WEIGHTS)[0]
        if op == "admit" and not free:
            op = "commit"
        elif op in ck.SEQ_OPS and not live and rng.random() < 0.9:
            op = "admit"
        if op in ck.SEQ_OPS and op != "admit":
            pool = live if live and rng.random() < 0.95 else list(SEQ_IDS[: self.S])
            sid = rng.choice(pool)
        elif op == "admit":
            sid = rng.choice(free) if rng.random() < 0.95 else rng.choice(SEQ_IDS[: self.S])
        else:
            sid = SEQ_IDS[0]
        return op, sid

    def admit_action(
        self, sid: str, vals: dict[str, Any]
    ) -> tuple[Callable[[], object], Callable[[], object], HybridSpecCache]:
        """An admission, its KV part alone on a copy of the cache (the trial), and the copy;
        the environment's choices (hit length, hit node, restore slot) go into ``vals``."""
        rng, cache = self.rng, self.cache
        req = _request(rng, sid)
        n_new = rng.choice((None, None, 1, 2, 3))
        trial = copy.deepcopy(cache)
        m = trial.match(req)
        c = m.num_cached_tokens // BS
        vals.update(
            c=c,
            h=m.block_ids[c - 1] if c else -1,
            r=-1 if m.restore_slot is None else m.restore_slot,
        )
        return (
            lambda: cache.admit(req, n_new),
            lambda: SpecCache.admit(trial, req, n_new),
            trial,
        )

    def action(self, op: str, sid: str) -> Callable[[], object]:
        """The spec call of ``op`` (not ``admit``) on ``sid``, its random arguments drawn."""
        rng, cache = self.rng, self.cache
        if op == "append":
            k = rng.randint(1, 3)
            return lambda: cache.append(sid, k)
        if op == "continue_prefill":
            n2 = rng.choice((None, 1, 2))
            return lambda: cache.continue_prefill(sid, n2)
        if op == "rollback":
            seq = cache._s.seqs.get(sid)
            k = max(1, seq.num_reserved - seq.num_computed) if seq else 1
            k = rng.randint(1, k)
            return lambda: cache.rollback(sid, k)
        if op == "commit":
            seq = cache._s.seqs.get(sid)
            room = seq.num_reserved - seq.num_computed if seq else 1
            delta = room if rng.random() < 0.5 else rng.randint(0, max(0, room))
            need = (seq.num_computed + delta - len(seq.tokens)) if seq else 0
            accepted = [rng.randrange(4) for _ in range(max(0, need))]
            return lambda: cache.commit(sid, delta, accepted)
        if op == "restore_issued":
            return lambda: cache.restore_issued(sid)
        if op == "free":
            return lambda: cache.free([sid])
        if op == "evict":
            k = rng.randint(1, 3)
            return lambda: cache.evict(k)
        keep = op == "reset_keep"
        return lambda: cache.reset(preserve_cache=keep)

    def _kv_rejected(self, op: str, action: Callable[[], object]) -> None:
        try:
            action()
        except PrefixCacheError:
            self.report.kv_rejections += 1
            return
        raise DriftError(f"{op}: the KV part alone fails, the hybrid operation succeeds")

    def _fill_rejected(
        self,
        op: str,
        vals: dict[str, Any],
        pre: dict[str, Any],
        sid: str,
        trial: HybridSpecCache | None,
    ) -> None:
        M = self.checker.model.M
        vals.setdefault("victim", [False] * M)
        vals.setdefault("sp", 0)
        if op == "admit" and trial is not None:
            vals["victim"] = _newly(pre, _published(trial), True)
            seq = trial._s.seqs[sid]
            vals["sp"] = (
                save_point(
                    seq.num_computed,
                    seq.num_reserved,
                    seq.prompt_len,
                    BS,
                    trial.decode_state_interval,
                )
                // BS
            )
        vals.update(
            {"comp": 0, "t": -1, "newpub": [False] * M, "ndepth": [0] * M} if op == "commit" else {}
        )

    def _fill(
        self,
        op: str,
        vals: dict[str, Any],
        pre: dict[str, Any],
        post: dict[str, Any],
        sid: str,
        trial: HybridSpecCache | None,
    ) -> None:
        q = SEQ_IDS.index(sid)
        vals["victim"] = _newly(pre, post, True)
        if op == "admit" and trial is not None:
            vals["victim"] = _newly(pre, _published(trial), True)
        if op in ("admit", "append", "continue_prefill", "rollback", "commit"):
            vals["sp"] = post["sp"][q]
        if op == "commit":
            seq = self.cache._s.seqs[sid]
            vals.update(
                comp=post["comp"][q], newpub=_newly(pre, post, False), ndepth=post["depth"], t=-1
            )
            for s, kind in enumerate(pre["kind"]):
                if kind == RESERVED and pre["owner"][s] == q and pre["bnd"][s] <= post["comp"][q]:
                    b = pre["bnd"][s]
                    chain = identity_chain(seq.namespace.key(), seq.tokens, BS, b, seq.spans)
                    node = self.cache._s.index.get(chain[b - 1])
                    vals["t"] = -1 if node is None else node

    def _record(
        self,
        op: str,
        q: int,
        pre: dict[str, Any],
        vals: dict[str, Any],
        post: dict[str, Any] | None,
    ) -> None:
        r = self.checker.check(op, q, pre, vals, post, f"{op}(q{q})")
        self.report.checks += 1
        self.report.by_op[op] = self.report.by_op.get(op, 0) + 1
        if r == "ok":
            self.report.successes += 1
            assert post is not None
            for k in COUNTERS:
                if post["ctr"][k] > pre["ctr"][k]:
                    self.report.fates[k] = self.report.fates.get(k, 0) + 1
            invariants.check(self.cache)
        else:
            self.report.rejections += 1


CONFIGS = (
    (CkptBounds(runtime=2, budget=2, seqs=3, nodes=6), 0),
    (CkptBounds(runtime=2, budget=2, seqs=3, nodes=6), 4),
    (CkptBounds(runtime=1, budget=1, seqs=2, nodes=6), 2),
)
"""(model bounds, decode_state_interval) of the drift runs; nodes = the pool's blocks."""


_CHECKERS: dict[tuple[type[CkptModel], CkptBounds], CkptDriftChecker] = {}


def _checker(model: type[CkptModel], bounds: CkptBounds) -> CkptDriftChecker:
    """Compiled formulas are kept per (model, bounds): compiling costs more than checking."""
    key = (model, bounds)
    if key not in _CHECKERS:
        _CHECKERS[key] = CkptDriftChecker(model(bounds))
    return _CHECKERS[key]


def run_ckpt_drift(
    checks: int,
    seed: int = 0,
    model: type[CkptModel] = CkptModel,
    steps_per_run: int = 40,
    report: CkptDriftReport | None = None,
) -> CkptDriftReport:
    """About ``checks`` drift checks over random runs of :class:`HybridSpecCache`."""
    report = report or CkptDriftReport()
    checkers = {b: _checker(model, b) for b, _ in CONFIGS}

    def start(rng: random.Random) -> _Runner:
        bounds, interval = CONFIGS[rng.randrange(len(CONFIGS))]
        cache = HybridSpecCache(
            bounds.nodes,
            BS,
            max_num_seqs=bounds.runtime,
            state_budget=bounds.budget,
            decode_state_interval=interval,
        )
        return _Runner(checkers[bounds], cache, rng, report)

    return drive(report, checks, lambda r: r.checks, start, seed=seed, steps_per_run=steps_per_run)
