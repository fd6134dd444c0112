"""HypoFuzz's shrunk failures under newer Hypothesis: keep the name it reads.

When a HypoFuzz worker finds a failure, it shrinks it, copies the shrunk input's
explain-phase comments (``shrinker.shrink_target.slice_comments``) onto a fresh
``ConjectureData``, re-runs it and saves it as the test's shrunk failure. Hypothesis renamed
those comments ``span_comments`` (6.170.17 has no ``slice_comments``), so HypoFuzz 25.11.1
raises ``AttributeError`` right after shrinking: the worker dies, and the failure stays in
the database only as found, unshrunk (``<key>.secondary``). A later run on the same database
still replays it first and shrinks it itself (docs/campaigns.md), but the campaign loses the
worker, and the dashboard never shows the minimal example.

:func:`keep_shrunk_failures` gives both classes the old name as an alias of the new one, so
HypoFuzz's copy reads and writes ``span_comments``. The conformance plugin installs it in
HypoFuzz processes with the other mends.

NOTE: an alias on Hypothesis's internal classes, installed only on HypoFuzz releases known to
need it, and only where ``span_comments`` exists and ``slice_comments`` does not; the code is
in :mod:`._compat`.
"""

from __future__ import annotations

from ._compat import keep_shrunk_failures

__all__ = ["keep_shrunk_failures"]
