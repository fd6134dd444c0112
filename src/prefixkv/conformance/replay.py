"""A call log of the candidate: the failing run, replayed as a program that calls it.

Hypothesis prints a failing run as calls of the machine's rules. The engine developer
reading it wants the calls their block manager received instead, so every operation the
machines make on the candidate goes through a :class:`Recording` proxy that writes it down
as Python source; the log of the last run (the minimal one, after shrinking) is kept on the
machine class.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from prefixkv.spec import Namespace, Request

__all__ = ["HEADER", "Recording", "format_call", "runs", "tokens"]

_MAX_RESULT = 72


#: The first line of every replay (one line: a replay's second line builds the cache). The
#: machines' sequence ids of every kind print as calls of the classes it imports last.
HEADER = (
    "from prefixkv.spec import MultimodalSpan, Namespace, Request; "
    "from prefixkv.conformance.replay import tokens; "
    "from prefixkv.conformance.machines.strategies import "
    "EnumId, SubclassedIntId, SubclassedStrId"
)

_RUN = re.compile(r"^(?:\[(\d+)\.\.(\d+)\]|(\d+)(?:[x\u00d7](\d+))?)$")


def tokens(text: str) -> tuple[int, ...]:
    """The token ids that :func:`runs` wrote: ``"7×256 | [1..16] 3"`` is 256 sevens, then
    1 to 16 and a 3. ``×`` (or ``x``) repeats a token, ``[a..b]`` counts from ``a`` to ``b``
    inclusive, ``|`` marks a block boundary and is only there to be read.

    Raises ``ValueError`` on anything else, naming the part it could not read.
    """
    out: list[int] = []
    for part in text.replace("|", " ").split():
        m = _RUN.match(part)
        if m is None:
            raise ValueError(f"cannot read {part!r} in {text!r}: expected 7, 7×256 or [1..16]")
        first, last, value, count = m.groups()
        if first is not None:
            out.extend(range(int(first), int(last) + 1))
        else:
            out.extend([int(value)] * (int(count) if count is not None else 1))
    return tuple(out)


def _runs_of(chunk: Sequence[int]) -> list[str]:
    parts: list[str] = []
    i = 0
    while i < len(chunk):
        j = i + 1
        while j < len(chunk) and chunk[j] == chunk[i]:
            j += 1
        if j - i > 1:
            parts.append(f"{chunk[i]}\u00d7{j - i}")
            i = j
            continue
        while j < len(chunk) and chunk[j] == chunk[j - 1] + 1:
            j += 1
        if j - i > 2:
            parts.append(f"[{chunk[i]}..{chunk[j - 1]}]")
        else:
            j = i + 1
            parts.append(str(chunk[i]))
        i = j
    return parts


def runs(token_ids: Sequence[int], block_size: int | None = None) -> str:
    """``token_ids`` as runs, block by block: ``"7×256 | [1..16] 3×240"``.

    A token repeated is ``7×n``, a count up by one of three or more is ``[a..b]``, and
    ``|`` separates the blocks of ``block_size`` tokens (none without it). :func:`tokens`
    reads it back.
    """
    size = block_size if block_size else max(1, len(token_ids))
    blocks = [token_ids[i : i + size] for i in range(0, len(token_ids), size)]
    return " | ".join(" ".join(_runs_of(b)) for b in blocks)


def _token_source(value: tuple[int, ...], block_size: int | None) -> str:
    """A tuple of token ids as source: as it is when that is short, else as runs."""
    plain = repr(value)
    if len(value) <= 8 or not all(type(t) is int and t >= 0 for t in value):
        # NOTE: a short tuple reads as well as its runs; every recorded call comes here
        return plain  # (or a bad input the kit tries: shown as it was passed)
    shown = f'tokens("{runs(value, block_size)}")'
    return shown if len(shown) < len(plain) else plain


def _source(value: object, block_size: int | None = None) -> str:
    """``repr``, but requests and namespaces without their default fields, and long token
    tuples as runs, block by block (:func:`runs`)."""
    if isinstance(value, Request):
        tok = _token_source(tuple(value.token_ids), block_size)
        parts = [repr(value.seq_id), tok, _source(value.namespace)]
        if value.spans:
            parts.append(f"spans={value.spans!r}")
        if value.recompute_blocks:
            parts.append(f"recompute_blocks={value.recompute_blocks}")
        if value.kv_token_limit is not None:
            parts.append(f"kv_token_limit={value.kv_token_limit}")
        return f"Request({', '.join(parts)})"
    if isinstance(value, Namespace):
        parts = [repr(value.model)]
        if value.adapter is not None:
            parts.append(f"adapter={value.adapter!r}")
        if value.salt is not None:
            parts.append(f"salt={value.salt!r}")
        return f"Namespace({', '.join(parts)})"
    if type(value) is tuple and value and all(type(t) is int for t in value):
        return _token_source(value, None)  # accepted tokens: not block-aligned
    return repr(value)


def format_call(
    name: str, args: tuple[object, ...], kwargs: dict[str, object], block_size: int | None = None
) -> str:
    """One call as source; with ``block_size``, a request's tokens are shown block by
    block."""
    parts = [_source(a, block_size) for a in args]
    parts += [f"{k}={_source(v, block_size)}" for k, v in kwargs.items()]
    return f"cache.{name}({', '.join(parts)})"


class Recording:
    """Forwards everything to ``target``; method calls are appended to ``log`` as source."""

    def __init__(self, target: object, log: list[str]) -> None:
        self._target = target
        self._log = log

    def __getattr__(self, name: str) -> object:
        try:
            attr = getattr(self._target, name)
        except AttributeError:
            self._log.append(f"cache.{name}  # no such attribute")
            raise
        if not callable(attr):
            return attr
        return self._recorded(name, attr)

    def _recorded(self, name: str, fn: Callable[..., object]) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            size = getattr(self._target, "block_size", None)
            text = format_call(name, args, kwargs, size if isinstance(size, int) else None)
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                self._log.append(f"{text}  # raises {type(exc).__name__}: {exc}"[:160])
                raise
            if result is not None:
                shown = repr(result)
                if len(shown) > _MAX_RESULT:
                    shown = shown[: _MAX_RESULT - 3] + "..."
                text += f"  # -> {shown}"
            self._log.append(text)
            return result

        return call
