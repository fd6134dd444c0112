"""Deterministic synthetic workloads, independent of any cache.

Everything here is plain data (tuples of token ids), generated from a seed, so the simulator,
the benchmark, the reference engine and the tests can replay exactly the same traffic and
compare results across runs, machines and cache implementations.

The multi-turn chat workload models the traffic that makes prefix caching pay off: a few
long system prompts shared by many conversations, and conversations whose every turn
re-sends the whole history (system prompt, earlier user turns and replies) plus a new user
turn::

    turn 0 prompt   [ system ][ user 0 ]                       reply 0
    turn 1 prompt   [ system ][ user 0 ][ reply 0 ][ user 1 ]  reply 1
    ...

The last reply token of a turn is sampled but never fed back through the model in that
turn, so it has no KV yet; the next turn's prompt carries it and recomputes it.

This is the one chat workload of the project: the simulator and the cache benchmark replay
it as it is, and ``serve-sim`` (:func:`prefixkv.serving.chat_turns`) serves it through the
reference engine, whose model samples the replies itself (``ChatConfig(draw_replies=False)``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import attrs

from prefixkv.errors import InvalidConfig, require_int
from prefixkv.spec import MultimodalSpan

__all__ = [
    "ChatConfig",
    "ChatTurn",
    "ChatWorkload",
    "Conversation",
    "chat_workload",
    "interleave",
]

Tokens = tuple[int, ...]

# NOTE: the schedule draws from its own stream, so changing how many tokens the generator
# draws (a longer system prompt, say) does not also reshuffle the turn order.
_SCHEDULE_SALT = 0x5EED_C0DE


def _check_range(_: object, attribute: attrs.Attribute[tuple[int, int]], value: object) -> None:
    if (
        not isinstance(value, tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        or not 1 <= value[0] <= value[1]
    ):
        raise InvalidConfig(
            f"{attribute.name} must be a (low, high) pair with 1 <= low <= high, got {value!r}"
        )


def _check_positive(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    require_int(value, attribute.name, minimum=1)


def _check_non_negative(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    require_int(value, attribute.name, minimum=0)


def _check_fraction(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise InvalidConfig(f"{attribute.name} must be a number in [0, 1], got {value!r}")


def _check_bool(_: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidConfig(f"{attribute.name} must be a bool, got {value!r}")


@attrs.frozen
class ChatConfig:
    """Shape of the multi-turn chat workload. Token counts are inclusive ``(low, high)``.

    The defaults are the benchmark workload: 200 conversations of 4 turns, 4 shared
    1,024-token system prompts, user turns of 100-300 tokens and replies of 50-150 tokens.
    """

    conversations: int = attrs.field(default=200, validator=_check_positive)
    turns: int = attrs.field(default=4, validator=_check_positive)
    system_prompts: int = attrs.field(default=4, validator=_check_positive)
    system_tokens: int = attrs.field(default=1024, validator=_check_non_negative)
    user_tokens: tuple[int, int] = attrs.field(default=(100, 300), validator=_check_range)
    reply_tokens: tuple[int, int] = attrs.field(default=(50, 150), validator=_check_range)
    vocab_size: int = attrs.field(default=32_000, validator=_check_positive)
    seed: int = attrs.field(default=0, validator=_check_non_negative)
    #: Tokens per image (0: text only). A user turn carries an image with probability
    #: ``image_rate``, drawn from ``image_pool`` distinct images shared by all conversations.
    #: Every image is ``image_tokens`` copies of one placeholder id (``vocab_size``), so only
    #: the content hash in its span tells two images apart.
    image_tokens: int = attrs.field(default=0, validator=_check_non_negative)
    image_pool: int = attrs.field(default=16, validator=_check_positive)
    image_rate: float = attrs.field(default=0.5, validator=_check_fraction)
    #: False when a model serves the workload and samples each reply itself: only the
    #: reply's length is drawn, and its tokens are placeholders (``vocab_size``, which no
    #: model emits). NOTE: with no reply tokens drawn, every later draw differs from the
    #: same config's replayed workload (a different trace of the same shape). The stream
    #: is then exactly the one ``serve-sim``'s published figures were measured on
    #: (``tests/test_serving.py`` pins it).
    draw_replies: bool = attrs.field(default=True, validator=_check_bool)


@attrs.frozen
class ChatTurn:
    """One request: the whole history plus a new user turn, and the reply it gets.

    ``reply`` holds every token the model samples, the first one included (it is sampled
    at the end of the prefill). ``len(reply) >= 1``.
    """

    conversation: int
    turn: int
    prompt: Tokens
    reply: Tokens
    #: The images in the prompt (history included), in order.
    spans: tuple[MultimodalSpan, ...] = ()

    @property
    def num_tokens(self) -> int:
        """Prompt plus reply: the positions the request occupies when it finishes."""
        return len(self.prompt) + len(self.reply)

    def blocks_touched(self, block_size: int) -> int:
        """Blocks the request's table spans once its reply is complete."""
        return -(-self.num_tokens // block_size)


@attrs.frozen
class Conversation:
    """A conversation: which shared system prompt it starts with, and its turns in order."""

    index: int
    system_prompt: int
    turns: tuple[ChatTurn, ...]


@attrs.frozen
class ChatWorkload:
    """A generated chat workload: the shared system prompts and every conversation."""

    config: ChatConfig
    system_prompts: tuple[Tokens, ...]
    conversations: tuple[Conversation, ...]

    def turns(self) -> Iterator[ChatTurn]:
        """Every turn, conversation by conversation (each conversation's turns in order)."""
        for conv in self.conversations:
            yield from conv.turns

    @property
    def num_requests(self) -> int:
        return sum(len(conv.turns) for conv in self.conversations)

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(t.prompt) for t in self.turns())

    @property
    def num_reply_tokens(self) -> int:
        return sum(len(t.reply) for t in self.turns())

    def blocks_touched(self, block_size: int) -> int:
        """Sum over requests of ``ceil((prompt + reply) / block_size)``."""
        return sum(t.blocks_touched(block_size) for t in self.turns())

    def schedule(self, seed: int | None = None) -> list[ChatTurn]:
        """All turns in a shuffled order that keeps each conversation's turns in order.

        Conversations interleave as they would at a busy server, which is what makes
        eviction order matter. ``seed`` defaults to one derived from the workload's seed.
        """
        if seed is None:
            seed = self.config.seed ^ _SCHEDULE_SALT
        order = interleave([len(conv.turns) for conv in self.conversations], seed)
        return [self.conversations[c].turns[t] for c, t in order]


def interleave(turn_counts: list[int], seed: int) -> list[tuple[int, int]]:
    """A random interleaving of ``(conversation, turn)`` tasks, turns kept in order.

    At each step a conversation is drawn uniformly from those with turns remaining, and its
    next turn is taken; every valid interleaving can come out.
    """
    rng = random.Random(seed)
    next_turn = [0] * len(turn_counts)
    pending = [c for c, n in enumerate(turn_counts) if n > 0]
    order: list[tuple[int, int]] = []
    while pending:
        k = rng.randrange(len(pending))
        c = pending[k]
        order.append((c, next_turn[c]))
        next_turn[c] += 1
        if next_turn[c] == turn_counts[c]:
            # O(1) removal: order within ``pending`` carries no meaning.
            pending[k] = pending[-1]
            pending.pop()
    return order


def _random_tokens(rng: random.Random, count: int, vocab_size: int) -> Tokens:
    return tuple(rng.randrange(vocab_size) for _ in range(count))


def chat_workload(config: ChatConfig | None = None) -> ChatWorkload:
    """Generate the multi-turn chat workload described by ``config`` (default: the benchmark's).

    The same config always yields the same tokens, on any machine: only ``random.Random``
    with an integer seed is used.
    """
    cfg = ChatConfig() if config is None else config
    rng = random.Random(cfg.seed)
    vocab = cfg.vocab_size
    systems = tuple(
        _random_tokens(rng, cfg.system_tokens, vocab) for _ in range(cfg.system_prompts)
    )
    conversations: list[Conversation] = []
    for c in range(cfg.conversations):
        which = rng.randrange(cfg.system_prompts)
        history: Tokens = systems[which]
        spans: tuple[MultimodalSpan, ...] = ()
        turns: list[ChatTurn] = []
        for t in range(cfg.turns):
            user = _random_tokens(rng, rng.randint(*cfg.user_tokens), vocab)
            if cfg.image_tokens and rng.random() < cfg.image_rate:
                start = len(history) + rng.randrange(len(user) + 1)
                image = rng.randrange(cfg.image_pool)
                spans += (_image_span(start, cfg.image_tokens, image),)
                cut = start - len(history)
                user = user[:cut] + (vocab,) * cfg.image_tokens + user[cut:]
            reply_len = rng.randint(*cfg.reply_tokens)
            reply = (
                _random_tokens(rng, reply_len, vocab) if cfg.draw_replies else (vocab,) * reply_len
            )
            # Tuple concatenation shares the int objects, so long histories stay cheap.
            prompt = history + user
            turns.append(ChatTurn(conversation=c, turn=t, prompt=prompt, reply=reply, spans=spans))
            history = prompt + reply
        conversations.append(Conversation(index=c, system_prompt=which, turns=tuple(turns)))
    return ChatWorkload(config=cfg, system_prompts=systems, conversations=tuple(conversations))


def _image_span(start: int, length: int, image: int) -> MultimodalSpan:
    return MultimodalSpan(start, start + length, "image", f"image-{image}".encode())
