"""The pytest plugin: ``pytest --prefixkv-adapter=module:factory`` runs the conformance kit.

Installed through the ``pytest11`` entry point, so it is active wherever prefixkv is
installed, and does nothing until ``--prefixkv-adapter`` is given. Then the session gains one
test per adapter, ``prefixkv-conformance[module:factory]``, next to the project's own tests
(``--prefixkv-only`` runs it alone)::

    pytest --prefixkv-adapter=my_engine.testing:make_adapter \\
           --prefixkv-capabilities=publish=schedule,eviction=any,-multimodal,-exact \\
           --prefixkv-profile=ci --prefixkv-only --prefixkv-report=conformance.json

The example managers run the same way: ``--prefixkv-adapter=examples.engine_style:make_manager``
from a checkout of prefixkv.

A failure reports every distinct check that failed (``INV-REF``, ``CAN-ADMIT``, ...), root
cause first, each with its minimal run as a short program that calls the adapter, ready to
paste into a regression test. ``--prefixkv-ignore`` and ``--prefixkv-skip-rule`` look past a
known issue; ``--prefixkv-report`` writes it all as JSON.

``--prefixkv-database=DIR`` (or ``redis://host:port/db``, or ``$PREFIXKV_DATABASE``) shares
Hypothesis's example database with other runs: a failure found by any run, on any machine,
is the first example the next run tries (docs/campaigns.md).

NOTE: Hypothesis is imported only when a conformance test runs, so that merely having
prefixkv installed costs other pytest sessions nothing and never breaks them. The
profile is applied to the conformance run alone: loading it globally would change the
settings of the project's own Hypothesis tests.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

from .profiles import PROFILES, default_profile

if TYPE_CHECKING:
    from hypothesis.database import ExampleDatabase

__all__ = ["ConformanceItem"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("prefixkv", "prefixkv conformance kit")
    group.addoption(
        "--prefixkv-adapter",
        action="append",
        default=[],
        metavar="MODULE:FACTORY",
        help="run the conformance machines against this adapter factory (repeatable)",
    )
    group.addoption(
        "--prefixkv-capabilities",
        default="",
        metavar="CHANGES",
        help="capabilities on top of the factory's own, e.g. "
        '"publish=schedule,eviction=any,duplicates=shared,-reset,block-sizes=16|256"',
    )
    group.addoption(
        "--prefixkv-ignore",
        action="append",
        default=[],
        metavar="CHECKS",
        help="checks, check families or failure classes to look past, e.g. "
        '"INV-WRITE,CRASH,INV-PUBLISH#1a2b3c4d" (repeatable)',
    )
    group.addoption(
        "--prefixkv-skip-rule",
        action="append",
        default=[],
        metavar="RULES",
        help='rules that never fire, e.g. "reset,preempt" (repeatable)',
    )
    group.addoption(
        "--prefixkv-max-failures",
        type=int,
        default=8,
        metavar="N",
        help="stop after N root causes, each shrunk to its own replay (default 8)",
    )
    group.addoption(
        "--prefixkv-report",
        default=None,
        metavar="FILE",
        help="write a JSON report of the run (every failed check, replays, timings) to FILE",
    )
    group.addoption(
        "--prefixkv-profile",
        default=None,
        choices=PROFILES,
        help="Hypothesis profile of the conformance run (default: ci when $CI is set, else dev)",
    )
    group.addoption(
        "--prefixkv-steps",
        type=int,
        default=50,
        metavar="N",
        help="most rule steps in one run of the machines (default 50)",
    )
    group.addoption(
        "--prefixkv-examples",
        type=int,
        default=None,
        metavar="N",
        help="number of runs (default: the profile's max_examples)",
    )
    group.addoption(
        "--prefixkv-database",
        default=None,
        metavar="DIR|URL",
        help="example database shared with other runs, whose failures replay first: a "
        "directory, or redis://host:port/db for a fleet (default: $PREFIXKV_DATABASE, "
        "else the profile's own)",
    )
    group.addoption(
        "--prefixkv-max-shrink-s",
        type=float,
        default=None,
        metavar="SECONDS",
        help="most seconds spent shrinking one failure; past it the shortest replay so far "
        "is reported (default: Hypothesis' own 300 s)",
    )
    group.addoption(
        "--prefixkv-only",
        action="store_true",
        help="run only the conformance tests (deselect the session's other tests)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if _in_hypofuzz_run():
        # HypoFuzz collects its targets through pytest, in every worker: this is where its
        # replays of state machine inputs get their forced draws aligned (fuzz_replay), its
        # workers report their tests before the hub's first check (fuzz_hub), and a shrunk
        # failure is saved under newer Hypothesis (fuzz_shrink).
        from .fuzz_hub import report_targets_early
        from .fuzz_replay import align_forced_choices
        from .fuzz_shrink import keep_shrunk_failures

        align_forced_choices()
        report_targets_early()
        keep_shrunk_failures()
    steps = config.getoption("--prefixkv-steps")
    examples = config.getoption("--prefixkv-examples")
    if steps < 1 or (examples is not None and examples < 1):
        raise pytest.UsageError("--prefixkv-steps and --prefixkv-examples must be at least 1")
    if config.getoption("--prefixkv-max-failures") < 1:
        raise pytest.UsageError("--prefixkv-max-failures must be at least 1")
    if config.getoption("--prefixkv-adapter"):
        config.stash[_DATABASE] = _database(config)


def _in_hypofuzz_run() -> bool:
    """Whether this session is HypoFuzz's collection (``hypothesis fuzz``)."""
    from ._compat import in_hypofuzz_run

    return in_hypofuzz_run()


#: The parsed ``--prefixkv-database`` (``None``: the profile's own database).
_DATABASE = pytest.StashKey["ExampleDatabase | None"]()


def _database(config: pytest.Config) -> ExampleDatabase | None:
    """``--prefixkv-database``, else ``$PREFIXKV_DATABASE``, parsed once, before any run: a
    bad value or a Redis server that does not answer is a usage error, not a failed test."""
    from .database import DATABASE_ENV, DatabaseUnavailable, InvalidDatabase, parse_database

    value = config.getoption("--prefixkv-database")
    if value is None:
        value = os.environ.get(DATABASE_ENV, "").strip() or None
    if value is None:
        return None
    try:
        return parse_database(value, connect=True)
    except (InvalidDatabase, DatabaseUnavailable) as exc:
        raise pytest.UsageError(f"--prefixkv-database: {exc}") from None


class ConformanceItem(pytest.Item):
    """One conformance run against one adapter factory."""

    def __init__(self, *, target: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = target

    def runtest(self) -> None:
        """Load the factory and run the machines; a load error fails with one line."""
        from .database import DatabaseUnavailable
        from .runner import capabilities_of, load_factory, run_conformance

        opt = self.config.getoption
        try:
            factory = load_factory(self.target)
            caps = capabilities_of(factory, opt("--prefixkv-capabilities"))
        except (ImportError, ValueError) as exc:
            pytest.fail(f"--prefixkv-adapter={self.target}: {exc}", pytrace=False)
        report_file = opt("--prefixkv-report")
        if report_file and len(opt("--prefixkv-adapter")) > 1:
            stem, dot, ext = report_file.rpartition(".")
            safe = "".join(ch if ch.isalnum() else "_" for ch in self.target)
            report_file = f"{stem}.{safe}.{ext}" if dot else f"{report_file}.{safe}"
        try:
            report = run_conformance(
                factory,
                caps,
                max_examples=opt("--prefixkv-examples"),
                steps=opt("--prefixkv-steps"),
                profile=opt("--prefixkv-profile") or default_profile(),
                ignore=opt("--prefixkv-ignore"),
                skip_rules=opt("--prefixkv-skip-rule"),
                max_failures=opt("--prefixkv-max-failures"),
                report=report_file,
                target=self.target,
                database=self.config.stash.get(_DATABASE, None),
                max_shrink_s=opt("--prefixkv-max-shrink-s"),
            )
        except DatabaseUnavailable as exc:  # the server went away after the start-up check
            pytest.fail(f"--prefixkv-database: {exc}", pytrace=False)
        except ValueError as exc:  # a rule name that is no rule
            pytest.fail(f"--prefixkv-adapter={self.target}: {exc}", pytrace=False)
        self.user_properties.append(("prefixkv-capabilities", caps.describe()))
        self.user_properties.append(("prefixkv-rules", report.rules))
        self.user_properties.append(("prefixkv-operations", report.operations))

    def repr_failure(
        self,
        excinfo: pytest.ExceptionInfo[BaseException],
        style: Any = None,
    ) -> Any:
        """The failed check and the replay, without a traceback of the machines."""
        from .runner import ConformanceFailure

        if isinstance(excinfo.value, ConformanceFailure):
            checks = ", ".join(excinfo.value.report.checks)
            return f"{self.target} failed {checks}\n{excinfo.value}"
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[str, int | None, str]:
        """Where the test comes from: the adapter target."""
        return self.target, None, f"prefixkv-conformance[{self.target}]"


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    ours: list[pytest.Item] = [
        ConformanceItem.from_parent(session, name=f"prefixkv-conformance[{target}]", target=target)
        for target in config.getoption("--prefixkv-adapter")
    ]
    if config.getoption("--prefixkv-only"):
        if items:
            config.hook.pytest_deselected(items=list(items))
        items[:] = ours
    else:
        items.extend(ours)
