"""Shared test configuration: the Hypothesis profiles ``dev``, ``ci`` and ``thorough``.

They live in :mod:`prefixkv.conformance.profiles` so that the conformance plugin runs other
engines' block managers under the same ones. ``CI=true`` selects ``ci``;
``HYPOTHESIS_PROFILE=thorough`` selects the long runs. ``PREFIXKV_DATABASE=DIR`` (or
``redis://host:port/db``) makes every machine of the session share that example database, as
a campaign does (docs/campaigns.md): failures found by any run are replayed first.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from prefixkv.conformance.database import (
    DatabaseUnavailable,
    InvalidDatabase,
    campaign_settings,
    database_from_env,
)
from prefixkv.conformance.profiles import default_profile, register_profiles

register_profiles()
settings.load_profile(default_profile())


def pytest_configure(config: pytest.Config) -> None:
    """Load the profile on ``$PREFIXKV_DATABASE``, checked once, before any test runs.

    NOTE: a database that cannot be used is a usage error of the session, never a failed
    property: checked here (refused, stalled, malformed or wrong-type replies), and a
    server that fails later only warns, and the session runs on without it.
    """
    try:
        database = database_from_env(connect=True, on_error="warn")
    except (InvalidDatabase, DatabaseUnavailable) as exc:
        raise pytest.UsageError(f"$PREFIXKV_DATABASE: {exc}") from None
    if database is not None:
        # The same profile on the shared database (and so not derandomized).
        profile = default_profile()
        settings.register_profile(
            f"{profile}+database", campaign_settings(settings.get_profile(profile), database)
        )
        settings.load_profile(f"{profile}+database")


# ``pytester`` runs pytest sessions in-process for the conformance plugin's tests.
pytest_plugins = ["pytester"]
