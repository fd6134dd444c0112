"""The Hypothesis profiles every prefixkv suite runs under.

* ``dev`` (default): quick local runs.
* ``ci``: what CI runs (``CI=true`` selects it); derandomized so CI is reproducible.
* ``thorough``: long runs for nightly jobs or before a release
  (``HYPOTHESIS_PROFILE=thorough pytest``).

:func:`searches` splits one search into the Hypothesis runs the runner makes: short runs
first, then the full one.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

__all__ = ["PROFILES", "SHORT_RUNS", "default_profile", "register_profiles", "searches"]

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


#: The short searches before the full one: (most rule steps, share of the full search's
#: examples), shortest first.
SHORT_RUNS: tuple[tuple[int, float], ...] = ((5, 0.2), (8, 0.2))


def searches(full: settings, short_first: bool = True) -> list[settings]:
    """The Hypothesis runs of one search, in order: short ones, then ``full``.

    Each short run has at most the steps :data:`SHORT_RUNS` gives it (only those shorter
    than ``full.stateful_step_count``) and its share of ``full.max_examples`` (at least one
    example), and no database; the full run is ``full`` itself.

    NOTE: Hypothesis shrinks the run in which it first saw a failure, and the shrink
    stops in the first local minimum it reaches from that run: from the full search's
    30-step runs, ``double_free_in_batch`` (``examples/engine_style.py``) ended at 8 steps
    and 44 calls after about 2,500 candidates (31 CPU seconds), each a replay of its steps.
    Found by a run of at most 8 steps it ends at 3 steps and 8 calls in about a second. A
    bug that needs a long run is still found by the full run, which draws the same runs as
    without the short ones (the same settings, the same seed). The short runs add two
    fifths of the examples, each run at most 8 steps long: a passing search of 30-step
    runs makes about 9% more rule steps. They keep no database: replayed under fewer
    steps, a saved long failure would not fail again, and Hypothesis would delete it.

    Args:
        full: the settings of the full search.
        short_first: ``False`` for the full run alone, as Hypothesis alone would run it.

    Returns:
        The settings of each run, in the order to run them.
    """
    runs: list[settings] = []
    if short_first:
        for steps, share in SHORT_RUNS:
            if steps < full.stateful_step_count:
                examples = max(1, round(full.max_examples * share))
                runs.append(
                    settings(full, stateful_step_count=steps, max_examples=examples, database=None)
                )
    return [*runs, full]
