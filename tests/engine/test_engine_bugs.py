"""The engine's injected bugs (tests/mutation/engine_bugs.py) still apply to the code.

Running them takes minutes (``python -m tests.mutation.engine_bugs``); this only checks
that each patch's text still occurs exactly once, so the list cannot silently go stale.
"""

from __future__ import annotations

from mutation.engine_bugs import ENGINE_BUGS, ROOT


def test_every_engine_patch_applies() -> None:
    assert len(ENGINE_BUGS) >= 15
    assert len({b.name for b in ENGINE_BUGS}) == len(ENGINE_BUGS)
    for bug in ENGINE_BUGS:
        text = (ROOT / bug.path).read_text(encoding="utf-8")
        assert text.count(bug.old) == 1, bug.name
        assert bug.old != bug.new
