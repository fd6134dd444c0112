"""HypoFuzz's hub and slow targets: report the tests a worker fuzzes as soon as it has them.

``hypothesis fuzz`` runs a hub and worker processes. Every 60 seconds the hub looks at what
each worker reports as the tests it may still fuzz, and stops (printing ``Found a failing
input for every test!``) when no worker reports any. A worker of HypoFuzz 25.11.1 reports
them only after its first batch of 100 inputs on one test. prefixkv's machines take 1 to
5 seconds an input on a loaded machine, so at the first check no worker has reported yet:
the hub stops at 60 s although nothing failed, and each worker dies when its first batch
ends and it finds the hub gone (docs/campaigns.md).

:func:`report_targets_early` makes a worker report its tests each time it takes its
assignment from the hub, before it fuzzes them; what it reports after each batch is
unchanged, so a worker whose tests have all failed still reports none, and the hub still
stops when every test has failed. The conformance plugin installs it in every HypoFuzz
worker, with :func:`~prefixkv.conformance.fuzz_replay.align_forced_choices`.

NOTE: like the replay alignment it reaches into HypoFuzz's private worker
(``FuzzWorker._update_targets``, ``shared_state``), so it installs only on the releases
known to need it and only where those exist.
"""

from __future__ import annotations

from typing import Any

from .fuzz_replay import AFFECTED_UP_TO, hypofuzz_version

__all__ = ["report_targets_early"]

#: Marks the wrapped ``FuzzWorker._update_targets``, so that installing twice wraps once.
_MARK = "_prefixkv_reports_targets_early"


def report_targets_early(*, force: bool = False) -> bool:
    """Make HypoFuzz workers report their tests to the hub before fuzzing them.

    Returns whether it is in place afterwards: only on HypoFuzz releases up to
    :data:`~prefixkv.conformance.fuzz_replay.AFFECTED_UP_TO` (``force=True``: any release).
    """
    version = hypofuzz_version()
    if version is None or (version > AFFECTED_UP_TO and not force):
        return False
    from hypofuzz.hypofuzz import FuzzWorker

    update = getattr(FuzzWorker, "_update_targets", None)
    if update is None or not hasattr(FuzzWorker, "valid_targets"):
        return False
    if getattr(update, _MARK, False):
        return True

    def update_and_report(self: Any, nodeids: Any) -> None:
        update(self, nodeids)
        # The hub stops when every worker reports no test left; a worker that has just
        # been given tests it has not fuzzed yet has some.
        self.shared_state["worker_state"]["valid_nodeids"] = [
            target.nodeid for target in self.valid_targets
        ]

    setattr(update_and_report, _MARK, True)
    update_and_report.__wrapped__ = update  # type: ignore[attr-defined]
    FuzzWorker._update_targets = update_and_report  # type: ignore[method-assign]
    return True
