"""The spec's transition system in Z3: state, one transition per operation.

What is modelled, and how (see docs/proofs.md for the full list of abstractions):

* **Blocks are unbounded.** A block is an ``Int`` in ``[0, N)`` with ``N`` a symbolic pool
  size; per-block data (refcount, published, parent, namespace, token label, depth, last use)
  are arrays indexed by block id. Per-block statements are quantified over the pool.
* **The free queue** is an array ``q`` with a head ``qh`` and a tail ``qt`` (the queue is
  ``q[qh:qt]``, allocation takes from the head, release appends at the tail) plus a ghost
  position map ``qpos`` (``q[qpos[b]] == b`` for queued blocks). The ghost map lets
  "b is free" be a quantifier-free formula.
* **The index** is an array from identity keys ``(namespace, parent block, token label)`` to
  a block id, ``NONE`` when absent. Identities are abstracted to labels: equal labels mean
  equal token tuples (namespace bytes, token ids). The parent identity is represented by the
  parent's block id, which is exact while INV-ANCESTOR and INV-INDEX hold (docs/design.md).
* **Sequences are bounded**: ``Bounds.seqs`` slots, each with a block table of at most
  ``Bounds.table`` entries. A transition whose result would not fit is outside the model
  (``Step.bounded`` is false), never silently truncated.
* **Recompute windows and chunked prefill** are per-sequence fields (``nca``: cached
  tokens, ``win``: window blocks, ``np``: prompt length, ``lim``: ``kv_token_limit`` or 0).
  Multimodal spans appear only in :meth:`Encoding.lookup` (one span per prompt, INV-MATCH
  after every step); admission's match and the sequences have none (there the clamp is the
  identity).
* **Refusals** (INV-TXN): :meth:`Encoding.refusals` lists the spec's raise sites of each
  operation as conditions on the pre-state and arguments; :meth:`Encoding.outcome` is the
  successor when enabled and :meth:`Encoding.refused` (the pre-state) otherwise.
* Token arithmetic keeps the block size ``BS`` symbolic. Every product of a count with ``BS``
  is unrolled over the (bounded) table positions, so all arithmetic stays linear.

Every transition is a *function* of the pre-state and its arguments: :class:`Step` carries
the post-state terms and three guards. ``enabled`` is when the spec's operation succeeds;
``bounded`` is when the result fits the bounds; ``choice`` pins the successor where the spec
chooses (the eviction victim is the least element of the eviction order). Safety proofs
assume only ``enabled`` and ``bounded``, so they hold for *every* eviction order; the drift
check (:mod:`.drift`) also evaluates ``choice`` against the Python spec.

The same code builds formulas for two kinds of :class:`Domain`: a symbolic pool (``N`` is a
variable; "for every block" is a ``ForAll``) for proofs, and a concrete pool of ``n`` blocks
(quantifiers expand into finite conjunctions) for satisfiability checks, counterexamples,
sampling states and the drift check. New invariants join by adding state fields, a method
on :class:`Encoding` per formula and a transition per operation, as INV-WINDOW did (the
per-sequence ``nca``/``win`` fields, :meth:`Encoding.inv_window`, and the window cut in
:meth:`Encoding.attach`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3
from prefixkv.spec.invariant_ids import InvariantId

__all__ = [
    "NONE",
    "OPS",
    "ROOT",
    "TXN_ERRORS",
    "Bounds",
    "Domain",
    "Encoding",
    "IndexMap",
    "SeqState",
    "State",
    "Step",
]

NONE = -1
"""No block: an index miss."""
ROOT = -1
"""Parent key of a root block (shares the value of ``NONE``; a miss is never a parent)."""

TXN_ERRORS: dict[str, tuple[str, ...]] = {
    "admit": ("InvalidRequest", "DuplicateSequence", "OutOfBlocks"),
    "append": ("UnknownSequence", "InvalidRequest", "InvalidOperation", "OutOfBlocks"),
    "continue_prefill": ("UnknownSequence", "InvalidRequest", "InvalidOperation", "OutOfBlocks"),
    "commit": ("UnknownSequence", "InvalidRequest", "InvalidOperation"),
    "rollback": ("UnknownSequence", "InvalidRequest", "InvalidOperation"),
    "free": ("UnknownSequence",),
    "reset_full": ("CacheBusy",),
}
"""The error classes each modelled operation can raise (``evict`` and ``reset_keep`` raise
none inside the model: their only refusals are argument types and ``evict``'s negative
count, which the model's arguments cannot express)."""

OPS = (
    "admit",
    "append",
    "continue_prefill",
    "commit",
    "rollback",
    "free",
    "evict",
    "reset_keep",
    "reset_full",
)
"""The spec operations, one transition each (``reset_keep``: ``reset(preserve_cache=True)``,
``reset_full``: ``reset(preserve_cache=False)``)."""

Int = z3.IntSort()
Bool = z3.BoolSort()
Term = Any  # z3.ExprRef; z3's stubs are too loose to be worth narrowing here.


@dataclass(frozen=True)
class Bounds:
    """The sizes the encoding bounds. The pool (number of blocks) is never bounded."""

    seqs: int = 3
    """Live sequence slots."""
    table: int = 3
    """Blocks per block table (so ``num_reserved <= table * block_size``)."""

    def describe(self) -> str:
        return (
            f"pool size N and block size BS unbounded; at most {self.seqs} live sequences, "
            f"at most {self.table} blocks per block table"
        )


def _ite(c: Term, a: Term, b: Term) -> Term:
    return a if a.eq(b) else z3.If(c, a, b)


def cstore(arr: Term, i: Term, cond: Term, v: Term) -> Term:
    """``arr[i] := v`` when ``cond``; otherwise an identity store."""
    return z3.Store(arr, i, _ite(cond, v, arr[i]))


class Domain:
    """How "for every block" is written: symbolic (``ForAll``) or over a concrete pool.

    ``Domain(None)`` is the symbolic pool of the proofs. ``Domain(n)`` is a pool of exactly
    ``n`` blocks; its formulas are quantifier-free and equivalent to the symbolic ones with
    ``N = n`` (the queue bound ``qt - qh <= n`` it adds follows from the queue being
    duplicate-free, by pigeonhole).
    """

    def __init__(self, n: int | None = None) -> None:
        self.n = n
        self._fresh = 0

    @property
    def symbolic(self) -> bool:
        return self.n is None

    def _var(self, name: str) -> Term:
        self._fresh += 1
        return z3.Int(f"{name}!{self._fresh}")

    def forall_blocks(self, num_blocks: Term, body: Callable[[Term], Term]) -> Term:
        if self.n is None:
            b = self._var("b")
            return z3.ForAll([b], z3.Implies(z3.And(b >= 0, b < num_blocks), body(b)))
        return z3.And([body(z3.IntVal(i)) for i in range(self.n)])

    def exists_blocks(self, num_blocks: Term, body: Callable[[Term], Term]) -> Term:
        if self.n is None:
            b = self._var("b")
            return z3.Exists([b], z3.And(b >= 0, b < num_blocks, body(b)))
        return z3.Or([body(z3.IntVal(i)) for i in range(self.n)])

    def forall_queue(self, qh: Term, qt: Term, body: Callable[[Term], Term]) -> Term:
        if self.n is None:
            i = self._var("i")
            return z3.ForAll([i], z3.Implies(z3.And(qh <= i, i < qt), body(i)))
        return z3.And(
            qt - qh <= self.n, *[z3.Implies(qh + d < qt, body(qh + d)) for d in range(self.n)]
        )

    def forall_keys(self, idx: IndexMap, body: Callable[[Term, Term, Term, Term], Term]) -> Term:
        """``body(ns, parent, label, idx[key])`` for every key where the index has an entry."""
        if self.n is None:
            ns, p, t = self._var("ns"), self._var("p"), self._var("t")
            v = idx.arr[ns, p, t]
            # A pattern helps only where this is a hypothesis, i.e. on a plain array variable.
            patterns = [v] if z3.is_const(idx.arr) else []
            return z3.ForAll([ns, p, t], body(ns, p, t, v), patterns=patterns)
        assert idx.support is not None, "a concrete index needs its support keys"
        return z3.And(idx.default == NONE, *[body(*k, idx.arr[k]) for k in idx.support])


@dataclass(frozen=True)
class IndexMap:
    """The index: identity key ``(namespace, parent, label)`` -> block id or ``NONE``.

    In a concrete domain the map also carries its *support*: every key at which it may differ
    from its default, so "for every entry" is a finite conjunction.
    """

    arr: Term
    default: Term
    support: tuple[tuple[Term, Term, Term], ...] | None

    def get(self, key: tuple[Term, Term, Term]) -> Term:
        return self.arr[key]

    def put(self, key: tuple[Term, Term, Term], cond: Term, v: Term) -> IndexMap:
        arr = z3.Store(self.arr, *key, _ite(cond, v, self.arr[key]))
        support = None if self.support is None else (*self.support, key)
        return IndexMap(arr, self.default, support)

    @staticmethod
    def ite(c: Term, a: IndexMap, b: IndexMap) -> IndexMap:
        if a.support is None or b.support is None:
            support = None
        else:
            support = a.support + tuple(k for k in b.support if k not in a.support)
        return IndexMap(_ite(c, a.arr, b.arr), a.default, support)


@dataclass(frozen=True)
class SeqState:
    """One sequence slot. Token ids are abstracted to one label per full block."""

    live: Term
    ns: Term
    ntok: Term  # known tokens (prompt + accepted)
    nc: Term  # num_computed
    nr: Term  # num_reserved
    len: Term  # block table length
    nca: Term  # num_cached: tokens attached from the cache at admission
    win: Term  # window_blocks: private recompute-window blocks right after the cached ones
    np: Term  # prompt_len
    lim: Term  # kv_token_limit; 0 when None (a set limit is >= 1)
    tab: tuple[Term, ...]  # block table entries (valid below len)
    lab: tuple[Term, ...]  # label of the tokens of block j (valid while block j is full)


COUNTERS = (
    "queries",
    "hits",
    "prefill",
    "computed",
    "skipped",
    "admissions",
    "evictions",
    "published",
)


@dataclass(frozen=True)
class State:
    """One state of the model. ``N`` and ``BS`` are shared by every state of a proof."""

    N: Term
    BS: Term
    rc: Term
    pub: Term
    par: Term
    bns: Term
    btok: Term
    depth: Term
    lu: Term
    q: Term
    qpos: Term
    qh: Term
    qt: Term
    idx: IndexMap
    seqs: tuple[SeqState, ...]
    clock: Term
    ctr: dict[str, Term] = field(hash=False)
    leaves: dict[str, Term] = field(default_factory=dict, hash=False, compare=False)
    """The scalar variables of a fresh concrete-domain state, by name (else empty)."""

    def replace(self, **kw: Any) -> State:
        kw.setdefault("leaves", {})
        return dataclasses.replace(self, **kw)

    def seq(self, s: int, **kw: Any) -> State:
        seqs = list(self.seqs)
        seqs[s] = dataclasses.replace(seqs[s], **kw)
        return self.replace(seqs=tuple(seqs))

    def count(self, name: str, delta: Term) -> State:
        return self.replace(ctr={**self.ctr, name: self.ctr[name] + delta})

    # -- derived predicates ---------------------------------------------------------------

    def inb(self, b: Term) -> Term:
        return z3.And(b >= 0, b < self.N)

    def in_free(self, b: Term) -> Term:
        """``b`` is in the free queue (exact under INV-PARTITION: every block's ghost
        position is below the tail, and a position at or after the head is its slot)."""
        return self.qh <= self.qpos[b]

    def key(self, b: Term) -> tuple[Term, Term, Term]:
        return (self.bns[b], self.par[b], self.btok[b])

    def num_free(self) -> Term:
        return self.qt - self.qh

    @staticmethod
    def ite(c: Term, a: State, b: State) -> State:
        """The state ``a`` if ``c`` else ``b``, field by field."""
        if c is True or (isinstance(c, z3.ExprRef) and z3.is_true(c)):
            return a
        seqs = tuple(
            SeqState(
                *(
                    _ite(c, x, y)
                    if not isinstance(x, tuple)
                    else tuple(_ite(c, xi, yi) for xi, yi in zip(x, y, strict=True))
                    for x, y in zip(dataclasses.astuple(sa), dataclasses.astuple(sb), strict=True)
                )
            )
            for sa, sb in zip(a.seqs, b.seqs, strict=True)
        )
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(State):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if f.name == "seqs":
                kw[f.name] = seqs
            elif f.name == "idx":
                kw[f.name] = IndexMap.ite(c, x, y)
            elif f.name == "ctr":
                kw[f.name] = {k: _ite(c, x[k], y[k]) for k in x}
            elif f.name == "leaves":
                kw[f.name] = {}
            else:
                kw[f.name] = _ite(c, x, y)
        return State(**kw)


@dataclass(frozen=True)
class Step:
    """A transition: ``pre --op(args)--> post`` when ``enabled and bounded and choice``."""

    op: str
    enabled: Term
    bounded: Term
    choice: Term
    post: State
    args: dict[str, Any]


def _ceil_blocks(n: Term, bs: Term, m: int) -> Term:
    """``ceil(n / bs)`` for ``0 <= n <= m * bs``, unrolled so it stays linear in ``bs``."""
    return z3.Sum([z3.If(j * bs < n, 1, 0) for j in range(m)])


_BLOCK_FIELDS: tuple[tuple[str, z3.SortRef], ...] = (
    ("rc", Int),
    ("pub", Bool),
    ("par", Int),
    ("bns", Int),
    ("btok", Int),
    ("depth", Int),
    ("lu", Int),
    ("qpos", Int),
)
"""Per-block arrays of a state (``qpos`` is the ghost position in the free queue)."""


class Encoding:
    """The transition system and its invariants. Subclass and override to break it.

    Methods named ``inv_*`` build invariant formulas; ``aux_*`` build the auxiliary
    invariants the proofs need; ``op_*`` build transitions.
    """

    def __init__(self, bounds: Bounds | None = None) -> None:
        self.bounds = bounds or Bounds()

    # -- states ---------------------------------------------------------------------------

    def fresh_state(
        self, d: Domain, prefix: str, N: Term | None = None, BS: Term | None = None
    ) -> State:
        """A state of fresh variables (``N`` and ``BS`` shared when given).

        Symbolic domain: per-block data are array variables. Concrete domain of ``n``
        blocks: they are arrays built from one scalar variable per block (and per queue
        offset, and per index entry), listed in :attr:`State.leaves` so that a concrete
        state can be substituted in, or read back from a model.
        """
        leaves: dict[str, Term] = {}

        def var(name: str, sort: z3.SortRef = Int) -> Term:
            v = z3.Const(f"{prefix}{name}", sort)
            leaves[name] = v
            return v

        if N is None:
            N = z3.Int(f"{prefix}N") if d.n is None else z3.IntVal(d.n)
        if BS is None:
            BS = var("BS")
        M = self.bounds.table
        seqs = tuple(
            SeqState(
                live=var(f"s{s}.live", Bool),
                ns=var(f"s{s}.ns"),
                ntok=var(f"s{s}.ntok"),
                nc=var(f"s{s}.nc"),
                nr=var(f"s{s}.nr"),
                len=var(f"s{s}.len"),
                nca=var(f"s{s}.nca"),
                win=var(f"s{s}.win"),
                np=var(f"s{s}.np"),
                lim=var(f"s{s}.lim"),
                tab=tuple(var(f"s{s}.tab{j}") for j in range(M)),
                lab=tuple(var(f"s{s}.lab{j}") for j in range(M)),
            )
            for s in range(self.bounds.seqs)
        )
        qh, qt = var("qh"), var("qt")
        fields: dict[str, Term] = {}
        if d.n is None:
            for name, sort in _BLOCK_FIELDS:
                fields[name] = z3.Array(f"{prefix}{name}", Int, sort)
            fields["q"] = z3.Array(f"{prefix}q", Int, Int)
            idx = IndexMap(z3.Array(f"{prefix}idx", Int, Int, Int, Int), z3.IntVal(NONE), None)
        else:
            for name, sort in _BLOCK_FIELDS:
                arr = z3.K(Int, z3.BoolVal(False) if sort == Bool else z3.IntVal(0))
                for b in range(d.n):
                    arr = z3.Store(arr, b, var(f"{name}[{b}]", sort))
                fields[name] = arr
            q = z3.K(Int, z3.IntVal(NONE))
            for i in range(d.n):
                q = z3.Store(q, qh + i, var(f"q[+{i}]"))
            fields["q"] = q
            # A finite map: one (key, value) entry per block of the pool.
            idx, support = _empty_index(()), []
            for e in range(d.n):
                k = (var(f"idx{e}.ns"), var(f"idx{e}.par"), var(f"idx{e}.tok"))
                idx = idx.put(k, z3.BoolVal(True), var(f"idx{e}.val"))
                support.append(k)
            idx = IndexMap(idx.arr, idx.default, tuple(support))
        return State(
            N=N,
            BS=BS,
            **fields,
            qh=qh,
            qt=qt,
            idx=idx,
            seqs=seqs,
            clock=var("clock"),
            ctr={c: var(c) for c in COUNTERS},
            leaves=leaves,
        )

    def shape(self, st: State) -> Term:
        """Sizes are positive."""
        return z3.And(st.N >= 1, st.BS >= 1)

    def in_bounds(self, st: State) -> Term:
        """The model's bound: a live sequence reserves at most ``table * BS`` slots (so its
        table fits in ``table`` entries, and the unrolled ``ceil`` is exact)."""
        return z3.And([z3.Implies(sq.live, sq.nr <= self.bounds.table * st.BS) for sq in st.seqs])

    # -- invariants -----------------------------------------------------------------------

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

    def window_pending(self, BS: Term, sq: SeqState, j: int) -> Term:
        """Window block ``j`` is not yet fully recomputed and committed (once it is, the
        window did its job for it: it may even be published, when its twin was evicted)."""
        return (j + 1) * BS > sq.nc

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
                        sq.len == _ceil_blocks(sq.nr, st.BS, M),
                        self.chunk_limit(sq),
                    ),
                )
            )
        return z3.And(out)

    def chunk_limit(self, sq: SeqState) -> Term:
        """INV-LIMIT's chunk form: while a prompt is prefilled under a ``kv_token_limit``
        (``num_reserved <= prompt_len`` and ``num_computed < prompt_len``), at most ``limit``
        reserved prompt tokens are uncommitted."""
        prefilling = z3.And(sq.lim > 0, sq.nr <= sq.np, sq.nc < sq.np)
        return z3.Implies(prefilling, sq.nr - sq.nc <= sq.lim)

    def chunk_room(self, sq: SeqState, nr: Term) -> Term:
        """Reserving up to ``nr`` keeps at most ``limit`` uncommitted *prompt* tokens:
        ``min(nr, prompt_len) - num_computed <= limit`` while the prompt is not computed."""
        return z3.Implies(
            z3.And(sq.lim > 0, sq.nc < sq.np), z3.If(nr < sq.np, nr, sq.np) - sq.nc <= sq.lim
        )

    def grow_room(self, sq: SeqState, nr: Term) -> Term:
        """What :meth:`grow` requires of the new reservation (:meth:`chunk_room`)."""
        return self.chunk_room(sq, nr)

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

    def chain(self, st: State, ns: Term, labels: Sequence[Term]) -> list[Term]:
        """Canonical blocks of an identity chain: ``c[j]`` is the published block with the
        identity of block ``j`` of a sequence, or ``NONE``."""
        out, c = [], z3.IntVal(ROOT)
        for j, lab in enumerate(labels):
            look = st.idx.get((ns, c, lab))
            c = look if j == 0 else z3.If(c == NONE, z3.IntVal(NONE), look)
            out.append(c)
        return out

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
        sq, BS = post.seqs[s], post.BS
        out = [
            sq.nc == z3.Sum([z3.If(j < sq.len, BS, 0) for j in range(M)]),  # block aligned
            sq.nca == sq.nc,
            sq.nc <= a["ntok"] - 1,  # at least one token to compute
            sq.win >= 0,
            sq.win <= a["recompute_blocks"],
            z3.Or(sq.win == a["recompute_blocks"], sq.len == 0),  # min(rb, matched blocks)
        ]
        for j in range(M):
            b = sq.tab[j]
            ident = [
                post.pub[b],
                post.btok[b] == a["labels"][j],
                post.bns[b] == a["ns"],
                post.par[b] == (ROOT if j == 0 else sq.tab[j - 1]),
            ]
            out.append(z3.Implies(j < sq.len, z3.And(ident)))
        # maximal: the raw match (attached + window) is published and within the cap, and
        # the block after it is capped (choice 4, written out here so that a wrong cap cannot
        # hide), or its identity (whole prefix) is not published
        raw = sq.len + sq.win
        ident_ok, parent = z3.BoolVal(True), z3.IntVal(ROOT)
        for j in range(M):
            look = pre.idx.get((a["ns"], parent, a["labels"][j]))
            published = z3.And(ident_ok, look != NONE)
            capped = (j + 1) * BS > a["ntok"] - 1
            out.append(z3.Implies(j < raw, z3.And(z3.Not(capped), published)))
            out.append(z3.Implies(raw == j, z3.Or(capped, z3.Not(published))))
            ident_ok, parent = published, look
        out.append(raw <= M)
        return z3.And(out)

    # -- INV-MATCH after any operation: a lookup of any prompt ----------------------------

    def fresh_query(self, prefix: str) -> dict[str, Any]:
        """A prompt to look up: namespace, length, one label per block, one multimodal span
        (``[span_start, span_end)``; none when empty) and the *candidates*: for each block
        position, whatever block a hash bucket may return. The candidates are free, so a
        proof over them holds for every hash function, colliding ones included."""
        M = self.bounds.table
        return {
            "ns": z3.Int(f"{prefix}ns"),
            "ntok": z3.Int(f"{prefix}ntok"),
            "labels": tuple(z3.Int(f"{prefix}label{j}") for j in range(M)),
            "cands": tuple(z3.Int(f"{prefix}cand{j}") for j in range(M)),
            "span_start": z3.Int(f"{prefix}span_start"),
            "span_end": z3.Int(f"{prefix}span_end"),
        }

    def verify(self, st: State, c: Term, key: tuple[Term, Term, Term]) -> Term:
        """A candidate is a hit only if it is published and its *stored* identity equals the
        key exactly (namespace, parent block, tokens and extra keys): a hash is only an
        index."""
        ns, parent, label = key
        return z3.And(st.pub[c], st.bns[c] == ns, st.par[c] == parent, st.btok[c] == label)

    def lookup(self, st: State, q: dict[str, Any]) -> list[Term]:
        """``spec``'s match over the hash index: ``hits[j]`` says block position ``j`` is
        matched (by candidate ``q["cands"][j]``). Consecutive verified hits, capped so that
        one prompt token stays to compute (choice 4), then clamped back to the block
        boundary at or before the span's start when the match would end inside the span
        (choice 5, ``clamp_out_of_spans`` for one span)."""
        M, BS = self.bounds.table, st.BS
        ok, parent, raw = z3.BoolVal(True), z3.IntVal(ROOT), []
        for j in range(M):
            c = q["cands"][j]
            ok = z3.And(
                ok,
                self.within_cap(BS, j, q["ntok"]),
                st.inb(c),
                self.verify(st, c, (q["ns"], parent, q["labels"][j])),
            )
            raw.append(ok)
            parent = c
        return self.span_clamp(BS, raw, q)

    def span_clamp(self, BS: Term, raw: list[Term], q: dict[str, Any]) -> list[Term]:
        """Choice 5: a match of ``m`` blocks whose end ``m * BS`` lies strictly inside the
        span is cut back to ``span_start // BS`` blocks (unrolled: linear in ``BS``)."""
        M = len(raw)
        m = z3.Sum([z3.If(h, 1, 0) for h in raw])
        inside = z3.Or(
            [
                z3.And(m == k, q["span_start"] < k * BS, k * BS < q["span_end"])
                for k in range(1, M + 1)
            ]
        )
        return [
            z3.And(raw[j], z3.Or(z3.Not(inside), (j + 1) * BS <= q["span_start"])) for j in range(M)
        ]

    def lookup_ok(self, d: Domain, st: State, q: dict[str, Any]) -> Term:
        """INV-MATCH of a lookup in state ``st``: the match is a prefix of block positions,
        leaves at least one prompt token to compute, does not end strictly inside the span,
        and every matched block is published with exactly the prompt's identity chain
        (parent = the previous matched block) and *is* the index's block for that identity,
        so which candidate the hash offered cannot change the result."""
        M, BS = self.bounds.table, st.BS
        hits = self.lookup(st, q)
        m = z3.Sum([z3.If(h, 1, 0) for h in hits])
        chain = self.chain(st, q["ns"], q["labels"])
        out = [
            z3.And(
                [
                    z3.Implies(
                        m == k, z3.Not(z3.And(q["span_start"] < k * BS, k * BS < q["span_end"]))
                    )
                    for k in range(1, M + 1)
                ]
            )
        ]
        for j in range(M):
            c = q["cands"][j]
            parent = z3.IntVal(ROOT) if j == 0 else q["cands"][j - 1]
            out.append(
                z3.Implies(
                    hits[j],
                    z3.And(
                        (j + 1) * BS <= q["ntok"] - 1,
                        st.inb(c),
                        st.pub[c],
                        st.bns[c] == q["ns"],
                        st.par[c] == parent,
                        st.btok[c] == q["labels"][j],
                        c == chain[j],
                        *([hits[j - 1]] if j else []),
                    ),
                )
            )
        return z3.And(out)

    # -- INV-TXN: a refused operation changes nothing -------------------------------------

    def refusals(
        self, d: Domain, st: State, op: str, a: dict[str, Any], s: int
    ) -> list[tuple[str, Term]]:
        """The spec's raise sites of ``op``, in the order it checks them: ``(error class,
        condition on the pre-state and arguments)``. :meth:`failures` turns them into one
        failing precondition per class (its condition, no earlier check failing)."""
        sq = st.seqs[s]
        if op == "admit":
            att, scheduled = self.attach(d, st, a, s)
            mid = att.post
            # NOTE: an empty prompt, a negative recompute_blocks or kv_token_limit are
            # refused when the Request is built, before admit runs; the model has no
            # Request, so they are admission's first check here. OutOfBlocks is decided
            # after the hit is pinned (the spec pins, evicts, then raises; the transaction
            # puts it all back).
            return [
                ("InvalidRequest", z3.Or(a["ntok"] < 1, a["recompute_blocks"] < 0, a["limit"] < 0)),
                ("InvalidRequest", z3.And(z3.Not(a["whole"]), a["num_new"] < 1)),
                ("DuplicateSequence", sq.live),
                (
                    "OutOfBlocks",
                    self.out_of_room(d, mid, self.need(mid, s, scheduled), a["victims"]),
                ),
            ]
        if op == "append":
            n = a["n"]
            return [
                ("UnknownSequence", z3.Not(sq.live)),
                ("InvalidRequest", n < 1),
                ("InvalidOperation", z3.And(sq.nr < sq.np, sq.lim > 0, sq.nr + n - sq.nc > sq.lim)),
                ("OutOfBlocks", self.out_of_room(d, st, self.need(st, s, n), a["victims"])),
            ]
        if op == "continue_prefill":
            n = self.chunk_size(sq.np - sq.nr, a["whole"], a["num_new"], sq.lim)
            return [
                ("UnknownSequence", z3.Not(sq.live)),
                ("InvalidRequest", z3.And(z3.Not(a["whole"]), a["num_new"] < 1)),
                ("InvalidOperation", sq.nr >= sq.np),
                ("InvalidOperation", sq.nc != sq.nr),
                ("OutOfBlocks", self.out_of_room(d, st, self.need(st, s, n), a["victims"])),
            ]
        if op == "commit":
            nc = sq.nc + a["n"]
            return [
                ("UnknownSequence", z3.Not(sq.live)),
                ("InvalidRequest", z3.Or(a["n"] < 0, a["accepted"] < 0)),
                ("InvalidOperation", nc > sq.nr),
                ("InvalidOperation", nc > sq.ntok + a["accepted"]),
            ]
        if op == "rollback":
            return [
                ("UnknownSequence", z3.Not(sq.live)),
                ("InvalidRequest", a["n"] < 1),
                ("InvalidOperation", sq.nr - a["n"] < sq.nc),
            ]
        if op == "free":
            return [
                (
                    "UnknownSequence",
                    z3.Or(
                        [
                            z3.And(f, z3.Not(q.live))
                            for f, q in zip(a["freed"], st.seqs, strict=True)
                        ]
                    ),
                )
            ]
        if op == "reset_full":
            return [("CacheBusy", z3.Or([q.live for q in st.seqs]))]
        return []

    def failures(self, d: Domain, st: State, op: str, a: dict[str, Any], s: int) -> dict[str, Term]:
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

    def refused(self, st: State, op: str, a: dict[str, Any], s: int) -> State:
        """What a refused operation leaves: the pre-state (``SpecCache._transaction`` puts
        back its snapshot, statistics included)."""
        return st

    def outcome(self, d: Domain, st: State, op: str, a: dict[str, Any], s: int) -> State:
        """The state after calling ``op``: its successor if enabled, else what a refusal
        leaves (:meth:`refused`)."""
        step = self.step(d, st, op, a, s)
        return State.ite(step.enabled, step.post, self.refused(st, op, a, s))

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

    # -- micro-steps ----------------------------------------------------------------------

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

    def frees_at_zero(self, st: State, b: Term) -> Term:
        """A block whose last hold goes joins the free queue iff it is private."""
        return z3.Not(st.pub[b])

    def is_leaf(self, d: Domain, st: State, b: Term) -> Term:
        return z3.And(
            st.inb(b),
            st.pub[b],
            st.rc[b] == 0,
            d.forall_blocks(st.N, lambda c: z3.Not(z3.And(st.pub[c], st.par[c] == b))),
        )

    def evict_order_before(self, st: State, a: Term, b: Term) -> Term:
        """``a`` is evicted no later than ``b``: (last use, -depth, block id) ascending."""
        return z3.Or(
            st.lu[a] < st.lu[b],
            z3.And(
                st.lu[a] == st.lu[b],
                z3.Or(
                    st.depth[a] > st.depth[b],
                    z3.And(st.depth[a] == st.depth[b], a <= b),
                ),
            ),
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

    # -- transitions ----------------------------------------------------------------------

    def fresh_args(self, op: str, prefix: str) -> dict[str, Any]:
        """Fresh argument variables of an operation (``slot`` is always a Python int)."""
        M, S = self.bounds.table, self.bounds.seqs
        victims = tuple(z3.Int(f"{prefix}victim{e}") for e in range(M))
        if op == "admit":
            return {
                "ns": z3.Int(f"{prefix}ns"),
                "ntok": z3.Int(f"{prefix}ntok"),
                "labels": tuple(z3.Int(f"{prefix}label{j}") for j in range(M)),
                "num_new": z3.Int(f"{prefix}num_new"),
                "whole": z3.Bool(f"{prefix}whole"),
                "recompute_blocks": z3.Int(f"{prefix}recompute_blocks"),
                "limit": z3.Int(f"{prefix}kv_token_limit"),
                "victims": victims,
            }
        if op == "append":
            return {"n": z3.Int(f"{prefix}n"), "victims": victims}
        if op == "continue_prefill":
            return {
                "num_new": z3.Int(f"{prefix}num_new"),
                "whole": z3.Bool(f"{prefix}whole"),
                "victims": victims,
            }
        if op == "attach":
            return {k: v for k, v in self.fresh_args("admit", prefix).items() if k != "victims"}
        if op == "grow":
            return {"n": z3.Int(f"{prefix}n")}
        if op == "commit":
            return {
                "n": z3.Int(f"{prefix}n"),
                "accepted": z3.Int(f"{prefix}accepted"),
                "labels": tuple(z3.Int(f"{prefix}newlabel{j}") for j in range(M)),
            }
        if op == "rollback":
            return {"n": z3.Int(f"{prefix}n")}
        if op == "free":
            return {"freed": tuple(z3.Bool(f"{prefix}freed{s}") for s in range(S))}
        if op == "evict":
            return {"victim": z3.Int(f"{prefix}victim")}
        if op.startswith("evict*"):
            n = int(op[len("evict*") :])
            return {"victims": tuple(z3.Int(f"{prefix}victim{e}") for e in range(n))}
        if op in ("reset_keep", "reset_full"):
            return {}
        raise ValueError(f"unknown operation {op!r}")

    def step(self, d: Domain, st: State, op: str, args: dict[str, Any], slot: int = 0) -> Step:
        """The transition of ``op`` (or of a proof step: ``attach``, ``grow``)."""
        if op == "attach":
            return self._bounded(self.attach(d, st, args, slot)[0])
        if op == "grow":
            return self._bounded(self.grow(d, st, slot, args["n"]))
        if op == "evict":
            return self._bounded(self.evict_step(d, st, args["victim"]))
        if op.startswith("evict*"):
            return self._bounded(self.op_evict(d, st, args))
        fn: Callable[..., Step] = getattr(self, f"op_{op}")
        if op in ("admit", "append", "continue_prefill", "commit", "rollback"):
            return self._bounded(fn(d, st, args, slot))
        return self._bounded(fn(d, st, args))

    def _bounded(self, step: Step) -> Step:
        """A transition is inside the model when its post-state is within the bounds."""
        return dataclasses.replace(step, bounded=z3.And(step.bounded, self.in_bounds(step.post)))

    def attach(self, d: Domain, st: State, a: dict[str, Any], s: int) -> tuple[Step, Term]:
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
        ns, ntok, labels = a["ns"], a["ntok"], a["labels"]
        chain, matched, m = self.match_blocks(st, a)
        # window: the last min(recompute_blocks, m) matched blocks are not attached; grow
        # allocates fresh private blocks for them (choice 6)
        w = self.window_size(a["recompute_blocks"], m)
        hit = [self.attached(matched[j], j, m, w) for j in range(M)]
        k = z3.Sum([z3.If(h, 1, 0) for h in hit])
        cached = z3.Sum([z3.If(h, BS, 0) for h in hit])
        remaining = ntok - cached
        scheduled = self.chunk_size(remaining, a["whole"], a["num_new"], a["limit"])
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
            lim=a["limit"],
            tab=tab,
            lab=tuple(labels),
        )
        st = self.count_admission(st, ntok, cached, remaining)
        return Step("attach", enabled, z3.BoolVal(True), z3.BoolVal(True), st, a), scheduled

    def match_blocks(self, st: State, a: dict[str, Any]) -> tuple[list[Term], list[Term], Term]:
        """The raw match of an admission: ``(chain, matched, m)``. ``matched[j]``: block ``j``
        is one of the consecutive hits of the identity chain, capped at ``(ntok - 1) // BS``
        blocks; ``m`` is how many there are."""
        chain = self.chain(st, a["ns"], a["labels"])
        matched, ok = [], z3.BoolVal(True)
        for j in range(self.bounds.table):
            ok = z3.And(ok, self.within_cap(st.BS, j, a["ntok"]), chain[j] != NONE)
            matched.append(ok)
        return chain, matched, z3.Sum([z3.If(h, 1, 0) for h in matched])

    def chunk_size(self, remaining: Term, whole: Term, num_new: Term, limit: Term) -> Term:
        """Tokens a prefill chunk reserves (``spec.cache.chunk_end`` without spans): the
        remaining prompt, at most ``num_new_tokens`` (unless ``whole``) and at most
        ``kv_token_limit`` (unless 0, i.e. None)."""
        n = z3.If(z3.Or(whole, remaining <= num_new), remaining, num_new)
        return z3.If(z3.Or(limit <= 0, n <= limit), n, limit)

    def window_size(self, rb: Term, m: Term) -> Term:
        """Window blocks of an admission: ``min(recompute_blocks, matched blocks)``."""
        return z3.If(rb < m, rb, m)

    def attached(self, matched: Term, j: int, m: Term, w: Term) -> Term:
        """Matched block ``j`` is attached: it is not one of the last ``w`` matched."""
        return z3.And(matched, j < m - w)

    def cached_tokens(self, BS: Term, cached: Term, w: Term) -> Term:
        """``num_cached`` recorded for the sequence: the attached tokens only."""
        return cached

    def within_cap(self, BS: Term, j: int, ntok: Term) -> Term:
        """Block ``j`` may be a hit: at least one prompt token stays to compute (choice 4,
        at most ``(ntok - 1) // BS`` blocks)."""
        return (j + 1) * BS <= ntok - 1

    def attach_guard(self, sq: SeqState, a: dict[str, Any]) -> Term:
        """admit succeeds only for a new sequence id, a non-empty prompt, a positive
        ``num_new_tokens`` when one is given, ``recompute_blocks >= 0`` and a
        ``kv_token_limit`` that is None (0) or positive."""
        return z3.And(
            z3.Not(sq.live),
            a["ntok"] >= 1,
            z3.Or(a["whole"], a["num_new"] >= 1),
            a["recompute_blocks"] >= 0,
            a["limit"] >= 0,
        )

    def count_admission(self, st: State, ntok: Term, cached: Term, remaining: Term) -> State:
        st = st.count("admissions", 1).count("queries", ntok).count("hits", cached)
        return st.count("prefill", ntok).count("skipped", cached).count("computed", remaining)

    def table_length(self, nr: Term, BS: Term) -> Term:
        """Blocks a table holds for ``nr`` reserved slots: ``ceil(nr / BS)``."""
        return _ceil_blocks(nr, BS, self.bounds.table)

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
        return Step("grow", enabled, nr <= M * st.BS, z3.BoolVal(True), st, {"n": n})

    def op_admit(self, d: Domain, st: State, a: dict[str, Any], s: int) -> Step:
        """admit: match -> pin -> evict -> allocate, as one transition (attach ; evict* ;
        grow)."""
        att, scheduled = self.attach(d, st, a, s)
        mid = att.post
        room, en_room, choice = self.make_room(d, mid, self.need(mid, s, scheduled), a["victims"])
        g = self.grow(d, room, s, scheduled)
        return Step(
            "admit",
            z3.And(att.enabled, en_room, g.enabled),
            z3.And(att.bounded, g.bounded),
            choice,
            g.post,
            a,
        )

    def op_append(self, d: Domain, st: State, a: dict[str, Any], s: int) -> Step:
        """append: reserve ``n`` more slots, evicting and allocating as needed (evict* ;
        grow)."""
        sq, n = st.seqs[s], a["n"]
        room, en_room, choice = self.make_room(d, st, self.need(st, s, n), a["victims"])
        g = self.grow(d, room, s, n)
        enabled = z3.And(sq.live, n >= 1, self.growth_guard(sq, n), en_room, g.enabled)
        return Step("append", enabled, g.bounded, choice, g.post, a)

    def growth_guard(self, sq: SeqState, n: Term) -> Term:
        """``spec.cache.check_growth`` without spans: while the prompt is not fully reserved,
        growth keeps at most ``kv_token_limit`` uncommitted tokens."""
        return z3.Implies(z3.And(sq.nr < sq.np, sq.lim > 0), sq.nr + n - sq.nc <= sq.lim)

    def op_continue_prefill(self, d: Domain, st: State, a: dict[str, Any], s: int) -> Step:
        """continue_prefill: once the previous chunk is committed, reserve the next one
        (evict* ; grow), sized like the first (:meth:`chunk_size`)."""
        sq = st.seqs[s]
        n = self.chunk_size(sq.np - sq.nr, a["whole"], a["num_new"], sq.lim)
        room, en_room, choice = self.make_room(d, st, self.need(st, s, n), a["victims"])
        g = self.grow(d, room, s, n)
        enabled = z3.And(self.continue_guard(sq, a), en_room, g.enabled)
        return Step("continue_prefill", enabled, g.bounded, choice, g.post, a)

    def continue_guard(self, sq: SeqState, a: dict[str, Any]) -> Term:
        """continue_prefill succeeds for a live sequence with prompt tokens left to reserve,
        whose reserved tokens are all committed, and a positive ``num_new_tokens`` if any."""
        return z3.And(sq.live, z3.Or(a["whole"], a["num_new"] >= 1), sq.nr < sq.np, sq.nc == sq.nr)

    def op_commit(self, d: Domain, st: State, a: dict[str, Any], s: int) -> Step:
        """commit: accept tokens, mark KV written, publish the newly full committed blocks."""
        M, BS, sq = self.bounds.table, st.BS, st.seqs[s]
        n, acc = a["n"], a["accepted"]
        ntok, nc = sq.ntok + acc, sq.nc + n
        enabled = self.commit_guard(sq, n, acc)
        labels = tuple(z3.If((j + 1) * BS <= sq.ntok, sq.lab[j], a["labels"][j]) for j in range(M))
        st = self.publish(st, sq, self.identity_labels(sq.lab, labels), nc, ntok)
        st = st.seq(s, ntok=ntok, nc=nc, lab=labels)
        return Step("commit", enabled, z3.BoolVal(True), z3.BoolVal(True), st, a)

    def commit_guard(self, sq: SeqState, n: Term, acc: Term) -> Term:
        """commit succeeds for a live sequence when the written slots stay within the
        reserved ones and within the known tokens (prompt + accepted)."""
        nc = sq.nc + n
        return z3.And(sq.live, n >= 0, acc >= 0, nc <= sq.nr, nc <= sq.ntok + acc)

    def identity_labels(self, before: Sequence[Term], after: Sequence[Term]) -> Sequence[Term]:
        """Token labels blocks are published with: those after accepting the new tokens."""
        return after

    def newly_committed(self, BS: Term, j: int, sq: SeqState, new_nc: Term, ntok: Term) -> Term:
        """Block ``j`` of ``sq`` (the pre-commit sequence) became full of computed,
        committed KV in this commit (``ntok``: known tokens after it)."""
        return z3.And((j + 1) * BS > sq.nc, (j + 1) * BS <= new_nc)

    def may_publish(self, committed: Term, parent_known: Term, taken: Term) -> Term:
        """Publish a committed block unless its identity is taken (the duplicate stays
        private) or its parent identity is not published (INV-ANCESTOR)."""
        return z3.And(committed, parent_known, z3.Not(taken))

    def block_depth(self, j: int) -> Term:
        return z3.IntVal(j + 1)

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

    def op_rollback(self, d: Domain, st: State, a: dict[str, Any], s: int) -> Step:
        """rollback: give back the last ``n`` unwritten slots, releasing blocks tail first."""
        M, sq, n = self.bounds.table, st.seqs[s], a["n"]
        nr = sq.nr - n
        keep = _ceil_blocks(nr, st.BS, M)
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

    def op_free(self, d: Domain, st: State, a: dict[str, Any]) -> Step:
        """free: batched release; a block held by several freed tables drops once per hold."""
        freed = a["freed"]
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
            {"victim": v},
        )

    def exists_leaf(self, d: Domain, st: State) -> Term:
        return d.exists_blocks(st.N, lambda b: self.is_leaf(d, st, b))

    def op_evict(self, d: Domain, st: State, a: dict[str, Any]) -> Step:
        """``evict(n)`` with ``n = len(victims)``: evict leaves while there are any."""
        en, ch = [], []
        for v in a["victims"]:
            avail = self.exists_leaf(d, st)
            en.append(z3.Implies(avail, self.is_leaf(d, st, v)))
            ch.append(z3.Implies(avail, self.is_first_leaf(d, st, v)))
            st = self.evict_one(st, v, avail)
        return Step("evict", z3.And(en), z3.BoolVal(True), z3.And(ch), st, a)

    def op_reset_keep(self, d: Domain, st: State, a: dict[str, Any]) -> Step:
        """reset(preserve_cache=True): free every live sequence, keep published blocks."""
        live = [sq.live for sq in st.seqs]
        post = State.ite(z3.Or(live), self.free_seqs(st, live), st)
        return Step("reset_keep", z3.BoolVal(True), z3.BoolVal(True), z3.BoolVal(True), post, a)

    def op_reset_full(self, d: Domain, st: State, a: dict[str, Any]) -> Step:
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
            idx=_empty_index(support),
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


def _empty_index(support: tuple[tuple[Term, Term, Term], ...] | None) -> IndexMap:
    ns, p, t = z3.Ints("lam!ns lam!p lam!t")
    return IndexMap(z3.Lambda([ns, p, t], z3.IntVal(NONE)), z3.IntVal(NONE), support)
