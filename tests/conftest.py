"""Shared test configuration: the Hypothesis profiles ``dev``, ``ci`` and ``thorough``.

They live in :mod:`prefixkv.conformance.profiles` so that the conformance plugin runs other
engines' block managers under the same ones. ``CI=true`` selects ``ci``;
``HYPOTHESIS_PROFILE=thorough`` selects the long runs. ``PREFIXKV_DATABASE=DIR`` (or
``redis://host:port/db``) makes every machine of the session share that example database, as
a campaign does (docs/campaigns.md): failures found by any run are replayed first.
"""

from __future__ import annotations

from hypothesis import settings

from prefixkv.conformance.database import campaign_settings, database_from_env
from prefixkv.conformance.profiles import default_profile, register_profiles

register_profiles()
_PROFILE = default_profile()
_DATABASE = database_from_env()
if _DATABASE is not None:
    # The same profile on the shared database (and so not derandomized).
    settings.register_profile(
        f"{_PROFILE}+database", campaign_settings(settings.get_profile(_PROFILE), _DATABASE)
    )
    _PROFILE = f"{_PROFILE}+database"
settings.load_profile(_PROFILE)

# ``pytester`` runs pytest sessions in-process for the conformance plugin's tests.
pytest_plugins = ["pytester"]
