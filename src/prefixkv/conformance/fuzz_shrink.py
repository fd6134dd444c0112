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
need it, and only where ``span_comments`` exists and ``slice_comments`` does not.
"""

from __future__ import annotations

import inspect
from typing import Any

from .fuzz_replay import AFFECTED_UP_TO, hypofuzz_version

__all__ = ["keep_shrunk_failures"]


def _get(self: Any) -> Any:
    return self.span_comments


def _set(self: Any, value: Any) -> None:
    self.span_comments = value


def keep_shrunk_failures(*, force: bool = False) -> bool:
    """Alias ``slice_comments`` to ``span_comments`` on Hypothesis's ``ConjectureData`` and
    ``ConjectureResult``. Returns whether the alias is in place afterwards."""
    version = hypofuzz_version()
    if version is None or (version > AFFECTED_UP_TO and not force):
        return False
    from hypothesis.internal.conjecture.data import ConjectureData, ConjectureResult

    classes = (ConjectureData, ConjectureResult)
    if all(isinstance(getattr(c, "slice_comments", None), property) for c in classes):
        return True  # installed already
    if any(hasattr(c, "slice_comments") for c in classes):
        return False  # Hypothesis has the old name itself
    if "span_comments" not in inspect.signature(ConjectureResult).parameters:
        return False  # neither name: nothing to alias
    ConjectureData.slice_comments = property(_get, _set)  # type: ignore[attr-defined]
    ConjectureResult.slice_comments = property(_get)  # type: ignore[attr-defined]
    return True
