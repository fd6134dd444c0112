"""Multimodal spans in Z3: INV-LIMIT's and INV-MATCH's span parts are inductive, not
vacuous, able to fail, and in step with :class:`SpecCache`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

pytest.importorskip("z3")

import z3
from prefixkv.proofs import small
from prefixkv.proofs import spans as sp
from prefixkv.proofs.driver import DriftError
from prefixkv.proofs.spans import drift as span_drift
from prefixkv.proofs.spans import seeded as span_seeded
from prefixkv.spec import MultimodalSpan, Namespace, Request, SpecCache
from prefixkv.spec import cache as spec_cache
from prefixkv.spec import contract as spec_contract
from prefixkv.spec.multimodal import span_containing

DRIFT_CHECKS = 1500


@pytest.fixture(scope="module")
def run() -> small.ModelRun:
    return small.prove_all(sp.SpanModel())


def test_every_span_obligation_is_proved(
    run: small.ModelRun, unproved: Callable[[Iterable[Any]], str]
) -> None:
    assert unproved(run.rows) == ""
    got = {(r.invariant, r.operation) for r in run.rows}
    for op in sp.SPAN_OPERATIONS:
        assert {(p, op) for p in ("SPAN-LIMIT", "SPAN-CHUNK", "SPAN-MATCH", "SPAN-SHAPE")} <= got
    assert {
        ("MATCH-CLAMP", "admit"),
        ("CHUNK-END", "admit"),
        ("CHUNK-END", "continue_prefill"),
    } <= got
    assert {("SPLIT-REFUSED", "append"), ("SPLIT-REFUSED", "rollback")} <= got


def test_every_span_operation_is_non_vacuous(run: small.ModelRun) -> None:
    assert set(run.witnesses) == set(sp.SPAN_OPERATIONS) - {"init"}
    assert {op: w[1] for op, w in run.witnesses.items()} == dict.fromkeys(run.witnesses, "sat")
    assert all(r.non_vacuous for r in run.rows if r.operation != "init")
    # the admission witness has two spans and a clamp that loops twice
    assert run.witnesses["admit"][2].count("[") >= 4


@pytest.mark.parametrize("variant", sp.SPAN_VARIANTS, ids=lambda v: v.name)
def test_broken_span_variant_yields_a_counterexample(variant: small.Variant) -> None:
    res = small.check_variant(variant)
    assert res.caught, f"{variant.name}: {res.row.status}"
    assert "step:" in res.row.detail


def test_the_clamp_is_the_specs_on_concrete_values() -> None:
    """The model's clamp loop, on numbers, is ``clamp_out_of_spans`` (both spans, every k)."""
    m = sp.SpanModel(block_size=2)
    spans = [MultimodalSpan(1, 3, "image", b"a"), MultimodalSpan(3, 5, "image", b"b")]
    on = (z3.BoolVal(True), z3.BoolVal(True))
    st = tuple(z3.IntVal(s.start) for s in spans)
    en = tuple(z3.IntVal(s.end) for s in spans)
    for k in range(m.M + 1):
        got = z3.simplify(m.clamp(z3.IntVal(k), on, st, en)).as_long()
        assert got == spec_cache.clamp_out_of_spans(k, spans, 2), k


def test_the_spans_are_not_trivially_satisfied() -> None:
    """A sequence reserved up to the middle of a span while prefilling is excluded."""
    m = sp.SpanModel()
    x = m.fresh("x.")
    s = z3.Solver()
    s.add(m.inv(x), x.live, x.on[0], x.st[0] < x.R, x.en[0] > x.R, x.R <= x.P, x.C < x.P)
    assert s.check() == z3.unsat
    s = z3.Solver()
    s.add(m.inv(x), x.live, x.on[0], x.on[1], x.C < x.P)
    assert s.check() == z3.sat


# -- drift against SpecCache ----------------------------------------------------------------


def test_no_span_drift() -> None:
    rep = span_drift.run_span_drift(DRIFT_CHECKS, seed=1)
    assert rep.checks >= DRIFT_CHECKS
    # every span case occurs: clamped matches, chunks cut by a span, refused splits
    assert rep.clamped > 0 and rep.chunk_cuts > 0 and rep.split_refusals > 0
    assert set(rep.by_op) == set(sp.SPAN_OPERATIONS) - {"init"}
    assert rep.successes > 0 and rep.rejections > 0


@pytest.mark.parametrize("seeded", span_seeded.SEEDED_SPAN_DRIFTS, ids=lambda s: s[0])
def test_seeded_span_drift_is_caught(seeded: tuple[str, str, type[sp.SpanModel]]) -> None:
    name, description, model = seeded
    assert span_seeded.check_seeded_span(name, description, model).caught


def test_a_drifted_spec_chunk_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Drift on the spec's side: a chunk that ends inside a span runs on to the span's end
    even when it does not start there (over the limit)."""

    def forward(
        start: int, prompt_len: int, budget: int | None, limit: int | None, spans: object
    ) -> int:
        end = prompt_len
        if budget is not None:
            end = min(end, start + budget)
        if limit is not None:
            end = min(end, start + limit)
        cut = span_containing(spans, end)  # type: ignore[arg-type]
        return end if cut is None else cut.end

    monkeypatch.setattr(spec_contract, "chunk_end", forward)  # the spec calls it by module
    with pytest.raises(DriftError):
        span_drift.run_span_drift(3000, seed=0)


def test_drift_reads_admissions_raw_match() -> None:
    """The raw match is recovered from ``Match``: attached + window + span loss."""
    ns = Namespace("span-proofs@1")
    cache = SpecCache(num_blocks=10, block_size=2)
    spans = (MultimodalSpan(1, 3, "image", b"cat"), MultimodalSpan(3, 5, "image", b"dog"))
    cache.admit(Request("a", [1, 2, 1, 2, 1, 2], ns, spans=spans))
    cache.commit("a", 6)
    m = cache.match(Request("b", [1, 2, 1, 2, 1, 2], ns, spans=spans))
    assert m.num_blocks == 0 and m.lost.span == 4  # 2 blocks matched, clamped twice to 0
