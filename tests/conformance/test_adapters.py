"""The adapter declaration: ``@adapter(capabilities=...)`` and the ``AdapterFactory`` protocol."""

from __future__ import annotations

from typing import Any

import pytest
from prefixkv.spec import SpecCache

from examples.engine_style import CAPABILITIES, EngineStyleManager, make_manager
from prefixkv.conformance import (
    AdapterFactory,
    Capabilities,
    DeclaredAdapter,
    adapter,
    capabilities_of,
    conformance_machine,
    load_factory,
    run_conformance,
)
from prefixkv.conformance.adapters import as_factory
from prefixkv.conformance.reference_adapters import hybrid_impl_adapter, impl_adapter


def test_the_decorator_declares_and_still_builds() -> None:
    @adapter(capabilities=Capabilities(exact=False, multimodal=False))
    def make(num_blocks: int, block_size: int, *, record_events: bool) -> SpecCache:
        """A docstring."""
        return SpecCache(num_blocks, block_size, record_events=record_events)

    assert isinstance(make, DeclaredAdapter) and isinstance(make, AdapterFactory)
    assert make.capabilities == Capabilities(exact=False, multimodal=False)
    assert make(6, 2, record_events=False).num_blocks == 6
    assert make.__name__ == "make" and make.__doc__ == "A docstring."
    assert capabilities_of(make, "+multimodal").multimodal
    assert make.with_capabilities(Capabilities()).capabilities.exact
    assert not make.capabilities.exact  # redeclaring makes a new factory


def test_bare_decorator_and_plain_functions_declare_prefixkv_s_own() -> None:
    @adapter
    def make(num_blocks: int, block_size: int, *, record_events: bool) -> SpecCache:
        return SpecCache(num_blocks, block_size)

    def plain(num_blocks: int, block_size: int, *, record_events: bool) -> SpecCache:
        return SpecCache(num_blocks, block_size)

    assert make.capabilities == Capabilities()
    assert capabilities_of(plain) == Capabilities()
    assert as_factory(plain)(4, 1, record_events=False).num_blocks == 4


def test_a_function_attribute_is_refused_with_the_way_out() -> None:
    def old(num_blocks: int, block_size: int, *, record_events: bool) -> SpecCache:
        return SpecCache(num_blocks, block_size)

    old.capabilities = Capabilities(exact=False)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"@prefixkv\.conformance\.adapter"):
        capabilities_of(old)
    with pytest.raises(TypeError, match="adapter"):
        run_conformance(old, max_examples=1)


def test_a_signature_the_kit_cannot_call_is_refused_at_declaration() -> None:
    def no_events(num_blocks: int, block_size: int) -> SpecCache:
        return SpecCache(num_blocks, block_size)

    def no_slots(num_blocks: int, block_size: int, *, record_events: bool) -> Any:
        return None

    def renamed(n: int, size: int, *, record_events: bool) -> SpecCache:
        return SpecCache(n, size)

    with pytest.raises(TypeError, match="record_events"):
        adapter(capabilities=Capabilities())(no_events)  # type: ignore[arg-type]
    # a replay calls make(num_blocks=..., block_size=..., record_events=...)
    with pytest.raises(TypeError, match="num_blocks"):
        adapter(renamed)  # type: ignore[arg-type]
    hybrid = Capabilities(checkpoints=True, routed_experts=True)
    with pytest.raises(TypeError, match="max_num_seqs"):
        adapter(capabilities=hybrid)(no_slots)


def test_the_shipped_factories_are_declared() -> None:
    assert impl_adapter.capabilities == Capabilities()
    assert hybrid_impl_adapter.capabilities.checkpoints
    assert make_manager.capabilities == CAPABILITIES
    assert isinstance(make_manager(4, 1, record_events=False), EngineStyleManager)
    loaded = load_factory("examples.engine_style:make_manager")
    assert loaded is make_manager


def test_the_machine_is_built_from_the_declaration() -> None:
    machine = conformance_machine(make_manager)
    assert machine.caps == CAPABILITIES
    assert machine.__name__ == "Conformance"
    skipped = conformance_machine(make_manager, skip_rules=["evict"], name="Other")
    assert skipped.evict is None
    assert skipped.__name__ == "Other" and machine.coverage is not skipped.coverage
    with pytest.raises(ValueError, match="no rule named nope"):
        conformance_machine(make_manager, skip_rules=["nope"])
