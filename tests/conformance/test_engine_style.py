"""The conformance kit against an independent, engine-style block manager.

The correct manager must pass in the policy-agnostic mode; each classic bug must fail with
the right check and a replay of at most 15 steps that, run as a program, reproduces it.
"""

from __future__ import annotations

from typing import Any

import pytest
from prefixkv.spec import invariants

from examples import engine_style
from examples.engine_style import BUGS, make_manager
from prefixkv.conformance import (
    Capabilities,
    ConformanceFailure,
    capabilities_of,
    load_factory,
    run_conformance,
)
from prefixkv.conformance.reference_adapters import impl_adapter, spec_adapter

# The CI profile is derandomized, so these runs are the same on every machine; a failing
# run stops at its first failure, so only the correct managers pay for all the examples.
_EXAMPLES = 150
_BUG_EXAMPLES = 100
_STEPS = 30

#: bug -> the checks that may catch it first (the derandomized search's first failure can
#: move between Hypothesis releases; a batch that frees one block twice either corrupts a
#: refcount or crashes the manager's own bookkeeping).
_EXPECTED = {
    "stale_hash_after_reuse": {"INV-INDEX"},
    "hit_verified_on_own_block": {"INV-MATCH"},
    "can_admit_ignores_hits": {"CAN-ADMIT"},
    "double_free_in_batch": {"INV-REF", "CRASH(double_free)"},
}


def _run(factory: Any, caps: Capabilities | None = None, examples: int = _EXAMPLES) -> Any:
    return run_conformance(
        factory, caps, max_examples=examples, steps=_STEPS, profile="ci", max_failures=1
    )


def test_every_bug_has_an_expected_check() -> None:
    assert set(_EXPECTED) == set(BUGS)


def test_the_correct_manager_passes() -> None:
    report = _run(make_manager)
    assert report.rules > 100 and report.operations > report.rules


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_classic_bug_fails_with_a_short_replay(bug: str) -> None:
    factory = getattr(engine_style, f"make_{bug}")
    with pytest.raises(ConformanceFailure) as info:
        _run(factory, examples=_BUG_EXAMPLES)
    failure = info.value
    assert failure.check in _EXPECTED[bug], str(failure)
    assert failure.steps <= 15, str(failure)
    text = str(failure)
    assert "minimal replay" in text and "cache = make(num_blocks=" in text
    if failure.check.startswith("INV-"):
        _replay_reproduces(factory, failure)


def _replay_reproduces(factory: Any, failure: ConformanceFailure) -> None:
    """The replay is a program: run against the buggy manager, it ends in the state (or
    the match) that breaks the invariant the machines named."""
    scope: dict[str, Any] = {"make": factory}
    *setup, last = failure.calls
    exec("\n".join(setup), scope)
    call = last.split("  #")[0]
    if failure.check == "INV-MATCH":
        assert call.startswith("cache.match("), last
        req = eval(call.removeprefix("cache.match(")[:-1], scope)
        with pytest.raises(invariants.InvariantViolation, match="INV-MATCH"):
            invariants.check_match(scope["cache"], req, scope["cache"].match(req))
        return
    exec(call, scope)
    found = {v.invariant for v in invariants.violations(scope["cache"].snapshot())}
    assert failure.check in found, (failure.check, found)


def test_exact_mode_is_stricter_than_the_safety_mode() -> None:
    """The engine-style manager evicts FIFO, the spec LRU: correct, but not the spec."""
    exact = Capabilities.parse("+exact", capabilities_of(make_manager))
    with pytest.raises(ConformanceFailure) as info:
        _run(make_manager, exact)
    assert info.value.check.startswith(("DIFF", "STATE")), info.value.check


def test_prefixkv_impl_conforms_exactly() -> None:
    assert _run(impl_adapter, examples=15).rules > 0


def test_the_spec_keeps_its_invariants_alone() -> None:
    assert _run(spec_adapter, Capabilities(exact=False), examples=15).rules > 0


def test_a_factory_lacking_operations_is_told_which() -> None:
    def make(num_blocks: int, block_size: int, *, record_events: bool) -> Any:
        return object()

    with pytest.raises(TypeError, match="lacks num_blocks"):
        _run(make, Capabilities(exact=False), examples=1)


@pytest.mark.parametrize("target", ["no_colon", "prefixkv.spec:", ":make", "prefixkv.spec:HASHERS"])
def test_load_factory_rejects_bad_targets(target: str) -> None:
    with pytest.raises(ValueError):
        load_factory(target)


def test_capabilities_parse() -> None:
    caps = Capabilities.parse("-multimodal, +exact,chunked-prefill")
    assert (caps.multimodal, caps.exact, caps.chunked_prefill) == (False, True, True)
    with pytest.raises(ValueError, match="unknown capability 'multimodl'"):
        Capabilities.parse("-multimodl")
