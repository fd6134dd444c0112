"""Bad inputs: the tables of invalid calls, and the rules that make them.

Every invalid call must raise a :class:`~prefixkv.spec.PrefixCacheError` (a typed one where
the kind says so, ``MUST-RAISE(<op>)``) and change nothing (INV-TXN). Bad-input rules fire at
most once in three rules, so valid work stays the common case. Kinds that need an operation
the candidate lacks (``reset_flag`` without ``reset``, ``evict`` without ``evict``) are not
drawn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, precondition, rule

from prefixkv.spec import (
    DuplicateSequence,
    InvalidOperation,
    InvalidRequest,
    Namespace,
    OutOfBlocks,
    Request,
    SeqId,
    UnknownSequence,
)

from .checks import bad_inputs_due, counted
from .steps import ProtocolSteps
from .strategies import BAD_ACCEPTED, BAD_COUNTS, BAD_REQUEST_ARGS, NOT_A_REQUEST, prompts

__all__ = ["BAD_ARGUMENT_KINDS", "BAD_REQUEST_KINDS", "BAD_SEQUENCE_KINDS", "BadInputRules"]

BAD_SEQUENCE_KINDS = (
    "unknown:append",
    "unknown:can_append",
    "unknown:commit",
    "unknown:rollback",
    "unknown:continue_prefill",
    "unknown:block_table",
    "unknown:num_computed_tokens",
    "unknown:free",
    "double_free",
    "free_unknown_in_batch",
    "admit_live_id",
    "free_one_id",
    "free_not_iterable",
    "bad_seq_id_type",
)

BAD_ARGUMENT_KINDS = (
    "append",
    "can_append",
    "commit",
    "rollback",
    "evict",
    "admit_budget",
    "can_admit_budget",
    "commit_past_reserved",
    "commit_unknown_tokens",
    "commit_unknown_decode",
    "rollback_past_computed",
    "accepted_tokens",
    "reset_flag",
    "admit_over_capacity",
)

BAD_REQUEST_KINDS = (
    "construct",
    "bad_namespace",
    "not_a_request:match",
    "not_a_request:can_admit",
    "not_a_request:admit",
)


#: The error each bad sequence operation must raise, whatever the state.
_SEQUENCE_ERRORS: dict[str, type[Exception]] = {
    **{kind: UnknownSequence for kind in BAD_SEQUENCE_KINDS if kind.startswith("unknown:")},
    "double_free": DuplicateSequence,
    "free_unknown_in_batch": UnknownSequence,
    "free_one_id": InvalidRequest,
    "free_not_iterable": InvalidRequest,
    "bad_seq_id_type": InvalidRequest,
}

#: The error a bad argument must raise whatever the state (kinds whose counts may be valid,
#: such as ``commit(seq, 0)`` or an admission budget of ``None``, are not listed).
_ARGUMENT_ERRORS: dict[str, type[Exception]] = {
    "commit_past_reserved": InvalidOperation,
    "commit_unknown_tokens": InvalidOperation,
    "commit_unknown_decode": InvalidOperation,
    "rollback_past_computed": InvalidOperation,
    "accepted_tokens": InvalidRequest,
    "reset_flag": InvalidRequest,
    "admit_over_capacity": OutOfBlocks,
}


#: Pure reads left out of replays once they have passed (``match`` and ``can_*`` stay:
#: they show what the candidate promised before the step that broke the promise).

#: Bad-argument kinds that call an optional operation: kind -> the capability it needs.
_NEEDS: dict[str, str] = {
    "reset_flag": "reset",
    "evict": "evict",
    "rollback": "rolls_back",
    "rollback_past_computed": "rolls_back",
    "admit_budget": "partial_admission",
    "can_admit_budget": "partial_admission",
}


class BadInputRules(ProtocolSteps):
    """Unknown ids, bad counts and flags, malformed requests (see the module doc)."""

    seqs = Bundle("seqs")  # the live sequences (the same bundle in every mixin)

    @precondition(bad_inputs_due)
    @rule(kind=st.sampled_from(BAD_SEQUENCE_KINDS), seq=seqs, tokens=prompts())
    @counted
    def bad_sequence_op(self, kind: str, seq: SeqId, tokens: tuple[int, ...]) -> None:
        """Unknown ids, double frees, duplicates in a batch, an id admitted twice."""
        self._since_bad = 0
        if kind.endswith("continue_prefill") and not self.caps.chunked_prefill:
            return
        if kind == "unknown:rollback" and not self.caps.rolls_back:
            return
        type(self).coverage.variants[f"bad_sequence_op:{kind}"] += 1
        ghost = self._ghost()
        # bad inputs on purpose: the cache is untyped here, so that a wrong type can be passed
        ops: dict[str, Callable[[Any], object]] = {
            "unknown:append": lambda c: c.append(ghost, 1),
            "unknown:can_append": lambda c: c.can_append(ghost, 1),
            "unknown:commit": lambda c: c.commit(ghost, 0, (1,)),
            "unknown:rollback": lambda c: c.rollback(ghost, 1),
            "unknown:continue_prefill": lambda c: c.continue_prefill(ghost),
            "unknown:block_table": lambda c: c.block_table(ghost),
            "unknown:num_computed_tokens": lambda c: c.num_computed_tokens(ghost),
            "unknown:free": lambda c: c.free([ghost]),
            "double_free": lambda c: c.free([seq, seq]),
            "free_unknown_in_batch": lambda c: c.free([seq, ghost]),
            "free_one_id": lambda c: c.free(str(seq)),
            "free_not_iterable": lambda c: c.free(12345),
            "bad_seq_id_type": lambda c: c.block_table(1.5),
        }
        if kind in ("double_free", "free_unknown_in_batch"):
            # a free of a live sequence, refused or not: without cancel_scheduled its
            # scheduled tokens are computed first, as before any other free
            self._run_scheduled([seq])
        if kind == "admit_live_id":
            req = Request(seq, self._prompt(tokens), self._ns(self._seq_ns.get(seq, 0)))
            self.oracle.op("can_admit", lambda c: c.can_admit(req), pure=True)
            self.oracle.op("admit", lambda c: c.admit(req), must_raise=DuplicateSequence)
        else:
            self.oracle.op(kind.split(":")[-1], ops[kind], must_raise=_SEQUENCE_ERRORS[kind])
        self.oracle.raised_in_rule = True

    @precondition(bad_inputs_due)
    @rule(
        kind=st.sampled_from(BAD_ARGUMENT_KINDS),
        seq=seqs,
        count=st.sampled_from(BAD_COUNTS),
        accepted=st.sampled_from(BAD_ACCEPTED),
    )
    @counted
    def bad_argument(self, kind: str, seq: SeqId, count: Any, accepted: Any) -> None:
        """Out-of-range counts, over-committing, over-rolling-back, bad tokens, overflow."""
        self._since_bad = 0
        if kind in _NEEDS and not getattr(self.caps, _NEEDS[kind]):
            return  # the operation is declared missing: never called, never faked
        type(self).coverage.variants[f"bad_argument:{kind}"] += 1
        view = self.oracle.view(seq)
        if view is None or self.cfg is None:
            return  # the sequence left (a preserving reset drops every sequence)
        c, r, known = view.num_computed, view.num_reserved, len(view.token_ids)
        req = Request(self._new_id(), (1, 2, 3), self._ns(0))
        over = Request(
            self._new_id(), (1, 2, 3) * (self.cfg.num_blocks * self.cfg.block_size), self._ns(1)
        )
        ops: dict[str, Callable[[Any], object]] = {  # bad inputs, as above
            "append": lambda x: x.append(seq, count),
            "can_append": lambda x: x.can_append(seq, count),
            "commit": lambda x: x.commit(seq, count),
            "rollback": lambda x: x.rollback(seq, count),
            "evict": lambda x: x.evict(count),
            "admit_budget": lambda x: x.admit(req, count),
            "can_admit_budget": lambda x: x.can_admit(req, count),
            "commit_past_reserved": lambda x: x.commit(
                seq, r - c + 1, (1,) * max(1, r - known + 1)
            ),
            "commit_unknown_tokens": lambda x: x.commit(seq, known - c + 1),
            # one past the known tokens: commit(seq, 1) once the sequence is in decode
            "commit_unknown_decode": lambda x: x.commit(seq, known - c + 1),
            "rollback_past_computed": lambda x: x.rollback(seq, r - c + 1),
            "accepted_tokens": lambda x: x.commit(seq, 0, accepted),
            "reset_flag": lambda x: x.reset(preserve_cache=1),
            "admit_over_capacity": lambda x: x.admit(over),
        }
        if kind == "commit_unknown_tokens" and r - c < known - c + 1:
            # Not enough reserved slots to reach past the known tokens: reserve them first.
            self._append(seq, known - r + 1, only_if_possible=True)
        if kind == "commit_unknown_decode":
            c, r, known = self._to_decode(seq, c, r, known)  # read by the commit below
        if kind == "admit_over_capacity":
            can = self.oracle.op("can_admit", lambda x: x.can_admit(over), pure=True)
            if can.value:
                self.oracle.fail("CAN-ADMIT", f"can_admit({over!r}) is True for an oversize prompt")
        pure = kind.startswith("can_")
        out = self.oracle.op(kind, ops[kind], pure=pure, must_raise=_ARGUMENT_ERRORS.get(kind))
        if kind.startswith("admit") and not out.raised:  # count=None is a valid budget
            self.oracle.op("free", lambda x: x.free([req.seq_id]))
        self.oracle.raised_in_rule = True

    def _to_decode(self, seq: SeqId, c: int, r: int, known: int) -> tuple[int, int, int]:
        """Bring ``seq`` to a decode step whose next token stays inside its block, by valid
        calls; returns the computed, reserved and known counts reached.

        ``commit_unknown_tokens`` commits up to one past the known tokens from wherever the
        sequence is, which in prefill mostly completes a block. ``commit_unknown_decode``
        commits one token past the known ones once every known token is computed: when that
        completes no block, it is the commit a manager may check on a path of its own (a
        decode fast path, with nothing to publish). So a known count that ends one slot
        before a block boundary first takes one valid decode step, and a full pool
        preempts the newest other sequence, as an engine does. Whatever the pool allows,
        the commit that follows is past the known tokens and must raise.
        """
        if c < known and (r >= known or self._reserve(seq, known - r)):
            self._commit(seq, known - c, ())
        bs = self.block_size
        view = self.oracle.view(seq)
        assert view is not None  # valid appends and commits never drop a sequence
        c, r = view.num_computed, view.num_reserved
        # one decode step (a sampled token, its KV computed) moves off the boundary
        if (
            bs > 1
            and c == known
            and (known + 1) % bs == 0
            and (r > known or self._reserve(seq, 1))
            and self._commit(seq, 1, (1,))
        ):
            c = known = known + 1
            r = max(r, known)
        if r <= known and self._reserve(seq, known - r + 1):
            r = known + 1
        return c, r, known

    @precondition(bad_inputs_due)
    @rule(
        kind=st.sampled_from(BAD_REQUEST_KINDS),
        bad=st.sampled_from(BAD_REQUEST_ARGS),
        obj=st.sampled_from(NOT_A_REQUEST),
    )
    @counted
    def bad_request(self, kind: str, bad: dict[str, Any], obj: Any) -> None:
        """Malformed requests and namespaces raise InvalidRequest; non-Requests are refused."""
        self._since_bad = 0
        type(self).coverage.variants[f"bad_request:{kind}"] += 1
        self.oracle.raised_in_rule = True
        if kind == "construct":
            args: dict[str, Any] = {"seq_id": 1, "token_ids": (1, 2), "namespace": self._ns(0)}
            args.update(bad)
            try:
                Request(**args)
            except InvalidRequest:
                return
            self.oracle.fail("BAD-REQUEST", f"Request(**{args!r}) did not raise InvalidRequest")
            return
        if kind == "bad_namespace":
            for kwargs in (
                {"model": ""},
                {"model": 3},
                {"model": "m", "adapter": b"x"},
                {"model": "m", "salt": "s"},
            ):
                try:
                    Namespace(**kwargs)
                except InvalidRequest:
                    continue
                self.oracle.fail("BAD-REQUEST", f"Namespace(**{kwargs!r}) did not raise")
            return
        op = kind.split(":")[1]
        out = self.oracle.op(op, lambda c: getattr(c, op)(obj), pure=op != "admit")
        if not isinstance(out.error, InvalidRequest):
            self.oracle.fail("BAD-REQUEST", f"{op}({obj!r}) {out.describe()}")
