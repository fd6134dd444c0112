"""HypoFuzz replays of state machine inputs: keep the recorded choices aligned with the draws.

HypoFuzz learns from coverage only after it has re-run an input and seen the same branches
again ("stable" coverage). It re-runs an input by handing the input's recorded choice
sequence to its provider, one value per draw that Hypothesis asks the provider for. But the
recorded sequence also holds Hypothesis's *forced* draws (values a strategy fixes itself), and
Hypothesis never asks the provider for those: it records the forced value and moves on. From
the first forced draw on, the provider hands every draw the value recorded for the draw
before it, so the re-run is another input, its coverage differs, and HypoFuzz drops it as
unstable.

Every Hypothesis state machine draws a forced value first: the run loop's "stop here?"
boolean is forced ``False`` before the first step (and ``True`` after the last), and a rule
picked from a filtered ``sampled_from`` (rules with preconditions, bundles) records its index
as a forced draw. So under HypoFuzz 25.11.1, the newest release when this was written, every
stateful target records **0 behaviours**: each re-run diverges at the second choice
(docs/campaigns.md has the measurements). Plain ``@given`` tests without forced draws are
not affected, and Hypothesis's own replays (``ConjectureData.for_choices``) handle forced
draws correctly, which is why the same inputs re-run identically outside HypoFuzz.

:func:`align_forced_choices` mends it from outside: when Hypothesis makes a forced draw for a
HypoFuzz provider that is replaying a recorded sequence, the provider's position moves past
that draw's recorded value too, so the next draw reads its own value. The conformance plugin
installs it in every HypoFuzz worker (``hypothesis fuzz`` collects through pytest, so the
plugin is loaded there); nothing changes outside a HypoFuzz run.

NOTE: this reaches into two private attributes (``ConjectureData._draw`` and the provider's
``_state``), so it is checked, not assumed: it installs only on the HypoFuzz releases known to
need it (``AFFECTED_UP_TO``), and only when those attributes exist. A newer release is left
alone; ``force=True`` installs it anyway, for a release that still has the defect. The code
lives with every other internal the kit reaches, in :mod:`._compat`.
"""

from __future__ import annotations

from ._compat import AFFECTED_UP_TO, align_forced_choices, hypofuzz_version, installed

__all__ = ["AFFECTED_UP_TO", "align_forced_choices", "hypofuzz_version", "installed"]
