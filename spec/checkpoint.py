"""The vocabulary of the checkpoint API: statuses, slot roles, and a state reference.

A hybrid engine talks to its prefix cache about recurrent states in one currency: *the
state after ``position`` tokens, in slot ``slot``*. The cache answers every question of
the engine's step (what to restore, where to save, what the runtime slot holds) with a
:class:`StateRef`, so the engine never derives a position from its own bookkeeping.

NOTE: the statuses and roles are ``StrEnum``s, so they compare equal to (and render as)
the plain strings that snapshots, reports and older adapters use.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["CheckpointStatus", "SlotRole", "StateRef"]


class CheckpointStatus(enum.StrEnum):
    """Where a checkpoint is in its lifecycle (docs/checkpoints.md)."""

    #: A live sequence will save into it when a commit covers its boundary.
    RESERVED = "reserved"
    #: Saved at its node's boundary; restorable.
    READY = "ready"
    #: Ready, and the restore source of one live sequence that has not issued it yet.
    PINNED = "pinned"


class SlotRole(enum.StrEnum):
    """What a held state slot is for."""

    #: The live state of one sequence.
    RUNTIME = "runtime"
    #: A checkpoint (Reserved, Ready or Pinned).
    CHECKPOINT = "checkpoint"


class StateRef(NamedTuple):
    """The recurrent state after ``position`` tokens, in state slot ``slot``.

    NOTE: a ``NamedTuple`` rather than an attrs record, so that ``slot, position = ref``
    keeps working for callers of the ``(slot, position)`` pairs it replaces.
    """

    slot: int
    position: int
