"""pytest plugin of the engine bug harness: where the package came from, and the first failure.

Loaded in the child pytest (``-p tests.mutation.first_failure``) that runs the engine tests
on a patched copy. Environment:

- ``PREFIXKV_MUTANT_SRC``: the copy's ``PYTHONPATH`` entry; ``prefixkv`` must resolve under
  it (a usage error otherwise: a run that tested the checkout would prove nothing).
- ``PREFIXKV_MUTANT_MODULE`` and ``PREFIXKV_MUTANT_FILE``: the patched module and its file
  in the copy; once the tests are collected, a loaded module must come from that file.
- ``PREFIXKV_MUTANT_REPORT``: where the controller writes a JSON object: ``first`` (the first
  failing report: ``nodeid``, ``when``, ``seconds`` since ``PREFIXKV_MUTANT_T0``, and
  ``message``, the exception's one-line summary) or null, and ``exitstatus``.
- ``PREFIXKV_MUTANT_T0``: when the process checking the copy started (``time.monotonic()``,
  set by :mod:`tests.mutation.warm` at the fork); without it, when this plugin was loaded.
- ``PREFIXKV_MUTANT_ORDER``: a JSON file ``{"first": [nodeid, ...], "durations": {nodeid:
  seconds}}``. The collected tests run in that order: the listed ones first, in the listed
  order (the tests that caught this bug before, cheapest first), then every other test,
  shortest recorded duration first, and tests with no record last. Every test still runs,
  so a bug that the list misses is still found by the rest of the suite.

The report also says when the first test started (``first_test``: start-up is everything
before it, search everything after), how long the collection took (``collected``), each
test's duration (setup, call and teardown, summed) and every failing test (``failures``:
for a run without ``-x``, the harness's survey of which tests catch a bug).

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

_START = float(os.environ.get("PREFIXKV_MUTANT_T0") or time.monotonic())
_first: dict[str, Any] | None = None
_first_test: float | None = None
_collected: float | None = None
_failures: list[dict[str, Any]] = []
_durations: dict[str, float] = {}


def _now() -> float:
    """Seconds since the process checking the copy started."""
    return round(time.monotonic() - _START, 3)


def _summary(report: Any) -> str:
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    message = getattr(crash, "message", None)
    if message:
        return str(message).splitlines()[0][:300]
    text = str(getattr(report, "longreprtext", "") or "").strip().splitlines()
    errors = [line for line in text if line.startswith("E ")]
    return ((errors or text or [""])[-1])[:300]


def _record(report: Any, when: str) -> None:
    global _first
    failure = {"nodeid": report.nodeid, "when": when, "seconds": _now()}
    failure["message"] = _summary(report)
    _failures.append(failure)
    if _first is None:
        _first = failure


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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    path = os.environ.get("PREFIXKV_MUTANT_ORDER")
    if not path:
        return
    order = json.loads(Path(path).read_text(encoding="utf-8"))
    first = {nodeid: i for i, nodeid in enumerate(order.get("first", []))}
    durations: dict[str, float] = order.get("durations", {})
    unknown = float("inf")

    def rank(pair: tuple[int, pytest.Item]) -> tuple[int, float, int]:
        i, item = pair
        if item.nodeid in first:
            return (0, first[item.nodeid], i)
        return (1, durations.get(item.nodeid, unknown), i)

    items[:] = [item for _, item in sorted(enumerate(items), key=rank)]


def pytest_collection_finish(session: pytest.Session) -> None:
    global _collected
    _collected = _now()
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


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    global _first_test
    if _first_test is None:
        _first_test = _now()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = round(_durations.get(report.nodeid, 0.0) + report.duration, 3)
    if report.failed:
        _record(report, report.when)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("PREFIXKV_MUTANT_REPORT")
    if not path or hasattr(session.config, "workerinput"):  # xdist workers report upward
        return
    result: dict[str, Any] = {"first": _first, "exitstatus": int(exitstatus)}
    result.update(first_test=_first_test, collected=_collected)
    result.update(failures=_failures, durations=_durations)
    Path(path).write_text(json.dumps(result))
