"""A call log of the candidate: the failing run, replayed as a program that calls it.

Hypothesis prints a failing run as calls of the machine's rules. The engine developer
reading it wants the calls their block manager received instead, so every operation the
machines make on the candidate goes through a :class:`Recording` proxy that writes it down
as Python source; the log of the last run (the minimal one, after shrinking) is kept on the
machine class.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, MutableSequence, Sequence
from operator import attrgetter
from typing import overload

import attrs

from prefixkv.spec import Admission, LostReuse, Match, MultimodalSpan, Namespace, Request

__all__ = ["HEADER", "CallLog", "Recording", "format_call", "runs", "tokens"]

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


#: Values that cannot change after a call: they may be written as source later.
_ATOMS = frozenset({int, str, bool, float, bytes, type(None)})
#: Frozen records whose fields are all that their ``repr`` shows: settled when every field
#: is (an adapter may build one around a list it keeps changing).
_RECORDS: dict[type, Callable[[object], tuple[object, ...]]] = {
    cls: attrgetter(*(a.name for a in attrs.fields(cls))) for cls in (Match, Admission, LostReuse)
}
#: Validated on construction, frozen, and holding nothing mutable but a sequence id.
_SETTLED_KINDS = (Namespace, MultimodalSpan)


def _settled(value: object) -> bool:
    """``value`` (and everything its ``repr`` shows) cannot change any more."""
    kind = type(value)
    if kind in _ATOMS:
        return True
    if kind is tuple:
        assert isinstance(value, tuple)
        return set(map(type, value)) <= _ATOMS or all(map(_settled, value))
    if kind is Request:
        assert isinstance(value, Request)
        return _settled(value.seq_id)
    fields = _RECORDS.get(kind)
    if fields is not None:
        return _settled(fields(value))
    if isinstance(value, _SETTLED_KINDS):
        return True
    # an int or str subclass without a __dict__ holds nothing but its value
    return isinstance(value, (int, str)) and not hasattr(value, "__dict__")


class _Call:
    """A recorded call, written as source when a replay is read (see :class:`CallLog`)."""

    __slots__ = ("args", "block_size", "kwargs", "name", "raised", "result", "text")

    def __init__(
        self, name: str, args: tuple[object, ...], kwargs: dict[str, object], size: int | None
    ) -> None:
        self.name, self.args, self.kwargs, self.block_size = name, args, kwargs, size
        #: The call's source, when it had to be taken at the call.
        self.text: str | None = None
        #: The result (a ``_Shown`` repr when it could change), or the ``raises`` note.
        self.result: object = None
        self.raised = False

    def call_source(self) -> str:
        if self.text is not None:
            return self.text
        return format_call(self.name, self.args, self.kwargs, self.block_size)

    def source(self) -> str:
        text = self.call_source()
        if self.raised:
            return f"{text}{self.result}"[:160]
        if self.result is None:
            return text
        shown = self.result if type(self.result) is _Shown else repr(self.result)
        assert isinstance(shown, str)
        if len(shown) > _MAX_RESULT:
            shown = shown[: _MAX_RESULT - 3] + "..."
        return f"{text}  # -> {shown}"


class _Shown(str):
    """A result's ``repr`` taken at the call (the result itself could change later)."""


class CallLog(MutableSequence[str]):
    """The lines of a replay. A recorded call is kept as its name and values, and written as
    source only when the line is read (a replay is read only when a check failed).

    NOTE: reading a line later gives the text the call would have given at once: a value
    that could change after the call (a list, an engine's object) is written down at the
    call (:func:`_settled`); the others are immutable and their ``repr`` does not move.
    """

    def __init__(self, lines: Iterable[str] = ()) -> None:
        self._items: list[str | _Call] = list(lines)

    def __len__(self) -> int:
        return len(self._items)

    def _line(self, i: int) -> str:
        item = self._items[i]
        if type(item) is _Call:
            item = self._items[i] = item.source()
        assert isinstance(item, str)
        return item

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self._line(j) for j in range(*i.indices(len(self._items)))]
        return self._line(i)

    @overload
    def __setitem__(self, i: int, value: str) -> None: ...
    @overload
    def __setitem__(self, i: slice, value: Iterable[str]) -> None: ...
    def __setitem__(self, i: int | slice, value: str | Iterable[str]) -> None:
        if isinstance(i, slice):
            assert not isinstance(value, str)
            self._items[i] = list(value)
        else:
            assert isinstance(value, str)
            self._items[i] = value

    def __delitem__(self, i: int | slice) -> None:
        del self._items[i]

    def insert(self, index: int, value: str) -> None:
        self._items.insert(index, value)

    def append(self, value: str) -> None:
        self._items.append(value)

    def record(self, call: _Call) -> None:
        """Add a recorded call, to be written as source when read."""
        self._items.append(call)

    def __iter__(self) -> Iterator[str]:
        return (self._line(i) for i in range(len(self._items)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CallLog):
            return list(self) == list(other)
        return list(self) == other if isinstance(other, list) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, as a list

    def __repr__(self) -> str:
        return f"CallLog({list(self)!r})"


class Recording:
    """Forwards everything to ``target``; method calls are appended to ``log`` as source."""

    def __init__(self, target: object, log: CallLog) -> None:
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
            entry = _Call(name, args, kwargs, size if isinstance(size, int) else None)
            if not (all(map(_settled, args)) and all(map(_settled, kwargs.values()))):
                entry.text = entry.call_source()  # the engine may change what it is passed
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                entry.result = f"  # raises {type(exc).__name__}: {exc}"
                entry.raised = True
                self._log.record(entry)
                raise
            entry.result = result if _settled(result) else _Shown(repr(result))
            self._log.record(entry)
            return result

        return call
