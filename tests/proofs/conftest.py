"""What the proof tests share: running ``prefixkv prove --json`` in a fresh interpreter, and
one report of the rows that were not proved."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import pytest


class _Row(Protocol):
    invariant: str
    operation: str
    status: str
    detail: str


def unproved(rows: Iterable[_Row]) -> str:
    """The rows that are not proved, one paragraph each (empty when all are)."""
    return "\n".join(
        f"{r.invariant}/{r.operation}: {r.status}\n{r.detail}" for r in rows if r.status != "proved"
    )


@pytest.fixture(name="unproved")
def _unproved() -> Callable[[Iterable[_Row]], str]:
    return unproved


@pytest.fixture
def prove_json() -> Callable[..., dict[str, Any]]:
    """``prove_json(*flags)``: the document ``prefixkv prove --json *flags`` prints, after
    checking that it exits 0 (a fresh interpreter, as a CI job would run it)."""

    def run(*flags: str, timeout: int = 600) -> dict[str, Any]:
        proc = subprocess.run(
            [sys.executable, "-m", "prefixkv", "prove", "--json", *flags],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        assert proc.returncode == 0, proc.stderr
        doc: dict[str, Any] = json.loads(proc.stdout)
        return doc

    return run
