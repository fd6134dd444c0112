"""An n-gram drafter for speculative decoding (prompt-lookup decoding).

It proposes the tokens that followed the most recent earlier occurrence of the sequence's
last ``n`` tokens (trying ``n``, then shorter suffixes). No model, no state: greedy
verification by the target model decides what is kept, so the drafter can only change
speed, never the tokens.

NOTE: model-based drafters (MTP heads, EAGLE) also need the target's hidden states for the
last positions of a cached prefix, which a prefix hit does not recompute. That is what the
private recompute window is for (choice 6): the engine admits speculative requests with
``recompute_blocks = RECOMPUTE_BLOCKS``, so their last matched blocks are recomputed into
fresh private blocks, and the same accounting (``lost_window``) applies as with such a
drafter, even though n-gram drafting itself reads only token ids.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RECOMPUTE_BLOCKS", "NgramDrafter"]

RECOMPUTE_BLOCKS = 1


class NgramDrafter:
    def __init__(self, n: int = 3, max_lookback: int = 512) -> None:
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.n = n
        self.max_lookback = max_lookback

    def propose(self, tokens: Sequence[int], max_tokens: int) -> list[int]:
        if max_tokens <= 0 or len(tokens) < 2:
            return []
        lo = max(0, len(tokens) - self.max_lookback)
        for n in range(min(self.n, len(tokens) - 1), 0, -1):
            suffix = list(tokens[-n:])
            # newest earlier occurrence first: local repetition predicts best
            for start in range(len(tokens) - n - 1, lo - 1, -1):
                if list(tokens[start : start + n]) == suffix:
                    follow = list(tokens[start + n : start + n + max_tokens])
                    if follow:
                        return follow
        return []
