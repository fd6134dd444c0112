"""prefixkv.conformance: aim prefixkv's state machines at any block manager.

* :func:`adapter`: declares an adapter factory and its :class:`Capabilities` (the
  :class:`AdapterFactory` protocol, see :mod:`.adapters`).
* :class:`Capabilities`: what the manager under test supports, and whether it must match
  the spec step for step (``exact``) or only keep every safety invariant.
* :func:`run_conformance`, :func:`conformance_machine`: run the machines against an adapter
  factory (see :mod:`.runner`); the pytest plugin does the same from the command line
  (``pytest --prefixkv-adapter=module:factory``, see :mod:`.plugin`).
* :class:`Lockstep`: the oracle that runs one operation on a reference and a candidate and
  checks everything (no Hypothesis needed); :mod:`prefixkv.conformance.safety` holds the
  safety checks under a declared policy.
* :mod:`.toolkit`: argument checks, statistics and snapshots for writing an adapter.
* :mod:`.report`: every distinct failed check with its shortest replay (JSON for CI).
* :mod:`.machines`: the differential Hypothesis state machines themselves.
* :mod:`.profiles`: the Hypothesis profiles ``dev``, ``ci`` and ``thorough``.

Needs the ``conformance`` extra (Hypothesis and pytest): ``pip install "prefixkv[conformance]"``.
"""

from .adapters import (
    AdapterFactory,
    BlockManagerAdapter,
    DeclaredAdapter,
    HybridAdapter,
    adapter,
)
from .capabilities import Capabilities
from .lockstep import Lockstep
from .report import FailedCheck
from .runner import (
    ConformanceFailure,
    ConformanceReport,
    capabilities_of,
    conformance_machine,
    load_factory,
    run_conformance,
)

__all__ = [
    "AdapterFactory",
    "BlockManagerAdapter",
    "Capabilities",
    "ConformanceFailure",
    "ConformanceReport",
    "DeclaredAdapter",
    "FailedCheck",
    "HybridAdapter",
    "Lockstep",
    "adapter",
    "capabilities_of",
    "conformance_machine",
    "load_factory",
    "run_conformance",
]
