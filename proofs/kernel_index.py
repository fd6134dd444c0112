"""Kernel index arithmetic, proved over every size the kernels claim to support.

The formulas are the ones the launchers and the torch references call:
:mod:`prefixkv.kernels.index_math`, imported here and evaluated on symbolic values (no
copies). Sizes range over :data:`~prefixkv.kernels.index_math.SUPPORTED_RANGES`.

Each function is proved in two ways, because each kind of claim needs its own solver:

* **bit-vectors** (``bv32``/``bv64``): the function runs on 32-bit (int32 kernels) or 64-bit
  (``USE_INT64``) bit-vectors, and *every* ``+``, ``-`` and ``*`` it performs is checked with
  Z3's signed no-overflow/no-underflow predicates (every ``//`` and ``%`` with a non-zero
  divisor). "No intermediate overflows" is what makes the kernel's machine arithmetic equal
  to integer arithmetic.
* **integers** (``int``): the same function runs on unbounded integers and the range claims
  are proved there (slots stay in the pool, table reads stay in the table, pages are
  converted exactly once, the conv gather stays in bounds). Bit-blasting cannot prove
  monotonicity of multiplication (``e < n  =>  e * bs < n * bs``) at these widths in
  reasonable time; integer arithmetic does it at once, and the bit-vector proofs above make
  the two semantics agree.

Element offsets are the one place int32 is not enough for every supported size: the launcher
picks int32 only when ``offsets_fit_int32`` says ``max_element_offset(shape, strides) + 1 <=
INT32_MAX``. The proofs show every intermediate of the offset formulas is at most
``max_element_offset`` (evaluated symbolically too), so that test is sufficient, and that the
int64 path never overflows for any supported size.

NOTE: one module, not a package with the models' parts: the proofs run the kernels' own
``index_math`` on symbolic values, so there is no state, no transition, and no model that
could drift from the code (hence no drift check and no seeded drifts). What ``prove`` runs
of it, its obligations and its broken variants, is its :data:`SUITE`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from unittest import mock

import z3
from prefixkv.kernels import index_math as im

from .kv.obligations import PROPERTY_IDS
from .suite import BrokenRow, Part, ProofSuite, Selection

#: NOTE: index_math is typed for ints and runs here over ``Sym``, which duck-types int;
#: the symbolic calls go through this untyped alias on purpose.
im_sym: Any = im

__all__ = [
    "KERNEL_OBLIGATIONS",
    "KERNEL_VARIANTS",
    "SUITE",
    "KernelObligation",
    "KernelResult",
    "KernelVariant",
    "check_kernel_variant",
    "prove_kernels",
    "run_obligation",
]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class _Recorder:
    """Builds symbolic values and remembers every operation performed on them."""

    def __init__(self, mode: str, width: int = 0, signed: bool = True) -> None:
        self.mode, self.width, self.signed = mode, width, signed
        self.safety: list[Any] = []  # bv: no-overflow conditions of every operation
        self.values: list[Any] = []  # every intermediate value
        self.kinds: list[str] = []  # the operation that produced each value
        self._n = 0

    def var(self, name: str, lo: int, hi: int, facts: list[Any]) -> Sym:
        """A fresh value in ``[lo, hi]`` (the range goes into ``facts``)."""
        self._n += 1
        if self.mode == "int":
            e = z3.Int(f"{name}")
            facts.append(z3.And(lo <= e, e <= hi))
        else:
            e = z3.BitVec(f"{name}", self.width)
            facts.append(z3.And(z3.UGE(e, lo), z3.ULE(e, hi)))
        return Sym(e, self, nonzero=lo > 0)

    def lift(self, x: Any) -> Any:
        if isinstance(x, Sym):
            return x.e
        if isinstance(x, int):
            return z3.IntVal(x) if self.mode == "int" else z3.BitVecVal(x, self.width)
        return x

    def binop(self, op: str, a: Any, b: Any) -> Sym:
        x, y = self.lift(a), self.lift(b)
        r = {"+": lambda: x + y, "-": lambda: x - y, "*": lambda: x * y}[op]()
        if self.mode == "bv":
            self.safety.append(self._no_overflow(op, x, y, r))
        self.values.append(r)
        self.kinds.append(op)
        return Sym(r, self)

    def _no_overflow(self, op: str, x: Any, y: Any, r: Any) -> Any:
        """``x op y`` is exact in a signed machine integer of this width.

        Signed predicates where masked lanes may go negative (``seq_len - 1`` at 0); where
        every value is non-negative, the cheaper unsigned ones plus a clear sign bit.
        """
        if self.signed:
            if op == "+":
                return z3.And(z3.BVAddNoOverflow(x, y, True), z3.BVAddNoUnderflow(x, y))
            if op == "-":
                return z3.And(z3.BVSubNoOverflow(x, y), z3.BVSubNoUnderflow(x, y, True))
            return z3.And(z3.BVMulNoOverflow(x, y, True), z3.BVMulNoUnderflow(x, y))
        sign_clear = z3.Extract(self.width - 1, self.width - 1, r) == 0
        if op == "+":
            return z3.And(z3.BVAddNoOverflow(x, y, False), sign_clear)
        if op == "-":
            return z3.And(z3.UGE(x, y), sign_clear)
        return z3.And(z3.BVMulNoOverflow(x, y, False), sign_clear)


class Sym:
    """A symbolic integer the index functions can compute with (``+ - *``, ``== 0``)."""

    __slots__ = ("e", "nonzero", "rec")

    def __init__(self, e: Any, rec: _Recorder, nonzero: bool = False) -> None:
        self.e, self.rec, self.nonzero = e, rec, nonzero

    def __add__(self, o: Any) -> Sym:
        return self.rec.binop("+", self, o)

    def __radd__(self, o: Any) -> Sym:
        return self.rec.binop("+", o, self)

    def __sub__(self, o: Any) -> Sym:
        return self.rec.binop("-", self, o)

    def __rsub__(self, o: Any) -> Sym:
        return self.rec.binop("-", o, self)

    def __mul__(self, o: Any) -> Sym:
        return self.rec.binop("*", self, o)

    def __rmul__(self, o: Any) -> Sym:
        return self.rec.binop("*", o, self)

    def __eq__(self, o: object) -> bool:
        # Only host code asks (``any(n == 0 ...)``), about sizes known to be positive.
        if isinstance(o, int) and o == 0 and self.nonzero:
            return False
        raise TypeError("a symbolic size can only be compared with 0 when it is positive")

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class _IntOps:
    """``IndexOps`` over z3 integers (floor division and modulo for positive divisors)."""

    def div(self, a: Any, b: Any) -> Any:
        return a / b

    def mod(self, a: Any, b: Any) -> Any:
        return a % b

    def lt(self, a: Any, b: Any) -> Any:
        return a < b

    def ite(self, cond: Any, a: Any, b: Any) -> Any:
        return z3.If(cond, a, b)


class _SymOps:
    """``IndexOps`` over :class:`Sym`: ``index_math.z3_ops()`` on bit-vectors, integer ops
    on integers; every division checks its divisor."""

    def __init__(self, rec: _Recorder) -> None:
        self.rec = rec
        self.base = im.z3_ops() if rec.mode == "bv" else _IntOps()

    def _divisor_ok(self, b: Any) -> None:
        y = self.rec.lift(b)
        self.rec.safety.append(y != 0)

    def div(self, a: Any, b: Any) -> Sym:
        self._divisor_ok(b)
        r = self.base.div(self.rec.lift(a), self.rec.lift(b))
        self.rec.values.append(r)
        self.rec.kinds.append("//")
        return Sym(r, self.rec)

    def mod(self, a: Any, b: Any) -> Sym:
        self._divisor_ok(b)
        r = self.base.mod(self.rec.lift(a), self.rec.lift(b))
        self.rec.values.append(r)
        self.rec.kinds.append("%")
        return Sym(r, self.rec)

    def lt(self, a: Any, b: Any) -> Any:
        return self.base.lt(self.rec.lift(a), self.rec.lift(b))

    def ite(self, cond: Any, a: Any, b: Any) -> Sym:
        return Sym(self.base.ite(cond, self.rec.lift(a), self.rec.lift(b)), self.rec)


def _range(name: str) -> tuple[int, int]:
    r = im.SUPPORTED_RANGES[name]
    return r.low, r.high


@dataclass
class KernelResult:
    invariant: str
    function: str
    method: str
    status: str
    seconds: float
    detail: str = ""
    non_vacuous: bool | None = None
    rlimit_used: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "invariant": self.invariant,
            "operation": self.function,
            "method": self.method,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "non_vacuous": self.non_vacuous,
            "rlimit_used": self.rlimit_used,
            "detail": self.detail,
            "kind": "kernel",
        }


@dataclass(frozen=True)
class KernelObligation:
    invariant: str
    function: str
    method: str  # "bv32" / "bv64" / "int"
    build: Callable[[_Recorder, _SymOps, list[Any]], Any]
    """Adds hypotheses to the list and returns the claim (safety claims read rec.safety)."""
    expect: str = "proved"  # "counterexample": the claim must fail (the check can fail)
    note: str = ""


def _u(x: Sym) -> Any:
    return x.e


def _int_only(rec: _Recorder, hyp: list[Any], fact: Callable[[], Any]) -> None:
    """A hypothesis with a product of sizes, kept only for the integer proofs: the
    bit-vector (overflow) proofs hold without it, which is a stronger statement."""
    if rec.mode == "int":
        hyp.append(fact())


def _lt(rec: _Recorder, a: Any, b: Any) -> Any:
    x, y = rec.lift(a), rec.lift(b)
    return z3.ULT(x, y) if rec.mode == "bv" else x < y


def _le(rec: _Recorder, a: Any, b: Any) -> Any:
    x, y = rec.lift(a), rec.lift(b)
    return z3.ULE(x, y) if rec.mode == "bv" else x <= y


# -- slot_for_position ------------------------------------------------------------------------


def _slot_setup(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> dict[str, Any]:
    bs = rec.var("block_size", *_range("block_size"), hyp)
    nb = rec.var("num_blocks", *_range("num_blocks"), hyp)
    mb = rec.var("max_blocks_per_seq", *_range("max_blocks_per_seq"), hyp)
    seq_len = rec.var("seq_len", *_range("max_seq_len"), hyp)
    pos = rec.var("pos", 0, _range("max_seq_len")[1], hyp)
    entry = rec.var("table_entry", 0, _range("num_blocks")[1], hyp)
    hyp += [_lt(rec, pos, seq_len), _lt(rec, entry, nb)]
    # the sequence fits its table row: seq_len <= max_blocks_per_seq * block_size
    _int_only(rec, hyp, lambda: _u(seq_len) <= _u(mb) * _u(bs))
    reads: list[Any] = []

    def lookup(i: Any) -> Sym:
        reads.append(i)
        return entry

    slot = im.slot_for_position(pos, lookup, bs, ops)
    return {"bs": bs, "nb": nb, "mb": mb, "pos": pos, "entry": entry, "slot": slot, "reads": reads}


def _slot_int(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
    v = _slot_setup(rec, ops, hyp)
    page, off = im.split_slot(v["slot"], v["bs"], ops)
    return z3.And(
        *[z3.And(_u(i) >= 0, _u(i) < _u(v["mb"])) for i in v["reads"]],  # table read in row
        _u(v["slot"]) >= 0,
        _u(v["slot"]) < _u(v["nb"]) * _u(v["bs"]),  # slot inside the pool
        _u(page) == _u(v["entry"]),  # split_slot inverts it
        _u(off) == _u(v["pos"]) % _u(v["bs"]),
        *[z3.And(x >= INT32_MIN, x <= INT32_MAX) for x in rec.values],
    )


def _safety(
    build: Callable[[_Recorder, _SymOps, list[Any]], Any],
) -> Callable[[_Recorder, _SymOps, list[Any]], Any]:
    """The claim "no operation of ``build`` overflows its bit-vector width"."""

    def claim(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
        build(rec, ops, hyp)
        return z3.And(rec.safety)

    return claim


def _slot_bv(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
    v = _slot_setup(rec, ops, hyp)
    im.split_slot(v["slot"], v["bs"], ops)
    return None


# -- page conversion ------------------------------------------------------------------------


def _pages_setup(
    rec: _Recorder, ops: _SymOps, hyp: list[Any], *, twice: bool = False
) -> dict[str, Any]:
    lo, hi = _range("block_size")
    ps = rec.var("page_size", lo, hi, hyp)
    ratio = rec.var("ratio", 1, hi, hyp)
    bs = rec.var("cache_block_size", lo, hi, hyp)
    _int_only(rec, hyp, lambda: _u(bs) == _u(ps) * _u(ratio))
    nbc = rec.var("num_cache_blocks", *_range("num_blocks"), hyp)
    # the cache in kernel pages: num_cache_blocks * ratio <= supported num_blocks (pages)
    _int_only(rec, hyp, lambda: _u(nbc) * _u(ratio) <= _range("num_blocks")[1])
    mb = rec.var("max_blocks_per_seq", *_range("max_blocks_per_seq"), hyp)
    k = rec.var("page_index", 0, _range("max_blocks_per_seq")[1] * hi, hyp)
    _int_only(rec, hyp, lambda: _u(k) < _u(mb) * _u(ratio))
    reads: list[Any] = []
    table = z3.Function("table", z3.IntSort(), z3.IntSort()) if rec.mode == "int" else None
    entry = rec.var("table_entry", 0, _range("num_blocks")[1], hyp)
    hyp.append(_lt(rec, entry, nbc))

    def lookup(i: Any) -> Sym:
        reads.append(i)
        if table is None:
            return entry
        e = table(rec.lift(i))
        return Sym(e, rec)

    page = im.page_table_entry(k, lookup, ratio, ops)
    return {
        "ps": ps,
        "ratio": ratio,
        "bs": bs,
        "nbc": nbc,
        "mb": mb,
        "k": k,
        "page": page,
        "reads": reads,
        "table": table,
        "lookup": lookup,
    }


def _pages_int(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
    v = _pages_setup(rec, ops, hyp)
    table, ratio = v["table"], v["ratio"]
    j = z3.Int("j")
    # every entry of the block table that the sequence uses is a block of the cache
    hyp.append(
        z3.ForAll(
            [j],
            z3.Implies(
                z3.And(j >= 0, j < _u(v["mb"])), z3.And(table(j) >= 0, table(j) < _u(v["nbc"]))
            ),
        )
    )
    pos = rec.var("pos", 0, _range("max_seq_len")[1], hyp)
    hyp.append(_u(pos) < _u(v["mb"]) * _u(v["bs"]))

    def pages(i: Any) -> Any:
        return im.page_table_entry(i, v["lookup"], ratio, ops)

    via_blocks = im.slot_for_position(pos, v["lookup"], v["bs"], ops)
    via_pages = im.slot_for_position(pos, pages, v["ps"], ops)
    return z3.And(
        *[z3.And(_u(i) >= 0, _u(i) < _u(v["mb"])) for i in v["reads"]],
        _u(v["page"]) >= 0,
        _u(v["page"]) < _u(v["nbc"]) * _u(ratio),  # below the pool size in pages
        _u(via_pages) == _u(via_blocks),  # converted once, a slot is the same slot
        *[z3.And(x >= INT32_MIN, x <= INT32_MAX) for x in rec.values],
    )


def _pages_twice(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
    """Converting an already converted table: the slot changes (so the guard matters).

    An existential claim needs one witness; the ratio and the page size are pinned (2 and
    1) so that finding it is a small problem, not a search through nonlinear arithmetic."""
    v = _pages_setup(rec, ops, hyp)
    hyp += [_u(v["ratio"]) == 2, _u(v["ps"]) == 1]
    ratio = v["ratio"]
    pos = rec.var("pos", 0, _range("max_seq_len")[1], hyp)
    hyp.append(_u(pos) < _u(v["mb"]) * _u(v["bs"]))

    def pages(i: Any) -> Any:
        return im.page_table_entry(i, v["lookup"], ratio, ops)

    def pages_twice(i: Any) -> Any:
        return im.page_table_entry(i, pages, ratio, ops)

    via_blocks = im.slot_for_position(pos, v["lookup"], v["bs"], ops)
    return _u(im.slot_for_position(pos, pages_twice, v["ps"], ops)) == _u(via_blocks)


def _pages_bv(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
    _pages_setup(rec, ops, hyp)
    return None


# -- FlashInfer CSR: num_pages / last_page_len ------------------------------------------------


def _csr_setup(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> dict[str, Any]:
    n = rec.var("seq_len", *_range("max_seq_len"), hyp)
    ps = rec.var("page_size", *_range("block_size"), hyp)
    return {
        "n": n,
        "ps": ps,
        "pages": im.num_pages(n, ps, ops),
        "last": im.last_page_len(n, ps, ops),
    }


def _csr_int(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
    v = _csr_setup(rec, ops, hyp)
    n, ps, pages, last = _u(v["n"]), _u(v["ps"]), _u(v["pages"]), _u(v["last"])
    return z3.And(
        pages * ps >= n,
        z3.Implies(n == 0, z3.And(pages == 0, last == 0)),
        z3.Implies(n > 0, z3.And((pages - 1) * ps + last == n, last >= 1, last <= ps)),
        *[z3.And(x >= INT32_MIN, x <= INT32_MAX) for x in rec.values],
    )


def _csr_bv(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
    _csr_setup(rec, ops, hyp)
    return None


# -- element offsets -----------------------------------------------------------------------


def _offset_setup(
    rec: _Recorder,
    ops: _SymOps,
    hyp: list[Any],
    layout: im.Layout,
    contiguous: bool,
    with_slot: bool,
) -> dict[str, Any]:
    np_ = rec.var("num_pages", *_range("num_blocks"), hyp)
    ps = rec.var("page_size", *_range("block_size"), hyp)
    heads = rec.var("num_kv_heads", *_range("num_kv_heads"), hyp)
    dim = rec.var("head_dim", *_range("head_dim"), hyp)
    shape = [np_, ps, heads, dim] if layout == "NHD" else [np_, heads, ps, dim]
    if contiguous:
        s3 = 1
        s2 = shape[3]
        s1 = shape[2] * shape[3]
        s0 = shape[1] * s1
        strides: list[Any] = [s0, s1, s2, s3]
    else:  # any non-negative strides (views from unbind, padded rows...)
        strides = [rec.var(f"stride{i}", 0, 2**40, hyp) for i in range(4)]
    page = rec.var("page", 0, _range("num_blocks")[1], hyp)
    tok = rec.var("token", 0, _range("block_size")[1], hyp)
    head = rec.var("head", 0, _range("num_kv_heads")[1], hyp)
    lane = rec.var("lane", 0, _range("head_dim")[1], hyp)
    hyp += [_lt(rec, page, np_), _lt(rec, tok, ps), _lt(rec, head, heads), _lt(rec, lane, dim)]
    ordered = im.cache_strides(strides, layout)
    off = im.cache_element_offset(page, tok, head, lane, ordered)
    out = {"shape": shape, "strides": strides, "off": off}
    if with_slot:
        slot = rec.var("slot", 0, _range("num_blocks")[1] * _range("block_size")[1], hyp)
        _int_only(rec, hyp, lambda: _u(slot) < _u(np_) * _u(ps))
        # the split lemma (KERNEL-OFFSET split_slot, proved on its own): the write kernel's
        # (page, token) of a slot in the pool are in range
        hyp += [_u(slot) / _u(ps) < _u(np_), _u(slot) % _u(ps) < _u(ps)]
        out["slot_off"] = im.slot_element_offset(slot, head, lane, ps, ordered, ops)
    return out


def _offset_int(layout: im.Layout) -> Callable[[_Recorder, _SymOps, list[Any]], Any]:
    def claim(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
        v = _offset_setup(rec, ops, hyp, layout, contiguous=False, with_slot=True)
        arith = [x for x, k in zip(rec.values, rec.kinds, strict=True) if k in "+-*"]
        top = im_sym.max_element_offset(v["shape"], v["strides"])  # the launcher's bound
        # Every sum and product of both offset formulas lies in [0, max_element_offset],
        # and the launcher uses int32 only when max_element_offset + 1 <= INT32_MAX.
        return z3.And(
            *[z3.And(x >= 0, x <= _u(top)) for x in arith],
            _u(v["off"]) <= _u(top),
            _u(v["slot_off"]) <= _u(top),
        )

    return claim


def _offset_bv(layout: im.Layout) -> Callable[[_Recorder, _SymOps, list[Any]], Any]:
    def claim(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
        # slot_element_offset is cache_element_offset of split_slot's (page, token), which
        # the split lemma puts in the same ranges as the indices here
        _offset_setup(rec, ops, hyp, layout, contiguous=True, with_slot=False)
        return None

    return claim


def _split_int(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
    np_ = rec.var("num_pages", *_range("num_blocks"), hyp)
    ps = rec.var("page_size", *_range("block_size"), hyp)
    slot = rec.var("slot", 0, _range("num_blocks")[1] * _range("block_size")[1], hyp)
    hyp.append(_u(slot) < _u(np_) * _u(ps))
    page, tok = im.split_slot(slot, ps, ops)
    return z3.And(_u(page) >= 0, _u(page) < _u(np_), _u(tok) >= 0, _u(tok) < _u(ps))


# -- conv state -----------------------------------------------------------------------------


def _conv(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
    width = rec.var("width", *_range("conv_width"), hyp)
    new_len = rec.var("new_len", *_range("num_tokens"), hyp)
    q_start = rec.var("q_start", 0, _range("num_tokens")[1], hyp)
    num_tokens = rec.var("num_tokens", *_range("num_tokens"), hyp)
    j = rec.var("j", 0, _range("conv_width")[1], hyp)
    keep = width - 1
    hyp += [_lt(rec, j, keep), _le(rec, q_start + new_len, num_tokens)]
    from_old, old_idx, new_idx = im.conv_state_source(j, new_len, width, ops)
    src = q_start + new_idx
    c = rec.lift(new_len) + rec.lift(j)  # element c of concat(old_state, new_inputs)
    k, o, n, s = rec.lift(keep), rec.lift(old_idx), rec.lift(new_idx), rec.lift(src)
    lt, le = (z3.ULT, z3.ULE)
    return z3.And(
        lt(o, k),  # both gather indices are always in bounds
        z3.Implies(from_old, z3.And(o == c, lt(c, k))),  # the old state's tail, shifted
        z3.Implies(
            z3.Not(from_old),
            z3.And(n == c - k, lt(n, rec.lift(new_len)), lt(s, rec.lift(num_tokens))),
        ),
        # a prefill shorter than the window keeps keep - new_len old entries
        z3.Implies(lt(rec.lift(new_len), k), from_old == lt(rec.lift(j), k - rec.lift(new_len))),
        le(rec.lift(new_len), c),
    )


def _conv_bv(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
    claim = _conv(rec, ops, hyp)
    return z3.And(claim, *rec.safety)


# -- recurrent-state slot runs --------------------------------------------------------------


def _run_int(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
    slots = rec.var("num_state_slots", *_range("num_state_slots"), hyp)
    numel = rec.var("slot_numel", 1, 2**24, hyp)
    stride = rec.var("slot_stride", 1, 2**25, hyp)
    start = rec.var("run_start", 0, _range("num_state_slots")[1], hyp)
    length = rec.var("run_length", 1, _range("num_state_slots")[1], hyp)
    elem = rec.var("elem", 0, 2**44, hyp)
    hyp += [
        _u(stride) >= _u(numel),
        _u(start) + _u(length) <= _u(slots),
        _u(elem) < _u(length) * _u(numel),
    ]
    # the division lemma (KERNEL-RUN elem // numel, proved on its own)
    hyp.append(_u(elem) / _u(numel) < _u(length))
    off = im_sym.run_element(start, elem, numel, stride, ops)
    slot = _u(start) + _u(elem) / _u(numel)
    top = im_sym.max_element_offset([slots, numel], [stride, 1])
    return z3.And(slot < _u(slots), _u(off) >= 0, _u(off) <= _u(top))


def _run_div_int(rec: _Recorder, ops: _SymOps, hyp: list[Any]) -> Any:
    numel = rec.var("slot_numel", 1, 2**24, hyp)
    length = rec.var("run_length", 1, _range("num_state_slots")[1], hyp)
    elem = rec.var("elem", 0, 2**44, hyp)
    hyp.append(_u(elem) < _u(length) * _u(numel))
    return z3.And(ops.div(elem, numel).e < _u(length), ops.mod(elem, numel).e < _u(numel))


KERNEL_OBLIGATIONS: tuple[KernelObligation, ...] = (
    KernelObligation("KERNEL-SLOT", "slot_for_position", "int", _slot_int),
    KernelObligation("KERNEL-SLOT", "slot_for_position", "bv32", _safety(_slot_bv)),
    KernelObligation("KERNEL-PAGES", "page_table_entry", "int", _pages_int),
    KernelObligation("KERNEL-PAGES", "page_table_entry", "bv32", _safety(_pages_bv)),
    KernelObligation(
        "KERNEL-PAGES",
        "converting twice changes slots",
        "int",
        _pages_twice,
        expect="counterexample",
        note="converting a converted table changes slots (why a second conversion must raise)",
    ),
    KernelObligation("KERNEL-CSR", "num_pages/last_page_len", "int", _csr_int),
    KernelObligation("KERNEL-CSR", "num_pages/last_page_len", "bv32", _safety(_csr_bv)),
    KernelObligation("KERNEL-OFFSET", "split_slot", "int", _split_int),
    KernelObligation("KERNEL-OFFSET", "cache_element_offset NHD", "int", _offset_int("NHD")),
    KernelObligation("KERNEL-OFFSET", "cache_element_offset HND", "int", _offset_int("HND")),
    KernelObligation(
        "KERNEL-OFFSET", "cache_element_offset NHD", "bv64", _safety(_offset_bv("NHD"))
    ),
    KernelObligation(
        "KERNEL-OFFSET", "cache_element_offset HND", "bv64", _safety(_offset_bv("HND"))
    ),
    KernelObligation(
        "KERNEL-OFFSET",
        "int32 offsets can overflow",
        "bv32",
        _safety(_offset_bv("NHD")),
        expect="counterexample",
        note="int32 offsets overflow for some supported cache (why int64 exists)",
    ),
    KernelObligation("KERNEL-CONV", "conv_state_source", "bv32", _conv_bv),
    KernelObligation("KERNEL-RUN", "elem // slot_numel", "int", _run_div_int),
    KernelObligation("KERNEL-RUN", "run_element", "int", _run_int),
)


_SEED_RETRIES = 4
"""Solver calls (seeds ``seed .. seed + 3``) before an obligation is reported ``unknown``."""


def run_obligation(ob: KernelObligation, rlimit: int, seed: int) -> KernelResult:
    """Prove one kernel obligation (with its non-vacuity check)."""
    t0 = time.perf_counter()
    mode = "int" if ob.method == "int" else "bv"
    width = {"int": 0, "bv32": 32, "bv64": 64}[ob.method]
    rec = _Recorder(mode, width, signed=ob.method != "bv64")
    ops = _SymOps(rec)
    hyp: list[Any] = []
    claim = ob.build(rec, ops, hyp)
    # NOTE: nonlinear integer goals (``ceil(n / ps) * ps >= n``) are sensitive to the terms
    # already hash-consed in the process-wide Z3 context, so a goal that is proved in 0.1 s
    # alone can exhaust the budget after other proofs ran. An ``unsat`` under any seed is a
    # proof, so an ``unknown`` is retried under a few more seeds before it is reported.
    used = 0
    for attempt in range(_SEED_RETRIES):
        s = z3.Solver()
        s.set("rlimit", rlimit, "random_seed", seed + attempt)
        s.add(*hyp, z3.Not(claim))
        before = _rlimit_count(s)
        r = s.check()
        used += _rlimit_count(s) - before
        if r != z3.unknown:
            break
    # non-vacuity: the hypotheses (supported ranges, in-range indices) have a model
    v = z3.Solver()
    v.set("rlimit", rlimit, "random_seed", seed)
    v.add(*hyp)
    non_vacuous = v.check() == z3.sat
    dt = time.perf_counter() - t0
    result = _verdict(ob, r, s, dt, non_vacuous)
    result.rlimit_used = used
    return result


def _rlimit_count(s: z3.Solver) -> int:
    st = s.statistics()
    return int(st.get_key_value("rlimit count")) if "rlimit count" in st.keys() else 0  # noqa: SIM118


def _verdict(
    ob: KernelObligation, r: Any, s: z3.Solver, dt: float, non_vacuous: bool
) -> KernelResult:
    if ob.expect == "counterexample":
        if r == z3.sat:
            m = s.model()
            return KernelResult(
                ob.invariant,
                ob.function,
                ob.method,
                "proved",
                dt,
                f"{ob.note}, e.g. " + _model_str(m),
                non_vacuous,
            )
        return KernelResult(
            ob.invariant,
            ob.function,
            ob.method,
            "unknown" if r == z3.unknown else "counterexample",
            dt,
            f"expected a counterexample: {ob.note}",
            non_vacuous,
        )
    if r == z3.unsat:
        return KernelResult(
            ob.invariant, ob.function, ob.method, "proved", dt, ob.note, non_vacuous
        )
    if r == z3.sat:
        return KernelResult(
            ob.invariant,
            ob.function,
            ob.method,
            "counterexample",
            dt,
            _model_str(s.model()),
            non_vacuous,
        )
    return KernelResult(
        ob.invariant, ob.function, ob.method, "unknown", dt, s.reason_unknown(), non_vacuous
    )


def _model_str(m: z3.ModelRef) -> str:
    items = sorted((str(d), m[d]) for d in m.decls() if d.arity() == 0)
    return ", ".join(f"{k}={v}" for k, v in items)


def prove_kernels(rlimit: int = 30_000_000, seed: int = 0) -> list[KernelResult]:
    """Every kernel obligation, in order."""
    return [run_obligation(ob, rlimit, seed) for ob in KERNEL_OBLIGATIONS]


# -- broken kernel arithmetic ---------------------------------------------------------------


@dataclass(frozen=True)
class KernelVariant:
    """A deliberately wrong index function (or a wider size claim) and the obligation it
    must break."""

    name: str
    description: str
    function: str
    method: str
    patch: Callable[[], contextlib.AbstractContextManager[Any]]
    """A context manager factory that installs the bug."""


_Patch = Callable[[], contextlib.AbstractContextManager[Any]]


def _patch(attr: str, fn: Callable[..., Any]) -> _Patch:
    return lambda: mock.patch.object(im, attr, fn)


def _widen(name: str, high: int) -> _Patch:
    r = im.SUPPORTED_RANGES[name]
    return lambda: mock.patch.dict(
        im.SUPPORTED_RANGES, {name: im.SizeRange(name, r.low, high, r.note)}
    )


def _conv_no_clamp(j: Any, new_len: Any, width: Any, ops: Any = im.PY_OPS) -> Any:
    keep = width - 1
    c = new_len + j
    return ops.lt(c, keep), c, c - keep  # BUG: the unused index is not clamped


def _last_page_off_by_one(seq_len: Any, page_size: Any, ops: Any = im.PY_OPS) -> Any:
    return ops.ite(ops.lt(0, seq_len), ops.mod(seq_len, page_size) + 1, seq_len * 0)  # BUG


KERNEL_VARIANTS: tuple[KernelVariant, ...] = (
    KernelVariant(
        "slot-without-offset",
        "slot = block * block_size (offset dropped)",
        "slot_for_position",
        "int",
        _patch("slot_from_block", lambda block_id, offset, bs: block_id * bs),
    ),
    KernelVariant(
        "page-ratio-twice",
        "a block's pages scaled by the ratio twice",
        "page_table_entry",
        "int",
        _patch("page_of_block", lambda b, sub, r: b * r * r + sub),
    ),
    KernelVariant(
        "last-page-off-by-one",
        "kv_last_page_len = len % page + 1",
        "num_pages/last_page_len",
        "int",
        _patch("last_page_len", _last_page_off_by_one),
    ),
    KernelVariant(
        "conv-no-clamp",
        "the conv gather's unused index is not clamped",
        "conv_state_source",
        "bv32",
        _patch("conv_state_source", _conv_no_clamp),
    ),
    KernelVariant(
        "pool-of-2**24-pages",
        "claiming 2**24 pages of 256 tokens (slots overflow int32)",
        "slot_for_position",
        "bv32",
        _widen("num_blocks", 2**24),
    ),
)


def check_kernel_variant(v: KernelVariant, rlimit: int = 30_000_000) -> KernelResult:
    """Run the variant's obligation with the bug patched in; it must not be proved."""
    (ob,) = [
        o
        for o in KERNEL_OBLIGATIONS
        if o.function == v.function and o.method == v.method and o.expect == "proved"
    ]
    with v.patch():
        return run_obligation(ob, rlimit, 0)


# -- the suite ------------------------------------------------------------------------------


def _suite_obligations(sel: Selection) -> Part:
    results: list[KernelResult] = []
    if not sel.opts.no_kernels:
        for ob in KERNEL_OBLIGATIONS:
            res = run_obligation(ob, sel.opts.rlimit, sel.opts.seed)
            results.append(res)
            sel.show(
                res.invariant,
                f"{res.function} [{res.method}]",
                res.status,
                res.seconds,
                "index_math",
            )
    proved = sum(k.status == "proved" for k in results)
    return Part(
        all(k.status == "proved" and k.non_vacuous for k in results),
        {"kernel": [k.as_dict() for k in results]},
        [f"{proved}/{len(results)} kernel obligations proved"],
    )


def _suite_broken(sel: Selection) -> list[BrokenRow]:
    # NOTE: the kernel variants run with the KV invariants, not with --no-kernels:
    # '--invariants INV-CKPT --broken' checks the checkpoint variants only
    if not sel.invariants_of(PROPERTY_IDS):
        return []
    return [
        {
            "name": v.name,
            "invariant": "KERNEL",
            "step": v.function,
            "kind": "kernel",
            "description": v.description,
            "caught": k.status != "proved",
            "seconds": round(k.seconds, 3),
            "counterexample": k.detail,
        }
        for v in KERNEL_VARIANTS
        for k in [check_kernel_variant(v, sel.opts.rlimit)]
    ]


SUITE = ProofSuite(
    name="KERNEL",
    invariants=(),
    operations=(),
    obligations=_suite_obligations,
    broken=_suite_broken,
)
"""The kernels' index arithmetic (``--no-kernels`` skips the obligations)."""
