"""The preconditions and sizing rules that the spec and every prefixkv manager share.

What a call may ask for, what it is refused with, and how many tokens or blocks an allowed
call reserves are written here once, as pure functions over plain values (ints, ids, token
sequences, spans). :class:`~prefixkv.spec.cache.SpecCache`, the hybrid spec and both
managers in :mod:`prefixkv.impl` call them with their own state's numbers.

NOTE: the *transitions* are not here: the match walk, the eviction order, publication,
deduplication and anchoring are written twice on purpose (an obvious spec, a fast impl),
because those are what the differential machines compare. A rule here is shared, so a bug
in it would hit both sides alike and no differential machine could see it: each function
is checked directly against a table of inputs (``tests/spec/test_contract.py``), and the
invariant checker judges its effects (INV-LIMIT, INV-MATCH, INV-CKPT, INV-STATS).

Each function says which invariant or design choice (DESIGN choices 1-12) it enforces.
Errors are the typed, transactional ones of :mod:`prefixkv.spec.errors`: every check runs
before its operation changes anything (INV-TXN).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar, cast

from prefixkv.errors import InvalidConfig, require_int

from .errors import (
    CacheBusy,
    DuplicateSequence,
    InvalidOperation,
    InvalidRequest,
    OutOfBlocks,
    OutOfStateSlots,
    UnknownSequence,
)
from .identity import BlockHasher
from .multimodal import MultimodalSpan, span_containing
from .request import MAX_TOKEN_ID, SeqId, check_seq_id, token_tuple
from .results import LostReuse

__all__ = [
    "MAX_BLOCK_SIZE",
    "MAX_NUM_BLOCKS",
    "MAX_STATE_SLOTS",
    "AdmissionCounters",
    "blocks_for",
    "check_append",
    "check_cache_options",
    "check_commit",
    "check_continue",
    "check_count",
    "check_free_list",
    "check_growth",
    "check_hybrid_config",
    "check_keep_state",
    "check_pool_shape",
    "check_reset",
    "check_restore_pending",
    "check_rollback",
    "check_routed_experts",
    "check_runtime_slots",
    "chunk_end",
    "commit_error",
    "count_admission",
    "full_prompt_cap",
    "live_seq",
    "lost_reuse",
    "no_state_slot",
    "out_of_blocks",
    "save_point",
]

_T = TypeVar("_T")

assert MAX_TOKEN_ID == 4294967295, "check_commit inlines MAX_TOKEN_ID"

# -- arguments and ids -------------------------------------------------------------------


def check_count(value: object, what: str, *, minimum: int) -> int:
    """A count argument is a plain int (a bool is not a count) of at least ``minimum``.

    INV-TXN: a malformed count is refused before anything changes.
    """
    return require_int(value, what, minimum=minimum, error=InvalidRequest)


#: The most blocks a pool may have: block ids are int32 in engines' block tables (and in
#: the managers' own arrays).
MAX_NUM_BLOCKS = 2**31 - 1

#: The most tokens a block may hold (4 MiB of token ids): a block is hashed and compared
#: as one unit on every hit, and no engine's block comes near this.
MAX_BLOCK_SIZE = 2**20

#: The most state slots (runtime slots plus checkpoint budget) a hybrid cache may have: a
#: slot is a whole recurrent state in the engine's state pool.
MAX_STATE_SLOTS = 2**20


def check_pool_shape(num_blocks: object, block_size: object) -> tuple[int, int]:
    """A pool shape: ``1 <= num_blocks <= MAX_NUM_BLOCKS`` and ``1 <= block_size <=
    MAX_BLOCK_SIZE``, plain ints. Malformed, it is a configuration error (raised before
    anything is built), not a bad request. INV-PARTITION counts ``num_blocks`` blocks.

    NOTE: the bounds are the contract's, so the spec and the managers refuse the same
    shapes. Whether a shape within them fits in this host's memory is each manager's own
    check (the impl's pool is allocated up front: :class:`prefixkv.impl.PrefixCacheManager`).
    """
    for value, what, most in (
        (num_blocks, "num_blocks", MAX_NUM_BLOCKS),
        (block_size, "block_size", MAX_BLOCK_SIZE),
    ):
        if require_int(value, what, minimum=1) > most:
            raise InvalidConfig(f"{what} must be <= {most}, got {value}")
    assert isinstance(num_blocks, int) and isinstance(block_size, int)
    return int(num_blocks), int(block_size)


def check_cache_options(hasher: object, record_events: object) -> tuple[BlockHasher, bool]:
    """A cache's ``hasher`` is callable and ``record_events`` a bool; ``InvalidConfig``
    otherwise, before anything is built.

    NOTE: ``record_events`` is not read for its truth value: ``"no"`` would turn recording
    on, and a queue nobody drains is a memory leak.
    """
    if not callable(hasher):
        raise InvalidConfig(
            f"hasher must be a block hash function (see prefixkv.spec.hashing.HASHERS), "
            f"got {hasher!r}"
        )
    if not isinstance(record_events, bool):
        raise InvalidConfig(f"record_events must be True or False, got {record_events!r}")
    return cast("BlockHasher", hasher), record_events


def live_seq(seqs: Mapping[SeqId, _T], seq_id: object) -> _T:
    """The live sequence ``seq_id`` names: a well-formed id (``InvalidRequest``) of a live
    sequence (``UnknownSequence``). Every per-sequence call starts here (INV-TXN)."""
    seq = seqs.get(check_seq_id(seq_id))
    if seq is None:
        raise UnknownSequence(f"sequence {seq_id!r} is not live")
    return seq


def check_free_list(seq_ids: object, live: Container[SeqId]) -> list[SeqId]:
    """The ids of a batched ``free``, as a list: each live, none listed twice.

    INV-REF: a sequence released twice would decrement its blocks twice, so a duplicate is
    an error, not silently skipped; and the whole batch is refused before any is released.
    """
    if isinstance(seq_ids, (str, bytes)):
        raise InvalidRequest("free() takes an iterable of sequence ids, not one id")
    try:
        # Each item is checked below; a non-iterable raises TypeError here.
        ids: list[SeqId] = list(cast("Iterable[SeqId]", seq_ids))
    except TypeError:
        raise InvalidRequest(f"free() takes an iterable of ids, got {seq_ids!r}") from None
    seen: set[SeqId] = set()
    for seq_id in ids:
        if check_seq_id(seq_id) not in live:
            raise UnknownSequence(f"sequence {seq_id!r} is not live")
        if seq_id in seen:
            raise DuplicateSequence(f"sequence {seq_id!r} listed twice in one free()")
        seen.add(seq_id)
    return ids


def check_reset(preserve_cache: object, num_live: int) -> bool:
    """``reset``'s argument, and choice 12: a full reset is refused while a sequence is
    live (``CacheBusy``); ``preserve_cache=True`` releases them and keeps the cache."""
    if not isinstance(preserve_cache, bool):
        raise InvalidRequest("preserve_cache must be a bool")
    if not preserve_cache and num_live:
        raise CacheBusy(
            f"full reset refused: {num_live} sequences are live; "
            "free them or use reset(preserve_cache=True)"
        )
    return preserve_cache


# -- sizing ------------------------------------------------------------------------------


def blocks_for(num_tokens: int, block_size: int) -> int:
    """How many blocks hold ``num_tokens`` slots: ``ceil(num_tokens / block_size)``.

    A block table always holds exactly this many blocks for its reserved slots (INV-LIMIT
    while ``kv_token_limit`` is set), so the blocks a call needs are
    ``blocks_for(new reserved) - blocks held``.
    """
    return -(-num_tokens // block_size)


def full_prompt_cap(num_tokens: int, block_size: int) -> int:
    """Choice 4: a hit covers at most ``floor((len - 1) / block_size)`` blocks, so at least
    one prompt token is computed (INV-MATCH)."""
    return (num_tokens - 1) // block_size


def out_of_blocks(need: int, supply: int) -> OutOfBlocks:
    """The error of a reservation that needs ``need`` new blocks when only ``supply`` (free
    plus evictable) can be had; raised before anything changes (choice 9, INV-TXN)."""
    return OutOfBlocks(
        f"need {need} new blocks; only {supply} can be freed (free + evictable), "
        "the rest are held by live sequences"
    )


def chunk_end(
    start: int,
    prompt_len: int,
    budget: int | None,
    limit: int | None,
    spans: Sequence[MultimodalSpan],
) -> int:
    """Where a prefill chunk starting at ``start`` ends (choice 8, INV-LIMIT).

    At most ``budget`` (the step's token budget) and ``kv_token_limit`` tokens. A chunk never
    splits a span (choice 5): its end moves back to the span's start, or, when the chunk
    starts right at the span, forward to the span's end (a span is never longer than the
    limit, so only the step budget can be exceeded, by less than one span).
    """
    end = prompt_len
    if budget is not None:
        end = min(end, start + budget)
    if limit is not None:
        end = min(end, start + limit)
    cut = span_containing(spans, end)
    if cut is not None:
        end = cut.start if cut.start > start else cut.end
    return end


def check_continue(
    seq_id: SeqId, num_new_tokens: object, computed: int, reserved: int, prompt_len: int
) -> None:
    """What ``continue_prefill`` may not do (choice 8): reserve a chunk while prompt tokens
    are left and the previous chunk is committed, so a chunk never holds more than
    ``kv_token_limit`` uncommitted tokens (INV-LIMIT)."""
    if num_new_tokens is not None:
        check_count(num_new_tokens, "num_new_tokens", minimum=1)
    if reserved >= prompt_len:
        raise InvalidOperation(f"sequence {seq_id!r} has no prompt tokens left to prefill")
    if computed != reserved:
        raise InvalidOperation(
            f"sequence {seq_id!r} has {reserved - computed} reserved "
            "tokens not yet committed; commit the current chunk first"
        )


def check_growth(
    seq_id: SeqId,
    reserved: int,
    new_reserved: int,
    computed: int,
    prompt_len: int,
    limit: int | None,
    spans: Sequence[MultimodalSpan],
) -> None:
    """What ``append`` may not do while a prompt is still being prefilled: hold more than
    ``kv_token_limit`` uncommitted prompt tokens (INV-LIMIT), or reserve up to the middle of
    a multimodal span (choice 5)."""
    if reserved >= prompt_len:
        return
    if limit is not None and new_reserved - computed > limit:
        raise InvalidOperation(
            f"sequence {seq_id!r} would hold {new_reserved - computed} uncommitted prompt "
            f"tokens, over its kv_token_limit of {limit}"
        )
    cut = span_containing(spans, new_reserved)
    if cut is not None:
        raise InvalidOperation(f"reserving up to {new_reserved} would split the span {cut!r}")


def check_append(
    seq_id: SeqId,
    num_tokens: int,
    reserved: int,
    computed: int,
    prompt_len: int,
    limit: int | None,
    spans: Sequence[MultimodalSpan],
) -> int:
    """Decode growth (choice 10): ``num_tokens >= 1`` more slots at the tail, under
    :func:`check_growth`'s prefill rules. Returns the new reserved count."""
    if type(num_tokens) is not int or num_tokens < 1:  # the common case skips the call
        check_count(num_tokens, "num_tokens", minimum=1)
    new_reserved = reserved + num_tokens
    check_growth(seq_id, reserved, new_reserved, computed, prompt_len, limit, spans)
    return new_reserved


# -- commit and rollback -----------------------------------------------------------------


def commit_error(seq_id: SeqId, new_computed: int, reserved: int, known: int) -> InvalidOperation:
    """Why ``commit`` cannot mark ``new_computed`` slots as written: past the reservation
    (INV-WRITE: KV lands only in reserved private slots), or past the known tokens
    (INV-PUBLISH: only accepted tokens are ever published)."""
    if new_computed > reserved:
        return InvalidOperation(
            f"cannot commit {new_computed} tokens of {seq_id!r}: only {reserved} slots are reserved"
        )
    return InvalidOperation(
        f"cannot commit KV for {new_computed} tokens of {seq_id!r}: only {known} tokens are known"
    )


def check_commit(
    seq_id: SeqId,
    computed: int,
    reserved: int,
    known: int,
    num_computed: object,
    accepted_tokens: object,
) -> tuple[Sequence[int], int]:
    """``commit``'s arguments against a sequence with ``computed`` written slots,
    ``reserved`` slots and ``known`` tokens; returns the accepted tokens and the new
    computed count (choice 1, INV-WRITE, INV-PUBLISH).

    In this order: the count (``InvalidRequest``), the tokens (``InvalidRequest``), then
    :func:`commit_error`.

    NOTE: on every decode step. A list or tuple of in-range ints (what engines pass) is
    returned as is, without the copy :func:`token_tuple` makes; anything else goes through
    :func:`token_tuple`, so the verdicts are the same. A caller that keeps the tokens must
    copy them (the spec makes a tuple; the manager extends its own array).
    """
    if type(num_computed) is not int or num_computed < 0:
        check_count(num_computed, "num_computed", minimum=0)
    assert isinstance(num_computed, int)
    accepted: Sequence[int]
    if type(accepted_tokens) is list or type(accepted_tokens) is tuple:
        accepted = accepted_tokens
        for t in accepted:
            if type(t) is not int or not 0 <= t <= 4294967295:  # MAX_TOKEN_ID, a constant
                accepted = token_tuple(accepted_tokens, what="accepted_tokens")
                break
    else:
        accepted = token_tuple(accepted_tokens, what="accepted_tokens")
    new_computed = computed + num_computed
    known += len(accepted)
    if new_computed > reserved or new_computed > known:
        raise commit_error(seq_id, new_computed, reserved, known)
    return accepted, new_computed


def check_rollback(
    seq_id: SeqId, num_tokens: int, reserved: int, computed: int, spans: Sequence[MultimodalSpan]
) -> int:
    """``rollback`` gives back only reserved, unwritten slots (choice 2: only the tail
    shrinks, and never below what is written, INV-WRITE), and never cuts a multimodal span
    (choice 5). Returns the new reserved count."""
    if type(num_tokens) is not int or num_tokens < 1:  # the common case skips the call
        check_count(num_tokens, "num_tokens", minimum=1)
    new_reserved = reserved - num_tokens
    if new_reserved < computed:
        raise InvalidOperation(
            f"cannot roll back {num_tokens} slots of {seq_id!r}: only "
            f"{reserved - computed} reserved slots are unwritten"
        )
    cut = span_containing(spans, new_reserved) if spans else None
    if cut is not None:
        raise InvalidOperation(f"rolling back {num_tokens} slots would split {cut!r}")
    return new_reserved


# -- the lost-reuse split ----------------------------------------------------------------


def lost_reuse(
    num_tokens: int,
    block_size: int,
    matched: int,
    window: int,
    attached: int,
    capped: bool,
    evicted: int,
) -> LostReuse:
    """Split a prompt's tokens that a match did not reuse by cause (INV-STATS: with the
    cached tokens they add up to the prompt).

    ``matched`` blocks were found by the walk, ``window`` of them are recomputed privately
    (choice 6), ``attached`` are reused, the rest of the matched ones were dropped by the
    span clamp (choice 5). ``capped``: the full-prompt cap stopped the walk (choice 4).
    ``evicted``: how many full blocks right after the matched ones were published once and
    evicted since; every other prompt token was never cached.
    """
    cap = block_size if capped else 0
    return LostReuse(
        window=window * block_size,
        span=(matched - window - attached) * block_size,
        cap=cap,
        evicted=evicted * block_size,
        never_cached=num_tokens - matched * block_size - cap - evicted * block_size,
    )


class AdmissionCounters(Protocol):
    """The statistics an admission adds to (the fields of ``CacheStats`` it moves)."""

    admissions: int
    queries: int
    hits: int
    prefill_tokens: int
    prefill_tokens_skipped: int
    prefill_tokens_computed: int
    lost_window: int
    lost_span: int
    lost_cap: int
    lost_evicted: int
    lost_never_cached: int
    lost_checkpoint: int


def count_admission(c: AdmissionCounters, num_tokens: int, cached: int, lost: LostReuse) -> None:
    """Add one admission of a ``num_tokens`` prompt, ``cached`` of its tokens reused, to the
    counters (INV-STATS: the hits are the skipped tokens, and the computed ones are split by
    ``lost`` exactly).

    Args:
        c: the cache's counters, updated in place.
        num_tokens: the whole prompt, whatever the first chunk schedules.
        cached: the tokens reused from the cache.
        lost: why the others were not (:func:`lost_reuse`).
    """
    c.admissions += 1
    c.queries += num_tokens
    c.hits += cached
    c.prefill_tokens += num_tokens
    c.prefill_tokens_skipped += cached
    c.prefill_tokens_computed += num_tokens - cached
    c.lost_window += lost.window
    c.lost_span += lost.span
    c.lost_cap += lost.cap
    c.lost_evicted += lost.evicted
    c.lost_never_cached += lost.never_cached
    c.lost_checkpoint += lost.checkpoint


# -- hybrid models: state slots and checkpoints (choices 7 and 11) -----------------------


def check_hybrid_config(
    block_size: int, max_num_seqs: object, state_budget: object, decode_state_interval: object
) -> tuple[int, int, int]:
    """Validate the hybrid knobs; ``decode_state_interval`` is 0 or a multiple of blocks.

    NOTE: a checkpoint hangs off a published block, so a decode save point must be a block
    boundary; an interval that is not a whole number of blocks would never line up (INV-CKPT:
    a restore reads a checkpoint at exactly the matched boundary).
    """
    r = check_count(max_num_seqs, "max_num_seqs", minimum=1)
    b = check_count(state_budget, "state_budget", minimum=0)
    if r + b > MAX_STATE_SLOTS:
        raise InvalidConfig(
            f"max_num_seqs + state_budget must be <= {MAX_STATE_SLOTS} state slots, got {r + b}"
        )
    i = check_count(decode_state_interval, "decode_state_interval", minimum=0)
    if i % block_size:
        raise InvalidRequest(
            f"decode_state_interval must be 0 or a multiple of block_size={block_size}, got {i}"
        )
    return r, b, i


def save_point(computed: int, reserved: int, prompt_len: int, bs: int, interval: int) -> int:
    """Where the state of a sequence must be saved among its unwritten reserved tokens
    (choice 7; INV-CKPT checks every reservation against it).

    ::

        tokens   |<---- computed ---->|<------ reserved, unwritten ------>|
        prefill                       ...[ last complete block of the chunk ]|  <- here
        decode                        ...| k * interval |.................|  <- or here

    The last complete block boundary of the reserved prompt part, or in decode the deepest
    multiple of ``interval``; 0 when neither lies beyond ``computed`` (nothing to save).
    """
    prefill = min(reserved, prompt_len) // bs * bs
    decode = reserved // interval * interval if interval else 0
    point = max(prefill, decode)
    return point if point > computed else 0


def check_routed_experts(value: object, count: int) -> tuple[bytes, ...] | None:
    """``None``, or one ``bytes`` per block that the commit completes (choice 11: the data
    rides on exactly the blocks it describes)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise InvalidRequest(f"routed_experts must be a list of bytes per block, got {value!r}")
    if len(value) != count:
        raise InvalidRequest(
            f"routed_experts has {len(value)} entries; this commit completes {count} blocks"
        )
    for item in value:
        if not isinstance(item, bytes):
            raise InvalidRequest(f"routed_experts entries must be bytes, got {item!r}")
    return tuple(value)


def check_runtime_slots(num_live: int, max_num_seqs: int) -> None:
    """A new sequence needs a runtime state slot: at most ``max_num_seqs`` are live
    (INV-CKPT bounds the slots in use)."""
    if num_live >= max_num_seqs:
        raise OutOfStateSlots(f"{max_num_seqs} sequences are live (max_num_seqs)")


def no_state_slot() -> OutOfStateSlots:
    """The error of an admission that finds every state slot held by a runtime, a
    reservation or a pinned checkpoint (a pinned checkpoint is never released, INV-CKPT)."""
    return OutOfStateSlots("every state slot is held by a runtime or a checkpoint")


def check_restore_pending(seq_id: SeqId, pending: bool) -> None:
    """``restore_issued`` unpins a checkpoint only for a sequence with a restore pending
    (INV-CKPT: the Pinned -> Ready step of the lifecycle)."""
    if not pending:
        raise InvalidOperation(f"sequence {seq_id!r} has no restore pending")


def check_keep_state(seq_id: SeqId, position: object, held: int | None, computed: int) -> int:
    """``keep_state`` may keep only the state after the sequence's ``computed`` committed
    tokens, and only once a pending restore is issued (``held`` is None until then).

    A state past the committed tokens belongs to drafts a rollback may drop; one before
    them is stale (choice 7, INV-CKPT). Returns the position.
    """
    p = check_count(position, "position", minimum=0)
    if held is None:
        raise InvalidOperation(
            f"sequence {seq_id!r} has a restore pending: issue it before keeping a state"
        )
    if p != computed:
        raise InvalidOperation(
            f"cannot keep the state after {p} tokens of {seq_id!r}: only the "
            f"state after its {computed} committed tokens is consistent"
        )
    return p
