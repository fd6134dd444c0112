"""The random spec calls the drift check draws: :class:`SpecCall` (one operation with its
arguments), the calls on a reachable cache (:func:`random_call`, which shares prefixes with
earlier requests) and on a sampled state (:func:`random_call_for`), and where each live
sequence sits among the model's slots (:func:`slots_for`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prefixkv.spec import Namespace, Request, SpecCache
from prefixkv.spec.request import SeqId

from .concrete import AbsState, Labels

__all__ = ["SpecCall", "Trace", "random_call", "random_call_for", "slots_for"]


@dataclass(frozen=True)
class SpecCall:
    """One spec operation with its arguments, as a test would call it."""

    op: str
    seq_ids: tuple[SeqId, ...] = ()
    request: Request | None = None
    num_new: int | None = None
    n: int = 0
    accepted: tuple[int, ...] = ()

    def run(self, cache: SpecCache) -> Any:
        if self.op == "admit":
            assert self.request is not None
            return cache.admit(self.request, self.num_new)
        if self.op == "append":
            return cache.append(self.seq_ids[0], self.n)
        if self.op == "continue_prefill":
            return cache.continue_prefill(self.seq_ids[0], self.num_new)
        if self.op == "commit":
            return cache.commit(self.seq_ids[0], self.n, self.accepted)
        if self.op == "rollback":
            return cache.rollback(self.seq_ids[0], self.n)
        if self.op == "free":
            return cache.free(list(self.seq_ids))
        if self.op == "evict":
            return cache.evict(self.n)
        if self.op == "reset_keep":
            return cache.reset(preserve_cache=True)
        if self.op == "reset_full":
            return cache.reset(preserve_cache=False)
        raise ValueError(self.op)

    def __str__(self) -> str:
        if self.op == "admit":
            assert self.request is not None
            rb, lim = self.request.recompute_blocks, self.request.kv_token_limit
            return (
                f"admit({self.request.seq_id!r}, tokens={list(self.request.token_ids)}, "
                f"num_new_tokens={self.num_new}"
                + (f", recompute_blocks={rb}" if rb else "")
                + (f", kv_token_limit={lim})" if lim else ")")
            )
        if self.op == "continue_prefill":
            return f"continue_prefill({self.seq_ids[0]!r}, {self.num_new})"
        if self.op == "commit":
            return f"commit({self.seq_ids[0]!r}, {self.n}, accepted={list(self.accepted)})"
        if self.op in ("append", "rollback"):
            return f"{self.op}({self.seq_ids[0]!r}, {self.n})"
        if self.op == "free":
            return f"free({list(self.seq_ids)!r})"
        if self.op == "evict":
            return f"evict({self.n})"
        return "reset(preserve_cache=True)" if self.op == "reset_keep" else "reset(False)"


@dataclass
class Trace:
    cache: SpecCache
    labels: Labels
    next_id: int = 0


def slots_for(cache: SpecCache, call: SpecCall, S: int, rng: random.Random) -> list[SeqId | None]:
    """Place live sequences in slots. The model releases a batch in slot order, so a freed
    batch takes the first slots in the order listed (``reset_keep`` frees every live
    sequence in admission order). Otherwise the slots are rotated at random, so every slot
    gets exercised."""
    live = list(cache.seq_ids())
    first: list[SeqId] = []
    if call.op == "free":
        first = [s for s in call.seq_ids if s in live]
    elif call.seq_ids and call.seq_ids[0] in live:
        first = [call.seq_ids[0]]
    rest = [s for s in live if s not in first]
    slots: list[SeqId | None] = [*first, *rest] + [None] * (S - len(live))
    if call.op not in ("free", "reset_keep"):
        r = rng.randrange(S)
        slots = slots[r:] + slots[:r]
    if call.op == "admit":
        assert call.request is not None
        sid = call.request.seq_id
        if sid not in slots and None in slots:
            slots[slots.index(None)] = sid  # the slot the new sequence will take
    return slots


def random_call(
    cache: SpecCache,
    rng: random.Random,
    M: int,
    S: int,
    trace: Trace,
    namespaces: Sequence[Namespace],
) -> SpecCall:
    bs = cache.block_size
    live = list(cache.seq_ids())
    s = cache._s
    ops = ["admit"] * 6 + ["commit"] * 6 + ["append"] * 3 + ["rollback"] * 2 + ["free"] * 2
    ops += ["evict"] * 2 + ["reset_keep", "reset_full"] + ["continue_prefill"] * 3
    while True:
        op = rng.choice(ops)
        if op == "admit":
            if len(live) >= S:
                continue
            ntok = rng.randint(1, M * bs)
            base = rng.choice(
                [(0, 1, 0, 1, 1, 0, 0, 1, 0, 0, 1, 1), (0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 0, 0)]
            )
            toks = list(base[:ntok])
            if rng.random() < 0.3 and toks:
                toks[rng.randrange(len(toks))] = 2
            sid: SeqId = trace.next_id if rng.random() < 0.9 or not live else rng.choice(live)
            trace.next_id += 1
            req = Request(
                sid,
                toks,
                rng.choice(namespaces),
                recompute_blocks=rng.choice((0, 0, 1, 1, 2, 3)),
                kv_token_limit=rng.choice((None, None, None, 1, 2, bs, 2 * bs)),
            )
            num_new = (
                None if rng.random() < 0.6 else rng.randint(0 if rng.random() < 0.05 else 1, ntok)
            )
            return SpecCall("admit", request=req, num_new=num_new)
        if op == "free":
            k = rng.randint(0, len(live))
            ids = rng.sample(live, k)
            if rng.random() < 0.05 and len(live) < S:
                ids.append(10_000 + rng.randrange(5))  # unknown
            return SpecCall("free", seq_ids=tuple(ids))
        if op == "evict":
            return SpecCall("evict", n=rng.choice([0, 1, 1, 1, 2, 3]))
        if op in ("reset_keep", "reset_full"):
            return SpecCall(op)
        if not live:
            continue
        sid = rng.choice(live)
        sq = s.seqs[sid]
        if op == "continue_prefill":
            ready = [
                x
                for x in live
                if s.seqs[x].num_computed == s.seqs[x].num_reserved < s.seqs[x].prompt_len
            ]
            if ready and rng.random() < 0.8:
                sid = rng.choice(ready)
            num_new = None if rng.random() < 0.5 else rng.randint(1, 2 * bs)
            return SpecCall("continue_prefill", seq_ids=(sid,), num_new=num_new)
        if op == "append":
            room = M * bs - sq.num_reserved
            if room < 1:
                continue
            return SpecCall("append", seq_ids=(sid,), n=rng.randint(1, room))
        if op == "rollback":
            unwritten = sq.num_reserved - sq.num_computed
            n = rng.randint(1, max(1, unwritten + (1 if rng.random() < 0.15 else 0)))
            return SpecCall("rollback", seq_ids=(sid,), n=n)
        # commit
        unwritten = sq.num_reserved - sq.num_computed
        n = rng.randint(0, unwritten + (1 if rng.random() < 0.1 else 0))
        acc = tuple(rng.choice((0, 1, 2)) for _ in range(rng.choice((0, 1, 1, 2))))
        return SpecCall("commit", seq_ids=(sid,), n=n, accepted=acc)


def random_call_for(
    a: AbsState, slots: list[SeqId | None], labels: Labels, rng: random.Random, M: int, S: int
) -> SpecCall:
    """A random operation on a sampled state (shares prefixes with the state's sequences)."""
    live = [sid for sid in slots if sid is not None]
    bs = a.bs
    ops = [
        "commit",
        "commit",
        "append",
        "continue_prefill",
        "rollback",
        "free",
        "evict",
        "reset_keep",
        "reset_full",
    ]
    op = rng.choice(ops + (["admit", "admit"] if None in slots else []))
    if op == "admit":
        # reuse a live sequence's prefix (or a published chain) to make hits likely
        toks: list[int] = []
        ns = labels.namespace_of(rng.choice((0, 1)))
        pub_blocks = [b for b in range(a.n) if a.pub[b]]
        if pub_blocks and rng.random() < 0.7:
            b = rng.choice(pub_blocks)
            chain = []
            while b != -1:
                chain.append(b)
                b = a.par[b]
            for c in reversed(chain):
                toks.extend(labels.tokens_of(a.btok[c], bs))
            ns = labels.namespace_of(a.bns[chain[0]])
        toks.extend(rng.choice((0, 1)) for _ in range(rng.randint(1 if not toks else 0, bs)))
        toks = toks[: M * bs]
        req = Request(
            f"new{rng.randrange(99)}",
            toks,
            ns,
            recompute_blocks=rng.choice((0, 0, 1, 1, 2)),
            kv_token_limit=rng.choice((None, None, 1, bs)),
        )
        return SpecCall(
            "admit", request=req, num_new=None if rng.random() < 0.6 else rng.randint(1, len(toks))
        )
    if op == "free":  # the model releases a batch in slot order
        ids = sorted(rng.sample(live, rng.randint(0, len(live))), key=slots.index)
        return SpecCall("free", seq_ids=tuple(ids))
    if op == "evict":
        return SpecCall("evict", n=rng.choice([1, 1, 2, 3]))
    if op in ("reset_keep", "reset_full"):
        return SpecCall(op)
    if not live:
        return SpecCall("evict", n=1)
    slot = rng.choice([i for i, sid in enumerate(slots) if sid is not None])
    sq = a.seqs[slot]
    assert sq is not None
    sid = slots[slot]
    assert sid is not None
    if op == "append":
        return SpecCall("append", seq_ids=(sid,), n=rng.randint(1, max(1, M * bs - sq.nr)))
    if op == "continue_prefill":
        return SpecCall(
            "continue_prefill",
            seq_ids=(sid,),
            num_new=None if rng.random() < 0.5 else rng.randint(1, 2 * bs),
        )
    if op == "rollback":
        return SpecCall("rollback", seq_ids=(sid,), n=rng.randint(1, max(1, sq.nr - sq.nc + 1)))
    acc = tuple(rng.choice((0, 1)) for _ in range(rng.choice((0, 1, 2))))
    return SpecCall("commit", seq_ids=(sid,), n=rng.randint(0, max(0, sq.nr - sq.nc)), accepted=acc)
