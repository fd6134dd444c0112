"""Fuzz one state machine with HypoFuzz's own fuzz target, and report its re-executions.

``python fuzz_replay_worker.py MODE INPUTS MACHINE`` runs ``INPUTS`` inputs of ``MACHINE``
(``toy``: :class:`Toy` below; ``failing``: :class:`FailingToy`, which stops at its first
failure; ``impl``: the conformance kit against ``prefixkv.impl``)
through ``hypofuzz.hypofuzz.FuzzTarget``, the object a ``hypothesis fuzz`` worker drives,
with ``MODE`` ``aligned`` (after :func:`~prefixkv.conformance.fuzz_replay.align_forced_choices`),
``mended`` (and :func:`~prefixkv.conformance.fuzz_shrink.keep_shrunk_failures`) or ``plain``
(HypoFuzz as released). It prints one JSON object: how many inputs HypoFuzz
re-executed to check their coverage, how many of those replayed the recorded choices
exactly, how many gave the same coverage again (stable), and the behaviours and corpus
entries HypoFuzz recorded, and the shrunk failures it saved (``crashed``: it raised while
saving one).

A fresh process per mode: the alignment, once installed, stays for the process.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

from hypofuzz import provider as hypofuzz_provider
from hypofuzz.database import FailureState, HypofuzzDatabase
from hypofuzz.hypofuzz import FuzzTarget
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase
from hypothesis.stateful import (
    RuleBasedStateMachine,
    get_state_machine_test,
    precondition,
    rule,
)

from prefixkv.conformance.fuzz_replay import align_forced_choices
from prefixkv.conformance.fuzz_shrink import keep_shrunk_failures


class Toy(RuleBasedStateMachine):
    """A deterministic machine whose branches depend on its draws. A precondition makes
    Hypothesis pick rules from a filtered list, which records forced draws too."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[int] = []

    @rule(x=st.integers(0, 20))
    def push(self, x: int) -> None:
        if x % 3 == 0:
            self.items.append(x)
        elif x % 3 == 1:
            self.items.insert(0, x)
        else:
            self.items.append(-x)

    @precondition(lambda self: bool(self.items))
    @rule()
    def pop(self) -> None:
        if self.items.pop() < 0:
            self.items.clear()


class FailingToy(Toy):
    """The toy, with a property that fails once three items are held."""

    @rule()
    def holds_few(self) -> None:
        assert len(self.items) < 3


def _machine(name: str) -> Any:
    if name == "toy":
        return Toy
    if name == "failing":
        return FailingToy
    from prefixkv.conformance import conformance_machine
    from prefixkv.conformance.reference_adapters import impl_adapter

    return conformance_machine(impl_adapter, name="FuzzReplayImpl")


def main(mode: str, inputs: int, machine: str) -> dict[str, int]:
    if mode == "aligned":
        assert align_forced_choices()
    if mode == "mended":
        assert align_forced_choices() and keep_shrunk_failures()
    db = InMemoryExampleDatabase()
    # HypoFuzz reads the database (and nothing else) from the active settings.
    settings.register_profile("fuzz-replay", database=db, stateful_step_count=10)
    settings.load_profile("fuzz-replay")

    counts: Counter[str] = Counter()
    after_test_case = hypofuzz_provider.HypofuzzProvider.after_test_case

    def counting(self: Any, observation: Any) -> None:
        state = self._state
        if state is not None and state.priority is hypofuzz_provider.QueuePriority.STABILITY:
            first = state.extra_queue_data["behaviors"]
            again = state.branches | hypofuzz_provider.bucket_features(observation.features)
            replayed = tuple(n.value for n in observation.metadata.choice_nodes)
            counts["reexecuted"] += 1
            counts["replayed_exactly"] += replayed == tuple(state.choices)
            counts["stable"] += first == again
        after_test_case(self, observation)

    hypofuzz_provider.HypofuzzProvider.after_test_case = counting  # type: ignore[method-assign]
    test = get_state_machine_test(_machine(machine), settings=settings())
    target = FuzzTarget.from_hypothesis_test(test, database=HypofuzzDatabase(db))
    target._enter_fixtures()
    for _ in range(inputs):
        try:
            target.run_one()
        except AttributeError as exc:  # HypoFuzz saving a shrunk failure, unmended
            counts["crashed"] += 1
            print(repr(exc), file=sys.stderr)
            break
        if target.has_found_failure:
            break
    shrunk = list(target.database.failures(state=FailureState.SHRUNK).fetch(target.database_key))
    counts["shrunk_failures"] = len(shrunk)
    corpus = target.provider.corpus
    assert corpus is not None
    counts["behaviors"] = len(corpus.behavior_counts)
    counts["corpus"] = len(corpus.corpus)
    return dict(counts)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), sys.argv[3])))
