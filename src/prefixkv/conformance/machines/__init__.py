"""Differential Hypothesis state machines: a reference cache against a candidate.

Build a machine from a pair factory and run its ``TestCase``::

    from machines import build_machine, spec_vs_impl

    TestSpecVsImpl = build_machine("SpecVsImpl", spec_vs_impl("fast")).TestCase

See docs/testing.md for the rules, the checks made after every step and the profiles.
"""

from .coverage import CoverageReport, RuleCoverage
from .differential import (
    BAD_ARGUMENT_KINDS,
    BAD_REQUEST_KINDS,
    BAD_SEQUENCE_KINDS,
    CheckFailed,
    DifferentialMachine,
    Outcome,
    all_rule_names,
    build_machine,
    failure_listeners,
)
from .factories import PairFactory, PoolConfig, candidate_class, spec_pair, spec_vs_impl
from .features import BAD_FEATURE_KINDS, BAD_SPANS, FeatureRules, build_request
from .hybrid import (
    BAD_HYBRID_KINDS,
    HybridMachine,
    HybridPoolConfig,
    build_hybrid_machine,
    hybrid_candidate_class,
    hybrid_spec_vs_impl,
)
from .strategies import (
    BAD_ACCEPTED,
    BAD_COUNTS,
    BAD_REQUEST_ARGS,
    BAD_SPAN_ARGS,
    NAMESPACES,
    NOT_A_REQUEST,
)

__all__ = [
    "BAD_ACCEPTED",
    "BAD_ARGUMENT_KINDS",
    "BAD_COUNTS",
    "BAD_FEATURE_KINDS",
    "BAD_HYBRID_KINDS",
    "BAD_REQUEST_ARGS",
    "BAD_REQUEST_KINDS",
    "BAD_SEQUENCE_KINDS",
    "BAD_SPANS",
    "BAD_SPAN_ARGS",
    "NAMESPACES",
    "NOT_A_REQUEST",
    "CheckFailed",
    "CoverageReport",
    "DifferentialMachine",
    "FeatureRules",
    "HybridMachine",
    "HybridPoolConfig",
    "Outcome",
    "PairFactory",
    "PoolConfig",
    "RuleCoverage",
    "all_rule_names",
    "build_hybrid_machine",
    "build_machine",
    "build_request",
    "candidate_class",
    "failure_listeners",
    "hybrid_candidate_class",
    "hybrid_spec_vs_impl",
    "spec_pair",
    "spec_vs_impl",
]
