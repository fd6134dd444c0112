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
known to need it and only where those exist; the code is in :mod:`._compat`.
"""

from __future__ import annotations

from ._compat import report_targets_early

__all__ = ["report_targets_early"]
