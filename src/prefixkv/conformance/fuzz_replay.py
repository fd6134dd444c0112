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
alone; ``force=True`` installs it anyway, for a release that still has the defect.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

__all__ = ["AFFECTED_UP_TO", "align_forced_choices", "hypofuzz_version", "installed"]

#: The newest HypoFuzz release known to lose its place on forced draws.
AFFECTED_UP_TO = (25, 11, 1)

#: Marks the wrapped ``ConjectureData._draw``, so that installing twice wraps once.
_MARK = "_prefixkv_aligns_forced_choices"

#: HypoFuzz's coverage collector ignores code whose file name is ``<...>`` (generated code).
#: The wrapper's own branches differ between a first run (the choices run out) and its
#: re-run (they do not); traced, they alone would make every re-run unstable again.
_UNTRACED_FILENAME = "<prefixkv.conformance.fuzz_replay>"


def hypofuzz_version() -> tuple[int, ...] | None:
    """HypoFuzz's release as numbers (``(25, 11, 1)``), or ``None`` when it is not installed."""
    try:
        text = importlib.metadata.version("hypofuzz")
    except importlib.metadata.PackageNotFoundError:
        return None
    parts: list[int] = []
    for part in text.split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _untraced(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with a code object named like generated code, which coverage skips."""
    function.__code__ = function.__code__.replace(co_filename=_UNTRACED_FILENAME)
    return function


def installed() -> bool:
    """Whether :func:`align_forced_choices` is in place in this process."""
    from hypothesis.internal.conjecture.data import ConjectureData

    return bool(getattr(ConjectureData._draw, _MARK, False))


def align_forced_choices(*, force: bool = False) -> bool:
    """Make HypoFuzz's provider step over forced draws when it replays a recorded input.

    Returns whether the alignment is in place afterwards. It is installed only on HypoFuzz
    releases up to :data:`AFFECTED_UP_TO` (``force=True``: any release), and only when the
    private attributes it relies on are there.
    """
    version = hypofuzz_version()
    if version is None or (version > AFFECTED_UP_TO and not force):
        return False
    from hypofuzz.provider import HypofuzzProvider, State
    from hypothesis.internal.conjecture.data import ConjectureData

    if installed():
        return True
    fields = getattr(State, "__dataclass_fields__", {})
    if not {"choices", "choice_index"} <= set(fields) or not hasattr(ConjectureData, "_draw"):
        return False
    draw = ConjectureData._draw

    @_untraced
    def aligned_draw(
        self: ConjectureData, choice_type: Any, constraints: Any, *, observe: bool, forced: Any
    ) -> Any:
        # A forced draw never reaches the provider, but its value sits in the recorded
        # sequence the provider replays: consume that position, so that the next draw the
        # provider answers reads the value recorded for it. (Within a ``for_choices``
        # prefix Hypothesis replays by itself and handles forced draws already.)
        provider = self.provider
        state = getattr(provider, "_state", None)
        if (
            forced is not None
            and observe
            and isinstance(provider, HypofuzzProvider)
            and state is not None
            and not (self.prefix is not None and self.index < len(self.prefix))
            and state.choice_index < len(state.choices)
        ):
            state.choice_index += 1
        return draw(self, choice_type, constraints, observe=observe, forced=forced)

    setattr(aligned_draw, _MARK, True)
    aligned_draw.__wrapped__ = draw  # type: ignore[attr-defined]
    ConjectureData._draw = aligned_draw  # type: ignore[method-assign]
    return True
