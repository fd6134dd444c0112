"""The conformance kit as plain state machine test cases, so that HypoFuzz can fuzz it.

``pytest --prefixkv-adapter=...`` runs the kit as one item of its own, which HypoFuzz cannot
collect (it fuzzes Hypothesis tests and state machine ``TestCase`` classes). The same
machines, built by :func:`~prefixkv.conformance.conformance_machine`, are ordinary test
cases; an engine team writes the same two lines for its own adapter factory. Under pytest
they run a short budget; under ``hypothesis fuzz`` they run until stopped
(docs/campaigns.md)::

    hypothesis fuzz --no-dashboard -n 2 -- tests/impl/test_state_machines.py \\
        tests/conformance/test_campaign_targets.py

NOTE: every machine ``conformance_machine`` builds is named ``Conformance`` unless told
otherwise, and Hypothesis keys its example database by that name: a campaign's failures on
a machine of the default name are the first examples of the next ``run_conformance`` or
``pytest --prefixkv-adapter`` run on the same database. The project's targets below are
two managers, so each gets a name of its own.
"""

from __future__ import annotations

from hypothesis import settings

from examples.engine_style import make_manager
from prefixkv.conformance import conformance_machine
from prefixkv.conformance.reference_adapters import impl_adapter


def _examples(fraction: float) -> int:
    """A fraction of the active profile's ``max_examples`` (HypoFuzz ignores it)."""
    return max(5, int(settings().max_examples * fraction))


# prefixkv.impl, exact: step for step against the spec, as an engine with prefixkv's policy.
ConformanceImpl = conformance_machine(impl_adapter, name="ConformanceImpl")
TestConformanceImpl = ConformanceImpl.TestCase
TestConformanceImpl.settings = settings(max_examples=_examples(0.1), stateful_step_count=30)

# An independent engine-style manager under its declared policy: the safety checks only.
ConformanceEngineStyle = conformance_machine(make_manager, name="ConformanceEngineStyle")
TestConformanceEngineStyle = ConformanceEngineStyle.TestCase
TestConformanceEngineStyle.settings = settings(max_examples=_examples(0.1), stateful_step_count=30)
