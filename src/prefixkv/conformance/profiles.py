"""The Hypothesis profiles every prefixkv suite runs under.

* ``dev`` (default): quick local runs.
* ``ci``: what CI runs (``CI=true`` selects it); derandomized so CI is reproducible.
* ``thorough``: long runs for nightly jobs or before a release
  (``HYPOTHESIS_PROFILE=thorough pytest``).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

__all__ = ["PROFILES", "default_profile", "register_profiles"]

#: The profile names, in increasing order of effort.
PROFILES = ("dev", "ci", "thorough")

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]


def register_profiles() -> None:
    """Register ``dev``, ``ci`` and ``thorough`` (idempotent)."""
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


def default_profile() -> str:
    """``$HYPOTHESIS_PROFILE``, else ``ci`` when ``$CI`` is set, else ``dev``."""
    ci = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
    return os.environ.get("HYPOTHESIS_PROFILE", "ci" if ci else "dev")
