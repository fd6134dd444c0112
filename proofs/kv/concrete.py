"""Concrete states of the model, and the bridge to the Python spec.

:class:`AbsState` is the model's view of a cache as plain Python values. It is the meeting
point of three things:

* :func:`abstract` reads a :class:`~prefixkv.spec.SpecCache` into it;
* :func:`concretize` builds a ``SpecCache`` whose state is a given ``AbsState`` (used to run
  the spec on states sampled from Z3 models);
* :func:`bind` substitutes it for the variables of a concrete-domain :class:`State`, and
  :func:`read` reads one back from a Z3 model (counterexamples, witnesses, samples).

Token ids and namespaces are abstracted to integer labels through :class:`Labels`, which
interns them both ways. ``abstract``/``concretize`` reach into the spec's private state:
the spec has no public constructor from a snapshot, and the drift check needs one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import z3
from prefixkv.spec import Namespace, SpecCache
from prefixkv.spec import cache as spec_cache
from prefixkv.spec.identity import BlockIdentity, fast_hash
from prefixkv.spec.request import SeqId

from .model import COUNTERS, NONE, ROOT, State

__all__ = [
    "AbsSeq",
    "AbsState",
    "Labels",
    "OutOfBounds",
    "abstract",
    "bind",
    "concretize",
    "format_state",
    "read",
]

#: Model counter name -> spec ``_Counters`` attribute.
SPEC_COUNTERS = {
    "queries": "queries",
    "hits": "hits",
    "prefill": "prefill_tokens",
    "computed": "prefill_tokens_computed",
    "skipped": "prefill_tokens_skipped",
    "admissions": "admissions",
    "evictions": "evictions",
    "published": "blocks_published",
}
assert set(SPEC_COUNTERS) == set(COUNTERS)

DONT_CARE = -1
"""Label of a block that is not full yet (its tokens are not all known)."""

_FILLER = 7
"""Token id of concretized tokens the model does not track (partial blocks, blocks past the
table bound); labels concretize to tokens >= 1000, so the two never meet."""


class OutOfBounds(ValueError):
    """A concrete state does not fit the model's bounds (sequence slots, table length)."""


@dataclass
class Labels:
    """Interns token tuples and namespace keys as integer labels, both ways."""

    tokens: dict[tuple[int, ...], int] = field(default_factory=dict)
    namespaces: dict[bytes, int] = field(default_factory=dict)

    def tok(self, tokens: tuple[int, ...]) -> int:
        label = self.tokens.get(tokens)
        if label is None:
            label = self.tokens[tokens] = max(self.tokens.values(), default=-1) + 1
        return label

    def ns(self, key: bytes) -> int:
        label = self.namespaces.get(key)
        if label is None:
            label = self.namespaces[key] = max(self.namespaces.values(), default=-1) + 1
        return label

    def tokens_of(self, label: int, bs: int) -> tuple[int, ...]:
        for toks, lab in self.tokens.items():
            if lab == label and len(toks) == bs:
                return toks
        toks = (1000 + label,) + (0,) * (bs - 1)
        assert toks not in self.tokens, f"label {label} clashes with {self.tokens[toks]}"
        self.tokens[toks] = label
        return toks

    def namespace_of(self, label: int) -> Namespace:
        ns = Namespace(model=f"model-{label}")
        self.namespaces.setdefault(ns.key(), label)
        assert self.namespaces[ns.key()] == label
        return ns


@dataclass
class AbsSeq:
    ns: int
    ntok: int
    nc: int
    nr: int
    table: list[int]
    labels: list[int]
    """Label of block ``j`` for ``j < table bound``; :data:`DONT_CARE` while not full."""
    nca: int = 0
    """``num_cached``: tokens attached from the cache at admission."""
    win: int = 0
    """``window_blocks``: recompute-window blocks right after the cached ones."""
    np: int = 0
    """``prompt_len``."""
    lim: int = 0
    """``kv_token_limit``, 0 for None."""
    tokens: tuple[int, ...] = field(default=(), compare=False)
    """The concrete tokens, when known (not part of the model)."""


@dataclass
class AbsState:
    """A concrete state of the model as Python values (``seqs[slot]`` is None when empty)."""

    n: int
    bs: int
    rc: list[int]
    pub: list[bool]
    par: list[int]
    bns: list[int]
    btok: list[int]
    depth: list[int]
    lu: list[int]
    queue: list[int]
    index: dict[tuple[int, int, int], int]
    seqs: list[AbsSeq | None]
    clock: int
    ctr: dict[str, int]

    def canonical(self, table_bound: int) -> tuple[Any, ...]:
        """The components the model determines, with don't-cares blanked: per-block data
        only where meaningful (identity of published blocks, age of evictable ones), labels
        only of full blocks."""
        blocks = tuple(
            (
                self.rc[b],
                self.pub[b],
                (self.par[b], self.bns[b], self.btok[b], self.depth[b]) if self.pub[b] else None,
                self.lu[b] if self.pub[b] and self.rc[b] == 0 else None,
            )
            for b in range(self.n)
        )
        seqs = tuple(
            None
            if sq is None
            else (
                sq.ns,
                sq.ntok,
                sq.nc,
                sq.nr,
                sq.nca,
                sq.win,
                sq.np,
                sq.lim,
                tuple(sq.table),
                tuple(
                    sq.labels[j] if (j + 1) * self.bs <= sq.ntok else DONT_CARE
                    for j in range(table_bound)
                ),
            )
            for sq in self.seqs
        )
        return (
            self.n,
            self.bs,
            blocks,
            tuple(self.queue),
            tuple(sorted(self.index.items())),
            seqs,
            self.clock,
            tuple(sorted(self.ctr.items())),
        )


# -- spec <-> AbsState ---------------------------------------------------------------------


def abstract(
    cache: SpecCache, slots: Sequence[SeqId | None], labels: Labels, table_bound: int
) -> AbsState:
    """The model's view of ``cache``; ``slots[i]`` is the sequence id placed in slot ``i``."""
    s = cache._s  # the spec has no public full-state accessor; see the module docstring
    bs = cache.block_size
    n = cache.num_blocks
    rc, par, bns, btok, depth, lu = ([0] * n for _ in range(6))
    pub = [False] * n
    for b, blk in enumerate(s.blocks):
        rc[b], depth[b], lu[b] = blk.refcount, blk.depth, blk.last_use
        ident = blk.identity
        if ident is not None:
            pub[b] = True
            bns[b] = labels.ns(ident.namespace)
            btok[b] = labels.tok(ident.token_ids)
            par[b] = ROOT if ident.parent is None else s.index[ident.parent]
    index = {
        (
            labels.ns(ident.namespace),
            ROOT if ident.parent is None else s.index[ident.parent],
            labels.tok(ident.token_ids),
        ): b
        for ident, b in s.index.items()
    }
    live = set(s.seqs)
    placed = {sid for sid in slots if sid is not None}
    if live - placed:
        raise OutOfBounds(f"sequences {sorted(map(str, live - placed))} have no slot")
    seqs: list[AbsSeq | None] = []
    for sid in slots:
        if sid is None or sid not in s.seqs:
            seqs.append(None)
            continue
        sq = s.seqs[sid]
        if len(sq.blocks) > table_bound:
            raise OutOfBounds(f"sequence {sid!r} holds {len(sq.blocks)} > {table_bound} blocks")
        seqs.append(
            AbsSeq(
                ns=labels.ns(sq.namespace.key()),
                ntok=len(sq.tokens),
                nc=sq.num_computed,
                nr=sq.num_reserved,
                nca=sq.num_cached,
                win=sq.window_blocks,
                np=sq.prompt_len,
                lim=0 if sq.kv_token_limit is None else sq.kv_token_limit,
                table=list(sq.blocks),
                labels=[
                    labels.tok(tuple(sq.tokens[j * bs : (j + 1) * bs]))
                    if (j + 1) * bs <= len(sq.tokens)
                    else DONT_CARE
                    for j in range(table_bound)
                ],
                tokens=tuple(sq.tokens),
            )
        )
    return AbsState(
        n=n,
        bs=bs,
        rc=rc,
        pub=pub,
        par=par,
        bns=bns,
        btok=btok,
        depth=depth,
        lu=lu,
        queue=list(s.free),
        index=index,
        seqs=seqs,
        clock=s.clock,
        ctr={k: getattr(s.counters, v) for k, v in SPEC_COUNTERS.items()},
    )


def concretize(a: AbsState, labels: Labels) -> tuple[SpecCache, list[SeqId | None]]:
    """A ``SpecCache`` in state ``a`` (which must satisfy the invariants), and the sequence
    id of every slot."""
    cache = SpecCache(a.n, a.bs)
    idents: dict[int, BlockIdentity] = {}
    hashes: dict[int, int] = {}

    def ident(b: int) -> BlockIdentity:
        if b not in idents:
            parent = None if a.par[b] == ROOT else ident(a.par[b])
            ns = labels.namespace_of(a.bns[b]).key()
            toks = labels.tokens_of(a.btok[b], a.bs)
            idents[b] = BlockIdentity(ns, parent, toks)
            parent_hash = None if a.par[b] == ROOT else hashes[a.par[b]]
            hashes[b] = fast_hash(parent_hash, ns, toks, ())
        return idents[b]

    blocks = []
    for b in range(a.n):
        if a.pub[b]:
            blocks.append(
                spec_cache._Block(
                    refcount=a.rc[b],
                    identity=ident(b),
                    block_hash=hashes[b],
                    depth=a.depth[b],
                    last_use=a.lu[b],
                )
            )
        else:
            blocks.append(spec_cache._Block(refcount=a.rc[b]))
    index = {ident(b): b for b in range(a.n) if a.pub[b]}
    seqs: dict[SeqId, spec_cache._Seq] = {}
    slots: list[SeqId | None] = []
    for slot, sq in enumerate(a.seqs):
        if sq is None:
            slots.append(None)
            continue
        sid = f"seq{slot}"
        tokens: list[int] = []
        for j in range(sq.ntok // a.bs):
            full = j < len(sq.labels) and sq.labels[j] != DONT_CARE
            tokens.extend(labels.tokens_of(sq.labels[j], a.bs) if full else (_FILLER,) * a.bs)
        tokens.extend([_FILLER] * (sq.ntok - len(tokens)))
        seqs[sid] = spec_cache._Seq(
            seq_id=sid,
            namespace=labels.namespace_of(sq.ns),
            tokens=tuple(tokens),
            blocks=list(sq.table),
            num_computed=sq.nc,
            num_reserved=sq.nr,
            # The encoding models recompute windows and chunked prefill, not multimodal spans.
            prompt_len=sq.np,
            num_cached=sq.nca,
            window_blocks=sq.win,
            kv_token_limit=sq.lim or None,
            spans=(),
        )
        slots.append(sid)
    counters = spec_cache._Counters(**{SPEC_COUNTERS[k]: v for k, v in a.ctr.items()})
    cache._s = spec_cache._State(
        blocks=blocks,
        free=list(a.queue),
        index=index,
        seqs=seqs,
        counters=counters,
        events=[],
        evicted={},
        clock=a.clock,
    )
    return cache, slots


# -- AbsState <-> Z3 -----------------------------------------------------------------------


def bind_values(a: AbsState, n_slots: int, table_bound: int) -> dict[str, int | bool]:
    """The value of every leaf variable of a concrete-domain state (by leaf name) that
    gives it the value ``a``. The free queue is placed at positions ``0..len-1``; blocks
    outside it get the ghost position -1."""
    if len(a.index) > a.n:
        raise OutOfBounds(f"{len(a.index)} index entries for {a.n} blocks")
    if len(a.seqs) > n_slots:
        raise OutOfBounds(f"{len(a.seqs)} slots for {n_slots}")
    out: dict[str, int | bool] = {"BS": a.bs, "qh": 0, "qt": len(a.queue), "clock": a.clock}
    pos = {b: i for i, b in enumerate(a.queue)}
    for b in range(a.n):
        out[f"rc[{b}]"] = a.rc[b]
        out[f"pub[{b}]"] = a.pub[b]
        out[f"par[{b}]"] = a.par[b]
        out[f"bns[{b}]"] = a.bns[b]
        out[f"btok[{b}]"] = a.btok[b]
        out[f"depth[{b}]"] = a.depth[b]
        out[f"lu[{b}]"] = a.lu[b]
        out[f"qpos[{b}]"] = pos.get(b, -1)
        out[f"q[+{b}]"] = a.queue[b] if b < len(a.queue) else NONE
    entries = sorted(a.index.items())
    for e in range(a.n):
        if e < len(entries):
            (ns, p, t), b = entries[e]
        else:  # padding: a NONE entry at a key no real entry uses
            (ns, p, t), b = (-2 - e, -2, -2), NONE
        out[f"idx{e}.ns"], out[f"idx{e}.par"], out[f"idx{e}.tok"], out[f"idx{e}.val"] = (
            ns,
            p,
            t,
            b,
        )
    for s in range(n_slots):
        sq = a.seqs[s] if s < len(a.seqs) else None
        out[f"s{s}.live"] = sq is not None
        if sq is None:
            sq = AbsSeq(0, 0, 0, 0, [], [])
        if len(sq.table) > table_bound:
            raise OutOfBounds(f"table of {len(sq.table)} blocks")
        out[f"s{s}.ns"], out[f"s{s}.ntok"] = sq.ns, sq.ntok
        out[f"s{s}.nc"], out[f"s{s}.nr"], out[f"s{s}.len"] = sq.nc, sq.nr, len(sq.table)
        out[f"s{s}.nca"], out[f"s{s}.win"] = sq.nca, sq.win
        out[f"s{s}.np"], out[f"s{s}.lim"] = sq.np, sq.lim
        for j in range(table_bound):
            out[f"s{s}.tab{j}"] = sq.table[j] if j < len(sq.table) else 0
            out[f"s{s}.lab{j}"] = sq.labels[j] if j < len(sq.labels) else DONT_CARE
    for k in COUNTERS:
        out[k] = a.ctr[k]
    return out


def bind(st: State, a: AbsState, table_bound: int) -> list[tuple[Any, Any]]:
    """Substitution pairs that give the concrete-domain state ``st`` the value ``a``."""
    if not st.leaves:
        raise ValueError("bind() needs a fresh concrete-domain state")
    values = bind_values(a, len(st.seqs), table_bound)
    return [
        (v, z3.BoolVal(values[name]) if z3.is_bool(v) else z3.IntVal(values[name]))
        for name, v in st.leaves.items()
        if name in values
    ]


def read(
    st: State, ev: Callable[[Any], Any], n: int, table_bound: int, max_queue: int | None = None
) -> AbsState:
    """Read a state of a concrete domain of ``n`` blocks through ``ev`` (a model's eval)."""

    def i(t: Any) -> int:
        return int(ev(t).as_long())

    def bl(t: Any) -> bool:
        return bool(z3.is_true(ev(t)))

    qh, qt = i(st.qh), i(st.qt)
    limit = n + 2 if max_queue is None else max_queue
    queue = [i(st.q[p]) for p in range(qh, min(qt, qh + limit))]
    index: dict[tuple[int, int, int], int] = {}
    for key in st.idx.support or ():
        v = i(st.idx.get(key))
        if v != NONE:
            index[(i(key[0]), i(key[1]), i(key[2]))] = v
    seqs: list[AbsSeq | None] = []
    for sq in st.seqs:
        if not bl(sq.live):
            seqs.append(None)
            continue
        length = i(sq.len)
        seqs.append(
            AbsSeq(
                ns=i(sq.ns),
                ntok=i(sq.ntok),
                nc=i(sq.nc),
                nr=i(sq.nr),
                nca=i(sq.nca),
                win=i(sq.win),
                np=i(sq.np),
                lim=i(sq.lim),
                table=[i(sq.tab[j]) for j in range(max(0, min(length, table_bound)))],
                labels=[i(x) for x in sq.lab],
            )
        )
    return AbsState(
        n=n,
        bs=i(st.BS),
        rc=[i(st.rc[b]) for b in range(n)],
        pub=[bl(st.pub[b]) for b in range(n)],
        par=[i(st.par[b]) for b in range(n)],
        bns=[i(st.bns[b]) for b in range(n)],
        btok=[i(st.btok[b]) for b in range(n)],
        depth=[i(st.depth[b]) for b in range(n)],
        lu=[i(st.lu[b]) for b in range(n)],
        queue=queue,
        index=index,
        seqs=seqs,
        clock=i(st.clock),
        ctr={k: i(v) for k, v in st.ctr.items()},
    )


def model_reader(m: z3.ModelRef) -> Callable[[Any], Any]:
    return lambda t: m.eval(t, model_completion=True)


# -- printing ------------------------------------------------------------------------------


def format_state(a: AbsState, indent: str = "  ") -> str:
    """A readable rendering of a concrete state (for counterexamples and witnesses)."""
    free = set(a.queue)
    lines = [f"pool: {a.n} blocks of {a.bs} tokens, clock {a.clock}"]
    lines.append(f"{indent}block  refs  published  parent  ns  tokens  depth  last_use  kind")
    for b in range(a.n):
        kind = (
            "free"
            if b in free
            else "in use"
            if a.rc[b] > 0
            else ("evictable" if a.pub[b] else "LOST")
        )
        if a.pub[b]:
            parent = "root" if a.par[b] == ROOT else str(a.par[b])
            ident = f"{parent:>6}  {a.bns[b]:>2}  {a.btok[b]:>6}  {a.depth[b]:>5}"
        else:
            ident = f"{'-':>6}  {'-':>2}  {'-':>6}  {'-':>5}"
        lines.append(
            f"{indent}{b:>5}  {a.rc[b]:>4}  {'yes' if a.pub[b] else 'no':>9}  {ident}  "
            f"{a.lu[b]:>8}  {kind}"
        )
    lines.append(f"{indent}free queue (head first): {a.queue}")
    entries = ", ".join(
        f"(ns {ns}, parent {'root' if p == ROOT else p}, tokens {t}) -> {b}"
        for (ns, p, t), b in sorted(a.index.items())
    )
    lines.append(f"{indent}index: {entries or '{}'}")
    for s, sq in enumerate(a.seqs):
        if sq is None:
            lines.append(f"{indent}slot {s}: empty")
            continue
        labs = ", ".join(
            str(x) if (j + 1) * a.bs <= sq.ntok else "-" for j, x in enumerate(sq.labels)
        )
        lines.append(
            f"{indent}slot {s}: ns {sq.ns}, {sq.ntok} tokens (block labels [{labs}]), "
            f"prompt {sq.np}{f', limit {sq.lim}' if sq.lim else ''}, computed {sq.nc}, "
            f"reserved {sq.nr}, cached {sq.nca}, window {sq.win}, table {sq.table}"
        )
    lines.append(f"{indent}counters: " + ", ".join(f"{k}={v}" for k, v in a.ctr.items()))
    return "\n".join(lines)
