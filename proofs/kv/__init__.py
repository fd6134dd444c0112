"""The KV block cache in Z3: the pool, the free queue, the index and the sequences.

The parts every model has: :mod:`.model` (state, data types, the spec's decision points),
:mod:`.formulas` (the invariants), :mod:`.transitions` (one per operation; the whole
encoding is :class:`~.transitions.Encoding`), :mod:`.obligations` (the prover, non-vacuity,
counterexample search), :mod:`.broken` (broken encodings), :mod:`.drift` (the model against
``SpecCache``), :mod:`.seeded` (drifted encodings the drift check must catch) and
:mod:`.suite` (what ``prove`` runs of it).

NOTE: :mod:`.concrete` (concrete states, and the bridge that reads a ``SpecCache`` into one
and builds one from it) belongs to this model alone: only the KV model quantifies over a
symbolic pool, so only it needs concrete states to search counterexamples, sample states and
check drift. The other models' drift modules abstract the spec themselves. So is
:mod:`.calls` (the random spec calls of the drift check, on reachable and on sampled
states), which :mod:`.drift` keeps apart from the checker.
"""
