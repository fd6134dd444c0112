"""pytest plugin of the engine bug harness: where the package came from, and the first failure.

Loaded in the child pytest (``-p tests.mutation.first_failure``) that runs the engine tests
on a patched copy. Environment:

- ``PREFIXKV_MUTANT_SRC``: the copy's ``PYTHONPATH`` entry; ``prefixkv`` must resolve under
  it (a usage error otherwise: a run that tested the checkout would prove nothing).
- ``PREFIXKV_MUTANT_MODULE`` and ``PREFIXKV_MUTANT_FILE``: the patched module and its file
  in the copy; once the tests are collected, a loaded module must come from that file.
- ``PREFIXKV_MUTANT_REPORT``: where the controller writes a JSON object: ``first`` (the first
  failing report: ``nodeid``, ``when``, ``seconds`` since this plugin was loaded, and
  ``message``, the exception's one-line summary) or null, and ``exitstatus``.

A failing collection report counts too (``when == "collect"``): the mutant crashed at import,
which kills it by a crash rather than by a check.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

_START = time.perf_counter()
_first: dict[str, Any] | None = None


def _summary(report: Any) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    if crash is not None and getattr(crash, "message", ""):
        return str(crash.message).splitlines()[0][:300]
    text = str(getattr(report, "longreprtext", "") or "").strip().splitlines()
    errors = [line for line in text if line.startswith("E ")]
    return ((errors or text or [""])[-1])[:300]


def _record(report: Any, when: str) -> None:
    global _first
    if _first is None:
        _first = {
            "nodeid": report.nodeid,
            "when": when,
            "seconds": round(time.perf_counter() - _START, 2),
            "message": _summary(report),
        }


def _origin(name: str) -> Path | None:
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if file is None and module is None:
        spec = importlib.util.find_spec(name)
        file = spec.origin if spec is not None else None
    return Path(file).resolve() if file else None


def pytest_configure(config: pytest.Config) -> None:
    src = os.environ.get("PREFIXKV_MUTANT_SRC")
    if not src:
        return
    origin = _origin("prefixkv")
    if origin is None or not origin.is_relative_to(Path(src).resolve()):
        raise pytest.UsageError(f"prefixkv resolves to {origin}, not to the copy under {src}")


def pytest_collection_finish(session: pytest.Session) -> None:
    name = os.environ.get("PREFIXKV_MUTANT_MODULE")
    file = os.environ.get("PREFIXKV_MUTANT_FILE")
    if not name or not file or name not in sys.modules:
        return
    origin = _origin(name)
    if origin != Path(file).resolve():
        raise pytest.UsageError(f"{name} was loaded from {origin}, not from the patched {file}")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _record(report, "collect")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _record(report, report.when)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("PREFIXKV_MUTANT_REPORT")
    if not path or hasattr(session.config, "workerinput"):  # xdist workers report upward
        return
    Path(path).write_text(json.dumps({"first": _first, "exitstatus": int(exitstatus)}))
