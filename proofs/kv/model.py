"""The KV model's state in Z3: its data types, and the spec's decision points.

The formulas over a state are in :mod:`.formulas`, the transitions in :mod:`.transitions`.

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
  Multimodal spans appear only in :meth:`~.transitions.Encoding.lookup` (one span per
  prompt, INV-MATCH after every step); admission's match and the sequences have none (there
  the clamp is the identity).
* **Refusals** (INV-TXN): :meth:`~.transitions.Encoding.refusals` lists the spec's raise
  sites of each operation as conditions on the pre-state and arguments;
  :meth:`~.transitions.Encoding.outcome` is the successor when enabled and
  :meth:`~.transitions.Encoding.refused` (the pre-state) otherwise.
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
on :class:`~.transitions.Encoding` per formula and a transition per operation, as INV-WINDOW
did (the per-sequence ``nca``/``win`` fields, :meth:`~.transitions.Encoding.inv_window`,
and the window cut in :meth:`~.transitions.Encoding.attach`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import z3

from ..terms import BoolTerm, IntTerm, Term

__all__ = [
    "NONE",
    "OPS",
    "ROOT",
    "TXN_ERRORS",
    "AdmitArgs",
    "AppendArgs",
    "Bounds",
    "CommitArgs",
    "ContinueArgs",
    "CountArgs",
    "Domain",
    "EvictArgs",
    "EvictManyArgs",
    "FreeArgs",
    "IndexMap",
    "ModelBase",
    "NoArgs",
    "OpArgs",
    "Query",
    "SeqState",
    "SpecDecisions",
    "State",
    "Step",
    "ceil_blocks",
    "cstore",
    "empty_index",
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


# -- the arguments of a transition, as typed records -----------------------------------------


class AdmitArgs(NamedTuple):
    """admit (and its proof step ``attach``, which has no victims): the request's namespace,
    length and block labels, ``num_new_tokens`` (``whole``: None), ``recompute_blocks``,
    ``kv_token_limit`` (0: None) and the eviction victims the spec may pick."""

    ns: IntTerm
    ntok: IntTerm
    labels: tuple[IntTerm, ...]
    num_new: IntTerm
    whole: BoolTerm
    recompute_blocks: IntTerm
    limit: IntTerm
    victims: tuple[IntTerm, ...]


class AppendArgs(NamedTuple):
    """append: the tokens to add and the eviction victims."""

    n: IntTerm
    victims: tuple[IntTerm, ...]


class ContinueArgs(NamedTuple):
    """continue_prefill: ``num_new_tokens`` (``whole``: None) and the eviction victims."""

    num_new: IntTerm
    whole: BoolTerm
    victims: tuple[IntTerm, ...]


class CountArgs(NamedTuple):
    """rollback, and the proof step ``grow``: a number of tokens."""

    n: IntTerm


class CommitArgs(NamedTuple):
    """commit: computed tokens, accepted tokens, and the labels of the blocks they fill."""

    n: IntTerm
    accepted: IntTerm
    labels: tuple[IntTerm, ...]


class FreeArgs(NamedTuple):
    """free: which sequence slots the batch frees."""

    freed: tuple[BoolTerm, ...]


class EvictArgs(NamedTuple):
    """The proof step ``evict``: one victim."""

    victim: IntTerm


class EvictManyArgs(NamedTuple):
    """evict (``evict*k``): ``k`` victims in order."""

    victims: tuple[IntTerm, ...]


class NoArgs(NamedTuple):
    """reset: no arguments."""


OpArgs = (
    AdmitArgs
    | AppendArgs
    | ContinueArgs
    | CountArgs
    | CommitArgs
    | FreeArgs
    | EvictArgs
    | EvictManyArgs
    | NoArgs
)
"""The arguments of any transition (:meth:`~.transitions.Encoding.fresh_args`)."""


class Query(NamedTuple):
    """A prompt to look up (INV-MATCH after any operation): namespace, length, one label per
    block, one multimodal span ``[span_start, span_end)`` and the hash candidates."""

    ns: IntTerm
    ntok: IntTerm
    labels: tuple[IntTerm, ...]
    cands: tuple[IntTerm, ...]
    span_start: IntTerm
    span_end: IntTerm


@dataclass(frozen=True)
class Step:
    """A transition: ``pre --op(args)--> post`` when ``enabled and bounded and choice``."""

    op: str
    enabled: Term
    bounded: Term
    choice: Term
    post: State
    args: OpArgs


def ceil_blocks(n: Term, bs: Term, m: int) -> Term:
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


class ModelBase:
    """The model's bounds and fresh states; :class:`SpecDecisions` and the formulas and
    transitions build on it (:class:`~.transitions.Encoding` is the whole model)."""

    def __init__(self, bounds: Bounds | None = None) -> None:
        self.bounds = bounds or Bounds()

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
            idx, support = empty_index(()), []
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


# == decision points of the spec ===========================================================


class SpecDecisions(ModelBase):
    """The spec's decision points: one hook per choice the spec makes, each a small term.

    Broken variants (:mod:`.broken`) and seeded drifts (:mod:`.drift`) override these to
    make a different choice, and the proofs or the drift check must notice. A few variants
    replace a whole step instead (``allocate``, ``evict_one``, ``free_seqs``, ``make_room``,
    ``grow``, ``attach``, ``op_rollback``, ``op_reset_full``, ``refusals``, ``refused``:
    :mod:`.transitions`) or drop a strengthening (``invariants``, ``inv_partition``:
    :mod:`.formulas`).
    """

    def within_cap(self, BS: Term, j: int, ntok: Term) -> Term:
        """Block ``j`` may be a hit: at least one prompt token stays to compute (choice 4,
        at most ``(ntok - 1) // BS`` blocks)."""
        return (j + 1) * BS <= ntok - 1

    def verify(self, st: State, c: Term, key: tuple[Term, Term, Term]) -> Term:
        """A candidate is a hit only if it is published and its *stored* identity equals the
        key exactly (namespace, parent block, tokens and extra keys): a hash is only an
        index."""
        ns, parent, label = key
        return z3.And(st.pub[c], st.bns[c] == ns, st.par[c] == parent, st.btok[c] == label)

    def span_clamp(self, BS: Term, raw: list[Term], q: Query) -> list[Term]:
        """Choice 5: a match of ``m`` blocks whose end ``m * BS`` lies strictly inside the
        span is cut back to ``span_start // BS`` blocks (unrolled: linear in ``BS``)."""
        M = len(raw)
        m = z3.Sum([z3.If(h, 1, 0) for h in raw])
        inside = z3.Or(
            [z3.And(m == k, q.span_start < k * BS, k * BS < q.span_end) for k in range(1, M + 1)]
        )
        return [
            z3.And(raw[j], z3.Or(z3.Not(inside), (j + 1) * BS <= q.span_start)) for j in range(M)
        ]

    def chain(self, st: State, ns: Term, labels: Sequence[Term]) -> list[Term]:
        """Canonical blocks of an identity chain: ``c[j]`` is the published block with the
        identity of block ``j`` of a sequence, or ``NONE``."""
        out, c = [], z3.IntVal(ROOT)
        for j, lab in enumerate(labels):
            look = st.idx.get((ns, c, lab))
            c = look if j == 0 else z3.If(c == NONE, z3.IntVal(NONE), look)
            out.append(c)
        return out

    def chunk_room(self, sq: SeqState, nr: Term) -> Term:
        """Reserving up to ``nr`` keeps at most ``limit`` uncommitted *prompt* tokens:
        ``min(nr, prompt_len) - num_computed <= limit`` while the prompt is not computed."""
        return z3.Implies(
            z3.And(sq.lim > 0, sq.nc < sq.np), z3.If(nr < sq.np, nr, sq.np) - sq.nc <= sq.lim
        )

    def grow_room(self, sq: SeqState, nr: Term) -> Term:
        """What :meth:`~.transitions.Encoding.grow` requires of the new reservation
        (:meth:`chunk_room`)."""
        return self.chunk_room(sq, nr)

    def window_pending(self, BS: Term, sq: SeqState, j: int) -> Term:
        """Window block ``j`` is not yet fully recomputed and committed (once it is, the
        window did its job for it: it may even be published, when its twin was evicted)."""
        return (j + 1) * BS > sq.nc

    def chunk_size(self, remaining: Term, whole: Term, num_new: Term, limit: Term) -> Term:
        """Tokens a prefill chunk reserves (``spec.cache.chunk_end`` without spans): the
        remaining prompt, at most ``num_new_tokens`` (unless ``whole``) and at most
        ``kv_token_limit`` (unless 0, i.e. None)."""
        n = z3.If(z3.Or(whole, remaining <= num_new), remaining, num_new)
        return z3.If(z3.Or(limit <= 0, n <= limit), n, limit)

    def window_size(self, rb: Term, m: Term) -> Term:
        """Window blocks of an admission: ``min(recompute_blocks, matched blocks)``."""
        return z3.If(rb < m, rb, m)

    def cached_tokens(self, BS: Term, cached: Term, w: Term) -> Term:
        """``num_cached`` recorded for the sequence: the attached tokens only."""
        return cached

    def attach_guard(self, sq: SeqState, a: AdmitArgs) -> Term:
        """admit succeeds only for a new sequence id, a non-empty prompt, a positive
        ``num_new_tokens`` when one is given, ``recompute_blocks >= 0`` and a
        ``kv_token_limit`` that is None (0) or positive."""
        return z3.And(
            z3.Not(sq.live),
            a.ntok >= 1,
            z3.Or(a.whole, a.num_new >= 1),
            a.recompute_blocks >= 0,
            a.limit >= 0,
        )

    def count_admission(self, st: State, ntok: Term, cached: Term, remaining: Term) -> State:
        """INV-STATS: an admission counts its prompt as queried and prefilled, its attached
        tokens as hits and skipped, and the rest as computed."""
        st = st.count("admissions", 1).count("queries", ntok).count("hits", cached)
        return st.count("prefill", ntok).count("skipped", cached).count("computed", remaining)

    def table_length(self, nr: Term, BS: Term) -> Term:
        """Blocks a table holds for ``nr`` reserved slots: ``ceil(nr / BS)``."""
        return ceil_blocks(nr, BS, self.bounds.table)

    def continue_guard(self, sq: SeqState, a: ContinueArgs) -> Term:
        """continue_prefill succeeds for a live sequence with prompt tokens left to reserve,
        whose reserved tokens are all committed, and a positive ``num_new_tokens`` if any."""
        return z3.And(sq.live, z3.Or(a.whole, a.num_new >= 1), sq.nr < sq.np, sq.nc == sq.nr)

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
        """Eviction's depth of block ``j`` of a table: its position in the chain, from 1."""
        return z3.IntVal(j + 1)

    def frees_at_zero(self, st: State, b: Term) -> Term:
        """A block whose last hold goes joins the free queue iff it is private."""
        return z3.Not(st.pub[b])

    def is_leaf(self, d: Domain, st: State, b: Term) -> Term:
        """Choice 3: only a leaf is evictable: published, refcount 0, no published child."""
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


def empty_index(support: tuple[tuple[Term, Term, Term], ...] | None) -> IndexMap:
    ns, p, t = z3.Ints("lam!ns lam!p lam!t")
    return IndexMap(z3.Lambda([ns, p, t], z3.IntVal(NONE)), z3.IntVal(NONE), support)
