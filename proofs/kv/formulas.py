"""The KV model's invariants as formulas over one state (INV-* and their strengthenings).

Each ``inv_*`` method states one invariant of ``docs/invariants.md`` for a state of
:mod:`.model`; ``aux_*`` are the auxiliary invariants the induction needs
(``STRENGTHENINGS`` in :mod:`.obligations`). :meth:`Formulas.lookup_ok` is INV-MATCH for a
lookup of any prompt, in any state.
"""

from __future__ import annotations

import dataclasses

import z3
from prefixkv.spec.invariant_ids import InvariantId

from ..terms import Term
from .model import (
    NONE,
    ROOT,
    AdmitArgs,
    Domain,
    Query,
    SeqState,
    SpecDecisions,
    State,
    Step,
    ceil_blocks,
)

__all__ = ["Formulas"]


class Formulas(SpecDecisions):
    """Invariant formulas; :class:`~.transitions.Encoding` adds the transitions."""

    def held(self, st: State, b: Term) -> Term:
        """How many block-table entries hold ``b`` (what refcount must equal)."""
        return z3.Sum(
            [
                z3.If(z3.And(sq.live, j < sq.len, sq.tab[j] == b), 1, 0)
                for sq in st.seqs
                for j in range(self.bounds.table)
            ]
        )

    def inv_ref(self, d: Domain, st: State) -> Term:
        """INV-REF: refcount = number of table entries holding the block; tables hold pool
        blocks, each at most once."""
        M = self.bounds.table
        tables = []
        for sq in st.seqs:
            for j in range(M):
                tables.append(z3.Implies(z3.And(sq.live, j < sq.len), st.inb(sq.tab[j])))
                for i in range(j):
                    tables.append(z3.Implies(z3.And(sq.live, j < sq.len), sq.tab[i] != sq.tab[j]))
        return z3.And(*tables, d.forall_blocks(st.N, lambda b: st.rc[b] == self.held(st, b)))

    def inv_partition(self, d: Domain, st: State) -> Term:
        """INV-PARTITION: free / evictable / in-use partition the pool; the free queue lists
        pool blocks, each once (so its length is the number of free blocks)."""

        def one(b: Term) -> Term:
            free, evictable, used = st.in_free(b), z3.And(st.pub[b], st.rc[b] == 0), st.rc[b] > 0
            return z3.And(
                st.rc[b] >= 0,
                st.qpos[b] < st.qt,
                z3.Implies(free, st.q[st.qpos[b]] == b),
                z3.Or(free, evictable, used),
                z3.Not(z3.And(free, evictable)),
                z3.Not(z3.And(free, used)),
            )

        queue = d.forall_queue(
            st.qh, st.qt, lambda i: z3.And(st.inb(st.q[i]), st.qpos[st.q[i]] == i)
        )
        return z3.And(st.qh <= st.qt, queue, d.forall_blocks(st.N, one))

    def inv_index(self, d: Domain, st: State) -> Term:
        """INV-INDEX: entries point at published blocks whose identity is the key; every
        published block is indexed under its identity (so identities are unique)."""
        entries = d.forall_keys(
            st.idx,
            lambda ns, p, t, v: z3.Implies(
                v != NONE,
                z3.And(st.inb(v), st.pub[v], st.bns[v] == ns, st.par[v] == p, st.btok[v] == t),
            ),
        )
        blocks = d.forall_blocks(st.N, lambda b: z3.Implies(st.pub[b], st.idx.get(st.key(b)) == b))
        return z3.And(entries, blocks)

    def inv_ancestor(self, d: Domain, st: State) -> Term:
        """INV-ANCESTOR: a published block's parent is published, one level up, same
        namespace; roots have depth 1."""

        def one(b: Term) -> Term:
            p = st.par[b]
            return z3.Implies(
                st.pub[b],
                z3.Or(
                    z3.And(p == ROOT, st.depth[b] == 1),
                    z3.And(
                        st.inb(p),
                        st.pub[p],
                        st.depth[p] + 1 == st.depth[b],
                        st.bns[p] == st.bns[b],
                    ),
                ),
            )

        return d.forall_blocks(st.N, one)

    def inv_write(self, d: Domain, st: State) -> Term:
        """INV-WRITE: the blocks a sequence will still write (from num_computed // BS on) are
        private (unpublished, refcount 1); an unpublished block in a table has refcount 1."""
        out = []
        for sq in st.seqs:
            for j in range(self.bounds.table):
                b = sq.tab[j]
                held = z3.And(sq.live, j < sq.len)
                out.append(
                    z3.Implies(
                        z3.And(held, (j + 1) * st.BS > sq.nc),
                        z3.And(z3.Not(st.pub[b]), st.rc[b] == 1),
                    )
                )
                out.append(z3.Implies(z3.And(held, z3.Not(st.pub[b])), st.rc[b] == 1))
        return z3.And(out)

    def inv_publish(self, d: Domain, st: State) -> Term:
        """INV-PUBLISH: a published block in a table is computed and committed, carries the
        sequence's accepted tokens and namespace, and links to the previous block."""
        out = []
        for sq in st.seqs:
            for j in range(self.bounds.table):
                b = sq.tab[j]
                conds = [
                    (j + 1) * st.BS <= sq.nc,
                    st.btok[b] == sq.lab[j],
                    st.bns[b] == sq.ns,
                ]
                if j == 0:
                    conds.append(st.par[b] == ROOT)
                else:
                    prev = sq.tab[j - 1]
                    conds.append(z3.Implies(st.pub[prev], st.par[b] == prev))
                out.append(z3.Implies(z3.And(sq.live, j < sq.len, st.pub[b]), z3.And(conds)))
        return z3.And(out)

    def in_window(self, BS: Term, sq: SeqState, j: int) -> Term:
        """Table position ``j`` lies in the sequence's recompute window: ``num_cached // BS
        <= j < num_cached // BS + window_blocks``, unrolled over the cached-block count so it
        stays linear in ``BS``."""
        return z3.Or([z3.And(sq.nca == f * BS, j < f + sq.win) for f in range(j + 1)])

    def window_shape(self, BS: Term, sq: SeqState) -> Term:
        """The cached prefix is block aligned and computed (``num_cached % BS == 0`` and
        ``num_computed >= num_cached``). Within the bounds ``num_cached <= table * BS``."""
        aligned = z3.Or([sq.nca == f * BS for f in range(self.bounds.table + 1)])
        return z3.And(aligned, sq.nc >= sq.nca)

    def inv_window(self, d: Domain, st: State) -> Term:
        """INV-WINDOW: a private recompute window holds only fresh private blocks. The cached
        prefix is block aligned and computed, and every window block not yet fully computed
        is unpublished with refcount 1 (``spec.invariants._inv_window``)."""
        out = []
        for sq in st.seqs:
            conds = [self.window_shape(st.BS, sq)]
            for j in range(self.bounds.table):
                b = sq.tab[j]
                conds.append(
                    z3.Implies(
                        z3.And(
                            j < sq.len,
                            self.in_window(st.BS, sq, j),
                            self.window_pending(st.BS, sq, j),
                        ),
                        z3.And(z3.Not(st.pub[b]), st.rc[b] == 1),
                    )
                )
            out.append(z3.Implies(sq.live, z3.And(conds)))
        return z3.And(out)

    def chunk_limit(self, sq: SeqState) -> Term:
        """INV-LIMIT's chunk form: while a prompt is prefilled under a ``kv_token_limit``
        (``num_reserved <= prompt_len`` and ``num_computed < prompt_len``), at most ``limit``
        reserved prompt tokens are uncommitted."""
        prefilling = z3.And(sq.lim > 0, sq.nr <= sq.np, sq.nc < sq.np)
        return z3.Implies(prefilling, sq.nr - sq.nc <= sq.lim)

    def inv_limit(self, d: Domain, st: State) -> Term:
        """INV-LIMIT: a table holds exactly ceil(num_reserved / BS) blocks; computed <=
        reserved and computed <= known tokens."""
        M = self.bounds.table
        out = []
        for sq in st.seqs:
            out.append(
                z3.Implies(
                    sq.live,
                    z3.And(
                        sq.nc >= 0,
                        sq.nc <= sq.nr,
                        sq.nc <= sq.ntok,
                        sq.len == ceil_blocks(sq.nr, st.BS, M),
                        self.chunk_limit(sq),
                    ),
                )
            )
        return z3.And(out)

    def aux_chunk(self, d: Domain, st: State) -> Term:
        """AUX-CHUNK (strengthening): ``1 <= prompt_len <= known tokens``, the limit is 0
        (None) or positive, and :meth:`chunk_room` holds for the current reservation. Without
        it INV-LIMIT's chunk form is not inductive over rollback: decode growth may reserve
        past the prompt, and a rollback back into the prompt must land within the limit."""
        return z3.And(
            [
                z3.Implies(
                    sq.live,
                    z3.And(sq.np >= 1, sq.np <= sq.ntok, sq.lim >= 0, self.chunk_room(sq, sq.nr)),
                )
                for sq in st.seqs
            ]
        )

    def inv_stats(self, d: Domain, st: State) -> Term:
        """INV-STATS (counters): 0 <= hits <= queries, computed + skipped = prefill tokens,
        hits <= skipped, counters non-negative."""
        c = st.ctr
        return z3.And(
            c["hits"] >= 0,
            c["hits"] <= c["queries"],
            c["computed"] + c["skipped"] == c["prefill"],
            c["hits"] <= c["skipped"],
            *[c[k] >= 0 for k in ("evictions", "admissions", "published", "computed")],
        )

    def aux_chain(self, d: Domain, st: State) -> Term:
        """AUX-CHAIN (strengthening): a published block at table position j is the canonical
        block of the sequence's identity chain at j."""
        out = []
        for sq in st.seqs:
            ch = self.chain(st, sq.ns, sq.lab)
            for j in range(self.bounds.table):
                b = sq.tab[j]
                out.append(z3.Implies(z3.And(sq.live, j < sq.len, st.pub[b]), ch[j] == b))
        return z3.And(out)

    def inv_match(self, d: Domain, pre: State, step: Step, s: int) -> Term:
        """INV-MATCH, a postcondition of admission's match (``attach``): the hit is block
        aligned, leaves at least one prompt token to compute, its blocks' identities are
        the prompt's identity chain, and the attached hit plus the window is the longest
        such prefix (up to the cap), the window being ``min(recompute_blocks, matched)``
        blocks of it."""
        M, post, a = self.bounds.table, step.post, step.args
        assert isinstance(a, AdmitArgs), step.op
        sq, BS = post.seqs[s], post.BS
        out = [
            sq.nc == z3.Sum([z3.If(j < sq.len, BS, 0) for j in range(M)]),  # block aligned
            sq.nca == sq.nc,
            sq.nc <= a.ntok - 1,  # at least one token to compute
            sq.win >= 0,
            sq.win <= a.recompute_blocks,
            z3.Or(sq.win == a.recompute_blocks, sq.len == 0),  # min(rb, matched blocks)
        ]
        for j in range(M):
            b = sq.tab[j]
            ident = [
                post.pub[b],
                post.btok[b] == a.labels[j],
                post.bns[b] == a.ns,
                post.par[b] == (ROOT if j == 0 else sq.tab[j - 1]),
            ]
            out.append(z3.Implies(j < sq.len, z3.And(ident)))
        # maximal: the raw match (attached + window) is published and within the cap, and
        # the block after it is capped (choice 4, written out here so that a wrong cap cannot
        # hide), or its identity (whole prefix) is not published
        raw = sq.len + sq.win
        ident_ok, parent = z3.BoolVal(True), z3.IntVal(ROOT)
        for j in range(M):
            look = pre.idx.get((a.ns, parent, a.labels[j]))
            published = z3.And(ident_ok, look != NONE)
            capped = (j + 1) * BS > a.ntok - 1
            out.append(z3.Implies(j < raw, z3.And(z3.Not(capped), published)))
            out.append(z3.Implies(raw == j, z3.Or(capped, z3.Not(published))))
            ident_ok, parent = published, look
        out.append(raw <= M)
        return z3.And(out)

    def invariants(self, d: Domain, st: State) -> dict[str, Term]:
        """Every invariant of the model by id (INV-* of the design, AUX-* strengthenings)."""
        return {
            InvariantId.REF: self.inv_ref(d, st),
            InvariantId.PARTITION: self.inv_partition(d, st),
            InvariantId.INDEX: self.inv_index(d, st),
            InvariantId.ANCESTOR: self.inv_ancestor(d, st),
            InvariantId.WRITE: self.inv_write(d, st),
            InvariantId.PUBLISH: self.inv_publish(d, st),
            InvariantId.WINDOW: self.inv_window(d, st),
            InvariantId.LIMIT: self.inv_limit(d, st),
            InvariantId.STATS: self.inv_stats(d, st),
            "AUX-CHAIN": self.aux_chain(d, st),
            "AUX-CHUNK": self.aux_chunk(d, st),
        }

    def fresh_query(self, prefix: str) -> Query:
        """A prompt to look up: namespace, length, one label per block, one multimodal span
        (``[span_start, span_end)``; none when empty) and the *candidates*: for each block
        position, whatever block a hash bucket may return. The candidates are free, so a
        proof over them holds for every hash function, colliding ones included."""
        M = self.bounds.table
        return Query(
            ns=z3.Int(f"{prefix}ns"),
            ntok=z3.Int(f"{prefix}ntok"),
            labels=tuple(z3.Int(f"{prefix}label{j}") for j in range(M)),
            cands=tuple(z3.Int(f"{prefix}cand{j}") for j in range(M)),
            span_start=z3.Int(f"{prefix}span_start"),
            span_end=z3.Int(f"{prefix}span_end"),
        )

    def lookup(self, st: State, q: Query) -> list[Term]:
        """``spec``'s match over the hash index: ``hits[j]`` says block position ``j`` is
        matched (by candidate ``q.cands[j]``). Consecutive verified hits, capped so that
        one prompt token stays to compute (choice 4), then clamped back to the block
        boundary at or before the span's start when the match would end inside the span
        (choice 5, ``clamp_out_of_spans`` for one span)."""
        M, BS = self.bounds.table, st.BS
        ok, parent, raw = z3.BoolVal(True), z3.IntVal(ROOT), []
        for j in range(M):
            c = q.cands[j]
            ok = z3.And(
                ok,
                self.within_cap(BS, j, q.ntok),
                st.inb(c),
                self.verify(st, c, (q.ns, parent, q.labels[j])),
            )
            raw.append(ok)
            parent = c
        return self.span_clamp(BS, raw, q)

    def lookup_ok(self, d: Domain, st: State, q: Query) -> Term:
        """INV-MATCH of a lookup in state ``st``: the match is a prefix of block positions,
        leaves at least one prompt token to compute, does not end strictly inside the span,
        and every matched block is published with exactly the prompt's identity chain
        (parent = the previous matched block) and *is* the index's block for that identity,
        so which candidate the hash offered cannot change the result."""
        M, BS = self.bounds.table, st.BS
        hits = self.lookup(st, q)
        m = z3.Sum([z3.If(h, 1, 0) for h in hits])
        chain = self.chain(st, q.ns, q.labels)
        out = [
            z3.And(
                [
                    z3.Implies(m == k, z3.Not(z3.And(q.span_start < k * BS, k * BS < q.span_end)))
                    for k in range(1, M + 1)
                ]
            )
        ]
        for j in range(M):
            c = q.cands[j]
            parent = z3.IntVal(ROOT) if j == 0 else q.cands[j - 1]
            out.append(
                z3.Implies(
                    hits[j],
                    z3.And(
                        (j + 1) * BS <= q.ntok - 1,
                        st.inb(c),
                        st.pub[c],
                        st.bns[c] == q.ns,
                        st.par[c] == parent,
                        st.btok[c] == q.labels[j],
                        c == chain[j],
                        *([hits[j - 1]] if j else []),
                    ),
                )
            )
        return z3.And(out)

    def same_state(self, a: State, b: State) -> Term:
        """Every component of two states is equal (arrays extensionally), counters and
        clock included."""
        eqs = [
            getattr(a, f) == getattr(b, f)
            for f in (
                "N",
                "BS",
                "rc",
                "pub",
                "par",
                "bns",
                "btok",
                "depth",
                "lu",
                "q",
                "qpos",
                "qh",
                "qt",
                "clock",
            )
        ]
        eqs.append(a.idx.arr == b.idx.arr)
        eqs += [a.ctr[k] == b.ctr[k] for k in a.ctr]
        for sa, sb in zip(a.seqs, b.seqs, strict=True):
            for x, y in zip(dataclasses.astuple(sa), dataclasses.astuple(sb), strict=True):
                if isinstance(x, tuple):
                    eqs += [xi == yi for xi, yi in zip(x, y, strict=True)]
                else:
                    eqs.append(x == y)
        return z3.And(eqs)
