"""The KV model's transitions: one per spec operation, and the refusals of INV-TXN.

Every transition is a *function* of the pre-state and its arguments (a :class:`~.model.Step`).
The micro-steps (enqueue, release, evict one leaf, allocate) are written once and shared
by the operations, as in the spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import z3

from ..terms import Term
from .formulas import Formulas
from .model import (
    NONE,
    ROOT,
    AdmitArgs,
    AppendArgs,
    CommitArgs,
    ContinueArgs,
    CountArgs,
    Domain,
    EvictArgs,
    EvictManyArgs,
    FreeArgs,
    Int,
    NoArgs,
    OpArgs,
    SeqState,
    State,
    Step,
    ceil_blocks,
    cstore,
    empty_index,
)

__all__ = ["Encoding"]


class Encoding(Formulas):
    """The transition system and its invariants. Subclass and override to break it.

    Methods named ``inv_*`` build invariant formulas (:mod:`.formulas`); ``aux_*`` build
    the auxiliary invariants the proofs need; ``op_*`` build transitions. The spec's
    decision points are gathered in :class:`~.model.SpecDecisions`.
    """

    def refusals(self, d: Domain, st: State, op: str, a: OpArgs, s: int) -> list[tuple[str, Term]]:
        """The spec's raise sites of ``op``, in the order it checks them: ``(error class,
        condition on the pre-state and arguments)``. :meth:`failures` turns them into one
        failing precondition per class (its condition, no earlier check failing)."""
        sq = st.seqs[s]
        if op == "admit":
            assert isinstance(a, AdmitArgs)
            att, scheduled = self.attach(d, st, a, s)
            mid = att.post
            # NOTE: an empty prompt, a negative recompute_blocks or kv_token_limit are
            # refused when the Request is built, before admit runs; the model has no
            # Request, so they are admission's first check here. OutOfBlocks is decided
            # after the hit is pinned (the spec pins, evicts, then raises; the transaction
            # puts it all back).
            return [
                ("InvalidRequest", z3.Or(a.ntok < 1, a.recompute_blocks < 0, a.limit < 0)),
                ("InvalidRequest", z3.And(z3.Not(a.whole), a.num_new < 1)),
                ("DuplicateSequence", sq.live),
                (
                    "OutOfBlocks",
                    self.out_of_room(d, mid, self.need(mid, s, scheduled), a.victims),
                ),
            ]
        if op == "append":
            assert isinstance(a, AppendArgs)
            n = a.n
            return [
                ("UnknownSequence", z3.Not(sq.live)),
                ("InvalidRequest", n < 1),
                ("InvalidOperation", z3.And(sq.nr < sq.np, sq.lim > 0, sq.nr + n - sq.nc > sq.lim)),
                ("OutOfBlocks", self.out_of_room(d, st, self.need(st, s, n), a.victims)),
            ]
        if op == "continue_prefill":
            assert isinstance(a, ContinueArgs)
            n = self.chunk_size(sq.np - sq.nr, a.whole, a.num_new, sq.lim)
            return [
                ("UnknownSequence", z3.Not(sq.live)),
                ("InvalidRequest", z3.And(z3.Not(a.whole), a.num_new < 1)),
                ("InvalidOperation", sq.nr >= sq.np),
                ("InvalidOperation", sq.nc != sq.nr),
                ("OutOfBlocks", self.out_of_room(d, st, self.need(st, s, n), a.victims)),
            ]
        if op == "commit":
            assert isinstance(a, CommitArgs)
            nc = sq.nc + a.n
            return [
                ("UnknownSequence", z3.Not(sq.live)),
                ("InvalidRequest", z3.Or(a.n < 0, a.accepted < 0)),
                ("InvalidOperation", nc > sq.nr),
                ("InvalidOperation", nc > sq.ntok + a.accepted),
            ]
        if op == "rollback":
            assert isinstance(a, CountArgs)
            return [
                ("UnknownSequence", z3.Not(sq.live)),
                ("InvalidRequest", a.n < 1),
                ("InvalidOperation", sq.nr - a.n < sq.nc),
            ]
        if op == "free":
            assert isinstance(a, FreeArgs)
            return [
                (
                    "UnknownSequence",
                    z3.Or(
                        [z3.And(f, z3.Not(q.live)) for f, q in zip(a.freed, st.seqs, strict=True)]
                    ),
                )
            ]
        if op == "reset_full":
            return [("CacheBusy", z3.Or([q.live for q in st.seqs]))]
        return []

    def failures(self, d: Domain, st: State, op: str, a: OpArgs, s: int) -> dict[str, Term]:
        """Error class -> the failing precondition under which the spec raises it: one of
        its raise sites fires and no earlier check does."""
        out: dict[str, list[Term]] = {}
        earlier: list[Term] = []
        for cls, cond in self.refusals(d, st, op, a, s):
            out.setdefault(cls, []).append(z3.And(cond, *[z3.Not(e) for e in earlier]))
            earlier.append(cond)
        return {cls: z3.Or(cs) for cls, cs in out.items()}

    def out_of_room(self, d: Domain, st: State, need: Term, victims: Sequence[Term]) -> Term:
        """``SpecCache._allocate`` raises OutOfBlocks: evicting leaves one at a time (the given
        victims, each a leaf while blocks are short), the free queue is still short of
        ``need`` when no leaf is left."""
        out, ok = [], z3.BoolVal(True)
        for v in victims:
            short = st.num_free() < need
            out.append(z3.And(ok, short, z3.Not(self.exists_leaf(d, st))))
            ok = z3.And(ok, z3.Implies(short, self.is_leaf(d, st, v)))
            st = self.evict_one(st, v, short)
        out.append(z3.And(ok, st.num_free() < need))
        return z3.Or(out)

    def refused(self, st: State, op: str, a: OpArgs, s: int) -> State:
        """What a refused operation leaves: the pre-state (``SpecCache._transaction`` puts
        back its snapshot, statistics included)."""
        return st

    def outcome(self, d: Domain, st: State, op: str, a: OpArgs, s: int) -> State:
        """The state after calling ``op``: its successor if enabled, else what a refusal
        leaves (:meth:`refused`)."""
        step = self.step(d, st, op, a, s)
        return State.ite(step.enabled, step.post, self.refused(st, op, a, s))

    def enqueue(self, st: State, b: Term, cond: Term) -> State:
        return st.replace(
            q=cstore(st.q, st.qt, cond, b),
            qpos=cstore(st.qpos, b, cond, st.qt),
            qt=st.qt + z3.If(cond, 1, 0),
        )

    def release_all(self, st: State, holds: Sequence[tuple[Term, Term]]) -> State:
        """Drop the holds ``[(block, cond), ...]`` in this order, as one batched release.

        A block held ``k`` times loses ``k`` references. A block whose last hold goes is
        appended to the free queue (private) or stamped with the clock (published), in
        release order. Written with lambdas rather than a chain of stores, so a proof reads
        ``rc'[b]`` as one sum instead of splitting on every store.
        """
        holds = list(holds)

        def total(x: Term) -> Term:
            return z3.Sum([z3.If(z3.And(c, b == x), 1, 0) for b, c in holds] or [0])

        app, pos, placed = [], [], z3.IntVal(0)
        for r, (b, c) in enumerate(holds):
            so_far = z3.Sum([z3.If(z3.And(c2, b2 == b), 1, 0) for b2, c2 in holds[: r + 1]])
            a = z3.And(c, st.rc[b] - so_far == 0, self.frees_at_zero(st, b))
            app.append(a)
            pos.append(st.qt + placed)
            placed = placed + z3.If(a, 1, 0)
        x = z3.Int("lam!x")  # bound by the lambda below; the name never occurs free
        q_body, qpos_body = st.q[x], st.qpos[x]
        for (b, _), a, p in zip(holds, app, pos, strict=True):
            q_body = z3.If(z3.And(a, x == p), b, q_body)
            qpos_body = z3.If(z3.And(a, x == b), p, qpos_body)
        left = st.rc[x] - total(x)
        return st.replace(
            rc=z3.Lambda([x], left),
            lu=z3.Lambda(
                [x], z3.If(z3.And(st.pub[x], total(x) > 0, left == 0), st.clock, st.lu[x])
            ),
            q=z3.Lambda([x], q_body),
            qpos=z3.Lambda([x], qpos_body),
            qt=st.qt + placed,
        )

    def is_first_leaf(self, d: Domain, st: State, v: Term) -> Term:
        """``v`` precedes every leaf in the eviction order (determinism, not safety)."""
        return d.forall_blocks(
            st.N,
            lambda b: z3.Implies(self.is_leaf(d, st, b), self.evict_order_before(st, v, b)),
        )

    def evict_one(self, st: State, v: Term, cond: Term) -> State:
        """Unpublish leaf ``v``, drop its index entry, append it to the free queue."""
        st = st.replace(
            pub=cstore(st.pub, v, cond, z3.BoolVal(False)),
            idx=st.idx.put(st.key(v), cond, z3.IntVal(NONE)),
            depth=cstore(st.depth, v, cond, z3.IntVal(0)),
            lu=cstore(st.lu, v, cond, z3.IntVal(0)),
        )
        st = self.enqueue(st, v, cond)
        return st.count("evictions", z3.If(cond, 1, 0))

    def make_room(
        self, d: Domain, st: State, need: Term, victims: Sequence[Term]
    ) -> tuple[State, Term, Term]:
        """Evict leaves until ``need`` blocks are free: ``(state, enabled, choice)``."""
        en, ch = [], []
        for v in victims:
            short = st.num_free() < need
            en.append(z3.Implies(short, self.is_leaf(d, st, v)))
            ch.append(z3.Implies(short, self.is_first_leaf(d, st, v)))
            st = self.evict_one(st, v, short)
        en.append(st.num_free() >= need)
        return st, z3.And(en), z3.And(ch)

    def allocate(self, st: State, need: Term) -> tuple[State, list[Term]]:
        """Take ``need`` (at most ``table``) blocks from the head of the free queue."""
        taken = [st.q[st.qh + i] for i in range(self.bounds.table)]
        x = z3.Int("lam!x")  # bound by the lambda below; the name never occurs free
        hit = z3.Or([z3.And(i < need, b == x) for i, b in enumerate(taken)])
        rc = z3.Lambda([x], z3.If(hit, 1, st.rc[x]))
        return st.replace(rc=rc, qh=st.qh + need), taken

    def fresh_args(self, op: str, prefix: str) -> OpArgs:
        """Fresh argument variables of an operation (``slot`` is always a Python int)."""
        M, S = self.bounds.table, self.bounds.seqs
        victims = tuple(z3.Int(f"{prefix}victim{e}") for e in range(M))
        if op in ("admit", "attach"):
            return AdmitArgs(
                ns=z3.Int(f"{prefix}ns"),
                ntok=z3.Int(f"{prefix}ntok"),
                labels=tuple(z3.Int(f"{prefix}label{j}") for j in range(M)),
                num_new=z3.Int(f"{prefix}num_new"),
                whole=z3.Bool(f"{prefix}whole"),
                recompute_blocks=z3.Int(f"{prefix}recompute_blocks"),
                limit=z3.Int(f"{prefix}kv_token_limit"),
                victims=victims if op == "admit" else (),
            )
        if op == "append":
            return AppendArgs(z3.Int(f"{prefix}n"), victims)
        if op == "continue_prefill":
            return ContinueArgs(z3.Int(f"{prefix}num_new"), z3.Bool(f"{prefix}whole"), victims)
        if op in ("grow", "rollback"):
            return CountArgs(z3.Int(f"{prefix}n"))
        if op == "commit":
            return CommitArgs(
                z3.Int(f"{prefix}n"),
                z3.Int(f"{prefix}accepted"),
                tuple(z3.Int(f"{prefix}newlabel{j}") for j in range(M)),
            )
        if op == "free":
            return FreeArgs(tuple(z3.Bool(f"{prefix}freed{s}") for s in range(S)))
        if op == "evict":
            return EvictArgs(z3.Int(f"{prefix}victim"))
        if op.startswith("evict*"):
            n = int(op[len("evict*") :])
            return EvictManyArgs(tuple(z3.Int(f"{prefix}victim{e}") for e in range(n)))
        if op in ("reset_keep", "reset_full"):
            return NoArgs()
        raise ValueError(f"unknown operation {op!r}")

    def step(self, d: Domain, st: State, op: str, args: OpArgs, slot: int = 0) -> Step:
        """The transition of ``op`` (or of a proof step: ``attach``, ``grow``)."""
        if op == "attach":
            assert isinstance(args, AdmitArgs)
            return self._bounded(self.attach(d, st, args, slot)[0])
        if op == "grow":
            assert isinstance(args, CountArgs)
            return self._bounded(self.grow(d, st, slot, args.n))
        if op == "evict":
            assert isinstance(args, EvictArgs)
            return self._bounded(self.evict_step(d, st, args.victim))
        if op.startswith("evict*"):
            assert isinstance(args, EvictManyArgs)
            return self._bounded(self.op_evict(d, st, args))
        fn: Callable[..., Step] = getattr(self, f"op_{op}")
        if op in ("admit", "append", "continue_prefill", "commit", "rollback"):
            return self._bounded(fn(d, st, args, slot))
        return self._bounded(fn(d, st, args))

    def _bounded(self, step: Step) -> Step:
        """A transition is inside the model when its post-state is within the bounds."""
        return dataclasses.replace(step, bounded=z3.And(step.bounded, self.in_bounds(step.post)))

    def attach(self, d: Domain, st: State, a: AdmitArgs, s: int) -> tuple[Step, Term]:
        """First part of admit: match, cut off the recompute window, then pin the attached
        hit by installing it as the new table.

        As ``SpecCache.admit``: match (capped), window = the last ``min(recompute_blocks,
        matched)`` matched blocks, attach the rest. The window's blocks are *not* pinned:
        :meth:`grow` allocates fresh private blocks for them. Returns the step and the number
        of tokens the admission schedules. The sequence holds exactly its attached hit
        (``num_computed = num_reserved = num_cached = attached tokens``) afterwards, a state
        in which every invariant holds, so the evictions that follow are plain
        :meth:`op_evict` steps (the window's originals may be among the victims).
        """
        M, BS, sq = self.bounds.table, st.BS, st.seqs[s]
        ns, ntok, labels = a.ns, a.ntok, a.labels
        chain, matched, m = self.match_blocks(st, a)
        # window: the last min(recompute_blocks, m) matched blocks are not attached; grow
        # allocates fresh private blocks for them (choice 6)
        w = self.window_size(a.recompute_blocks, m)
        hit = [self.attached(matched[j], j, m, w) for j in range(M)]
        k = z3.Sum([z3.If(h, 1, 0) for h in hit])
        cached = z3.Sum([z3.If(h, BS, 0) for h in hit])
        remaining = ntok - cached
        scheduled = self.chunk_size(remaining, a.whole, a.num_new, a.limit)
        enabled = self.attach_guard(sq, a)
        rc = st.rc
        for j in range(M):
            rc = cstore(rc, chain[j], hit[j], rc[chain[j]] + 1)
        tab = tuple(z3.If(hit[j], chain[j], sq.tab[j]) for j in range(M))
        st = st.replace(rc=rc).seq(
            s,
            live=z3.BoolVal(True),
            ns=ns,
            ntok=ntok,
            nc=cached,
            nr=cached,
            len=k,
            nca=self.cached_tokens(BS, cached, w),
            win=w,
            np=ntok,
            lim=a.limit,
            tab=tab,
            lab=tuple(labels),
        )
        st = self.count_admission(st, ntok, cached, remaining)
        return Step("attach", enabled, z3.BoolVal(True), z3.BoolVal(True), st, a), scheduled

    def match_blocks(self, st: State, a: AdmitArgs) -> tuple[list[Term], list[Term], Term]:
        """The raw match of an admission: ``(chain, matched, m)``. ``matched[j]``: block ``j``
        is one of the consecutive hits of the identity chain, capped at ``(ntok - 1) // BS``
        blocks; ``m`` is how many there are."""
        chain = self.chain(st, a.ns, a.labels)
        matched, ok = [], z3.BoolVal(True)
        for j in range(self.bounds.table):
            ok = z3.And(ok, self.within_cap(st.BS, j, a.ntok), chain[j] != NONE)
            matched.append(ok)
        return chain, matched, z3.Sum([z3.If(h, 1, 0) for h in matched])

    def attached(self, matched: Term, j: int, m: Term, w: Term) -> Term:
        """Matched block ``j`` is attached: it is not one of the last ``w`` matched."""
        return z3.And(matched, j < m - w)

    def need(self, st: State, s: int, n: Term) -> Term:
        """New blocks sequence ``s`` needs to reserve ``n`` more slots."""
        sq = st.seqs[s]
        return self.table_length(sq.nr + n, st.BS) - sq.len

    def grow(self, d: Domain, st: State, s: int, n: Term) -> Step:
        """Last part of admit and append: reserve ``n`` more slots from the free queue.

        Enabled only when the free queue already holds the blocks it needs (the evictions
        that make room come before, as :meth:`op_evict` steps) and the reservation keeps
        within the ``kv_token_limit`` (:meth:`chunk_room`; every caller's guard implies it).
        """
        M, sq = self.bounds.table, st.seqs[s]
        nr = sq.nr + n
        length = self.table_length(nr, st.BS)
        need = length - sq.len
        enabled = z3.And(sq.live, n >= 0, st.num_free() >= need, self.grow_room(sq, nr))
        qh = st.qh
        st, _ = self.allocate(st, need)
        tab = tuple(
            z3.If(j < sq.len, sq.tab[j], z3.If(j < length, st.q[qh + j - sq.len], sq.tab[j]))
            for j in range(M)
        )
        st = st.seq(s, nr=nr, len=length, tab=tab)
        return Step("grow", enabled, nr <= M * st.BS, z3.BoolVal(True), st, CountArgs(n))

    def op_admit(self, d: Domain, st: State, a: AdmitArgs, s: int) -> Step:
        """admit: match -> pin -> evict -> allocate, as one transition (attach ; evict* ;
        grow)."""
        att, scheduled = self.attach(d, st, a, s)
        mid = att.post
        room, en_room, choice = self.make_room(d, mid, self.need(mid, s, scheduled), a.victims)
        g = self.grow(d, room, s, scheduled)
        return Step(
            "admit",
            z3.And(att.enabled, en_room, g.enabled),
            z3.And(att.bounded, g.bounded),
            choice,
            g.post,
            a,
        )

    def op_append(self, d: Domain, st: State, a: AppendArgs, s: int) -> Step:
        """append: reserve ``n`` more slots, evicting and allocating as needed (evict* ;
        grow)."""
        sq, n = st.seqs[s], a.n
        room, en_room, choice = self.make_room(d, st, self.need(st, s, n), a.victims)
        g = self.grow(d, room, s, n)
        enabled = z3.And(sq.live, n >= 1, self.growth_guard(sq, n), en_room, g.enabled)
        return Step("append", enabled, g.bounded, choice, g.post, a)

    def growth_guard(self, sq: SeqState, n: Term) -> Term:
        """``spec.cache.check_growth`` without spans: while the prompt is not fully reserved,
        growth keeps at most ``kv_token_limit`` uncommitted tokens."""
        return z3.Implies(z3.And(sq.nr < sq.np, sq.lim > 0), sq.nr + n - sq.nc <= sq.lim)

    def op_continue_prefill(self, d: Domain, st: State, a: ContinueArgs, s: int) -> Step:
        """continue_prefill: once the previous chunk is committed, reserve the next one
        (evict* ; grow), sized like the first (:meth:`chunk_size`)."""
        sq = st.seqs[s]
        n = self.chunk_size(sq.np - sq.nr, a.whole, a.num_new, sq.lim)
        room, en_room, choice = self.make_room(d, st, self.need(st, s, n), a.victims)
        g = self.grow(d, room, s, n)
        enabled = z3.And(self.continue_guard(sq, a), en_room, g.enabled)
        return Step("continue_prefill", enabled, g.bounded, choice, g.post, a)

    def op_commit(self, d: Domain, st: State, a: CommitArgs, s: int) -> Step:
        """commit: accept tokens, mark KV written, publish the newly full committed blocks."""
        M, BS, sq = self.bounds.table, st.BS, st.seqs[s]
        n, acc = a.n, a.accepted
        ntok, nc = sq.ntok + acc, sq.nc + n
        enabled = self.commit_guard(sq, n, acc)
        labels = tuple(z3.If((j + 1) * BS <= sq.ntok, sq.lab[j], a.labels[j]) for j in range(M))
        st = self.publish(st, sq, self.identity_labels(sq.lab, labels), nc, ntok)
        st = st.seq(s, ntok=ntok, nc=nc, lab=labels)
        return Step("commit", enabled, z3.BoolVal(True), z3.BoolVal(True), st, a)

    def publish(
        self, st: State, sq: SeqState, labels: Sequence[Term], new_nc: Term, ntok: Term
    ) -> State:
        """Publish, in table order, the blocks that this commit completed (choice 1)."""
        c, c_ok = z3.IntVal(ROOT), z3.BoolVal(True)
        for j in range(self.bounds.table):
            b = sq.tab[j]
            key = (sq.ns, c, labels[j])
            look = st.idx.get(key)
            taken = z3.And(c_ok, look != NONE)
            do = self.may_publish(self.newly_committed(st.BS, j, sq, new_nc, ntok), c_ok, taken)
            st = st.replace(
                pub=cstore(st.pub, b, do, z3.BoolVal(True)),
                par=cstore(st.par, b, do, c),
                bns=cstore(st.bns, b, do, sq.ns),
                btok=cstore(st.btok, b, do, labels[j]),
                depth=cstore(st.depth, b, do, self.block_depth(j)),
                idx=st.idx.put(key, do, b),
            ).count("published", z3.If(do, 1, 0))
            # the canonical block of this identity, for the next block's parent
            c = z3.If(taken, look, z3.If(do, b, z3.IntVal(NONE)))
            c_ok = c != NONE
        return st

    def op_rollback(self, d: Domain, st: State, a: CountArgs, s: int) -> Step:
        """rollback: give back the last ``n`` unwritten slots, releasing blocks tail first."""
        M, sq, n = self.bounds.table, st.seqs[s], a.n
        nr = sq.nr - n
        keep = ceil_blocks(nr, st.BS, M)
        enabled = z3.And(sq.live, n >= 1, nr >= sq.nc)
        st = self.release_all(
            st, [(sq.tab[j], z3.And(keep <= j, j < sq.len)) for j in reversed(range(M))]
        )
        st = st.seq(s, nr=nr, len=keep)
        return Step("rollback", enabled, z3.BoolVal(True), z3.BoolVal(True), st, a)

    def free_seqs(self, st: State, freed: Sequence[Term]) -> State:
        """Release every freed sequence's table, slot order, each table tail first."""
        st = st.replace(clock=st.clock + 1)
        pre = st
        st = self.release_all(
            st,
            [
                (sq.tab[j], z3.And(f, j < sq.len))
                for f, sq in zip(freed, pre.seqs, strict=True)
                for j in reversed(range(self.bounds.table))
            ],
        )
        for s, f in enumerate(freed):
            st = st.seq(s, live=z3.And(pre.seqs[s].live, z3.Not(f)))
        return st

    def op_free(self, d: Domain, st: State, a: FreeArgs) -> Step:
        """free: batched release; a block held by several freed tables drops once per hold."""
        freed = a.freed
        enabled = z3.And([z3.Implies(f, sq.live) for f, sq in zip(freed, st.seqs, strict=True)])
        post = self.free_seqs(st, freed)
        return Step("free", enabled, z3.BoolVal(True), z3.BoolVal(True), post, a)

    def evict_step(self, d: Domain, st: State, v: Term) -> Step:
        """Proof step: evict one leaf ``v``. Admission, append and ``evict(n)`` are built
        from this step (or a stutter), so its proof covers every eviction."""
        post = self.evict_one(st, v, z3.BoolVal(True))
        return Step(
            "evict",
            self.is_leaf(d, st, v),
            z3.BoolVal(True),
            self.is_first_leaf(d, st, v),
            post,
            EvictArgs(v),
        )

    def exists_leaf(self, d: Domain, st: State) -> Term:
        return d.exists_blocks(st.N, lambda b: self.is_leaf(d, st, b))

    def op_evict(self, d: Domain, st: State, a: EvictManyArgs) -> Step:
        """``evict(n)`` with ``n = len(victims)``: evict leaves while there are any."""
        en, ch = [], []
        for v in a.victims:
            avail = self.exists_leaf(d, st)
            en.append(z3.Implies(avail, self.is_leaf(d, st, v)))
            ch.append(z3.Implies(avail, self.is_first_leaf(d, st, v)))
            st = self.evict_one(st, v, avail)
        return Step("evict", z3.And(en), z3.BoolVal(True), z3.And(ch), st, a)

    def op_reset_keep(self, d: Domain, st: State, a: NoArgs) -> Step:
        """reset(preserve_cache=True): free every live sequence, keep published blocks."""
        live = [sq.live for sq in st.seqs]
        post = State.ite(z3.Or(live), self.free_seqs(st, live), st)
        return Step("reset_keep", z3.BoolVal(True), z3.BoolVal(True), z3.BoolVal(True), post, a)

    def op_reset_full(self, d: Domain, st: State, a: NoArgs) -> Step:
        """reset(preserve_cache=False): refused while a sequence is live; else a fresh pool."""
        enabled = z3.Not(z3.Or([sq.live for sq in st.seqs]))
        i = z3.Int("lam!i")
        support: tuple[tuple[Term, Term, Term], ...] | None = None if d.n is None else ()
        post = st.replace(
            rc=z3.K(Int, z3.IntVal(0)),
            pub=z3.K(Int, z3.BoolVal(False)),
            depth=z3.K(Int, z3.IntVal(0)),
            lu=z3.K(Int, z3.IntVal(0)),
            q=z3.Lambda([i], i),
            qpos=z3.Lambda([i], i),
            qh=z3.IntVal(0),
            qt=st.N,
            idx=empty_index(support),
        )
        return Step("reset_full", enabled, z3.BoolVal(True), z3.BoolVal(True), post, a)

    def init_state(self, d: Domain, st: State) -> Term:
        """The initial state (a fresh cache) as a constraint on ``st``."""
        return z3.And(
            z3.Not(z3.Or([sq.live for sq in st.seqs])),
            st.qh == 0,
            st.qt == st.N,
            d.forall_blocks(
                st.N,
                lambda b: z3.And(st.rc[b] == 0, z3.Not(st.pub[b]), st.q[b] == b, st.qpos[b] == b),
            ),
            d.forall_keys(st.idx, lambda ns, p, t, v: v == NONE),
            st.clock == 0,
            *[v == 0 for v in st.ctr.values()],
        )
