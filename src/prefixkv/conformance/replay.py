"""A call log of the candidate: the failing run, replayed as a program that calls it.

Hypothesis prints a failing run as calls of the machine's rules. The engine developer
reading it wants the calls their block manager received instead, so every operation the
machines make on the candidate goes through a :class:`Recording` proxy that writes it down
as Python source; the log of the last run (the minimal one, after shrinking) is kept on the
machine class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefixkv.spec import Namespace, Request

__all__ = ["HEADER", "Recording", "format_call"]

_MAX_RESULT = 72


#: The first lines of every replay (the machines' sequence ids of every kind print as calls
#: of the classes the second line imports).
HEADER = (
    "from prefixkv.spec import MultimodalSpan, Namespace, Request\n"
    "from prefixkv.conformance.machines.strategies import "
    "EnumId, SubclassedIntId, SubclassedStrId"
)


def _source(value: Any) -> str:
    """``repr``, but requests and namespaces without their default fields."""
    if isinstance(value, Request):
        parts = [repr(value.seq_id), repr(value.token_ids), _source(value.namespace)]
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
    return repr(value)


def format_call(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    parts = [_source(a) for a in args] + [f"{k}={_source(v)}" for k, v in kwargs.items()]
    return f"cache.{name}({', '.join(parts)})"


class Recording:
    """Forwards everything to ``target``; method calls are appended to ``log`` as source."""

    def __init__(self, target: Any, log: list[str]) -> None:
        self._target = target
        self._log = log

    def __getattr__(self, name: str) -> Any:
        try:
            attr = getattr(self._target, name)
        except AttributeError:
            self._log.append(f"cache.{name}  # no such attribute")
            raise
        if not callable(attr):
            return attr
        return self._recorded(name, attr)

    def _recorded(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            text = format_call(name, args, kwargs)
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
