"""prefixkv.conformance: aim prefixkv's state machines at any block manager.

* :mod:`.machines`: the differential Hypothesis state machines (a reference cache and a
  candidate driven in lockstep, every invariant checked after every step).
* :mod:`.profiles`: the Hypothesis profiles ``dev``, ``ci`` and ``thorough``.

Needs the ``conformance`` extra (Hypothesis and pytest): ``pip install "prefixkv[conformance]"``.
"""
