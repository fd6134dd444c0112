"""Shared test configuration: Hypothesis profiles.

* ``dev`` (default): quick local runs.
* ``ci``: what CI runs (``CI=true`` selects it); derandomized so CI is reproducible.
* ``thorough``: long runs for nightly jobs or before a release
  (``HYPOTHESIS_PROFILE=thorough pytest``).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]

settings.register_profile("dev", max_examples=60, deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=_SLOW_OK,
)
settings.register_profile(
    "thorough",
    max_examples=2_000,
    deadline=None,
    phases=list(Phase),
    suppress_health_check=_SLOW_OK,
)

_default = "ci" if os.environ.get("CI", "").lower() in {"1", "true", "yes"} else "dev"
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", _default))
