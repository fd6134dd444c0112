"""The pytest plugin: ``pytest --prefixkv-adapter=module:factory`` runs the conformance kit.

Installed through the ``pytest11`` entry point, so it is active wherever prefixkv is
installed, and does nothing until ``--prefixkv-adapter`` is given. Then the session gains one
test per adapter, ``prefixkv-conformance[module:factory]``, next to the project's own tests
(``--prefixkv-only`` runs it alone)::

    pytest --prefixkv-adapter=my_engine.testing:make_adapter \\
           --prefixkv-capabilities=-multimodal,-exact --prefixkv-profile=ci --prefixkv-only

A failure reports the check that failed (``INV-REF``, ``CAN-ADMIT``, ...) and the minimal
run as a short program that calls the adapter, ready to paste into a regression test.

NOTE: Hypothesis is imported only when a conformance test runs, so that merely having
prefixkv installed costs other pytest sessions nothing and never breaks them. The
profile is applied to the conformance run alone: loading it globally would change the
settings of the project's own Hypothesis tests.
"""

from __future__ import annotations

from typing import Any

import pytest

from .profiles import PROFILES, default_profile

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
        help='capabilities on top of the factory\'s own, e.g. "-multimodal,-exact"',
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
        "--prefixkv-only",
        action="store_true",
        help="run only the conformance tests (deselect the session's other tests)",
    )


def pytest_configure(config: pytest.Config) -> None:
    steps = config.getoption("--prefixkv-steps")
    examples = config.getoption("--prefixkv-examples")
    if steps < 1 or (examples is not None and examples < 1):
        raise pytest.UsageError("--prefixkv-steps and --prefixkv-examples must be at least 1")


class ConformanceItem(pytest.Item):
    """One conformance run against one adapter factory."""

    def __init__(self, *, target: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.target = target

    def runtest(self) -> None:
        """Load the factory and run the machines; a load error fails with one line."""
        from .runner import capabilities_of, load_factory, run_conformance

        opt = self.config.getoption
        try:
            factory = load_factory(self.target)
            caps = capabilities_of(factory, opt("--prefixkv-capabilities"))
        except (ImportError, ValueError) as exc:
            pytest.fail(f"--prefixkv-adapter={self.target}: {exc}", pytrace=False)
        report = run_conformance(
            factory,
            caps,
            max_examples=opt("--prefixkv-examples"),
            steps=opt("--prefixkv-steps"),
            profile=opt("--prefixkv-profile") or default_profile(),
        )
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
            return f"{self.target} failed {excinfo.value.check}: {excinfo.value}"
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
