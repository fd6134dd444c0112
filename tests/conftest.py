"""Shared test configuration: the Hypothesis profiles ``dev``, ``ci`` and ``thorough``.

They live in :mod:`prefixkv.conformance.profiles` so that the conformance plugin runs other
engines' block managers under the same ones. ``CI=true`` selects ``ci``;
``HYPOTHESIS_PROFILE=thorough`` selects the long runs.
"""

from __future__ import annotations

from hypothesis import settings

from prefixkv.conformance.profiles import default_profile, register_profiles

register_profiles()
settings.load_profile(default_profile())

# ``pytester`` runs pytest sessions in-process for the conformance plugin's tests.
pytest_plugins = ["pytester"]
