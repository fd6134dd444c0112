"""Every Hypothesis and HypoFuzz internal the kit reaches, in one place, with its gates.

Neither library promises these names: a release may rename or drop any of them. So the
rest of the kit reaches them only through this module, each use is gated (a version range,
or the name's presence, with a fallback that keeps runs correct), and :data:`REACHED` lists
every name, so that one test (``tests/conformance/test_compat.py``) fails naming the one an
upgrade removed:

* the machines' rule table (``RuleBasedStateMachine.setup_state`` and its ``Rule``
  records) and their bundles (``bundle``, ``names_to_values``): :func:`rules_of`,
  :func:`prune_bundle`;
* the shrink-time cap (``engine.MAX_SHRINKING_SECONDS``): :func:`shrink_time_limit`;
* three mends of HypoFuzz 25.11.1, installed only in HypoFuzz runs on the releases known to
  need them (up to :data:`AFFECTED_UP_TO`): :func:`align_forced_choices`
  (:mod:`.fuzz_replay` explains the defect), :func:`report_targets_early`
  (:mod:`.fuzz_hub`) and :func:`keep_shrunk_failures` (:mod:`.fuzz_shrink`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import inspect
import sys
from collections.abc import Callable, Iterator
from types import FunctionType
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

import attrs

if TYPE_CHECKING:
    from hypothesis.stateful import RuleBasedStateMachine

__all__ = [
    "AFFECTED_UP_TO",
    "REACHED",
    "Reached",
    "RuleInfo",
    "align_forced_choices",
    "hypofuzz_version",
    "in_hypofuzz_run",
    "installed",
    "keep_shrunk_failures",
    "missing",
    "prune_bundle",
    "report_targets_early",
    "rules_of",
    "shrink_time_limit",
]

#: The newest HypoFuzz release known to need the three mends.
AFFECTED_UP_TO = (25, 11, 1)

_F = TypeVar("_F", bound=Callable[..., object])


@attrs.frozen
class Reached:
    """One internal name the kit reaches.

    ``kind``: ``"attribute"`` (a class or module attribute, ``name`` dotted from the
    module), ``"parameter"`` (the last part of ``name`` is a parameter of the callable the
    rest names) or ``"instance"`` (the last part is an attribute the class's own code sets
    on its instances, ``self.<it>``). ``package`` gates it: HypoFuzz names are needed only
    on the releases the mends install on.
    """

    package: Literal["hypothesis", "hypofuzz"]
    module: str
    name: str
    kind: Literal["attribute", "parameter", "instance"]
    why: str


#: Every internal name reached from the kit (see the module doc).
REACHED: tuple[Reached, ...] = (
    Reached(
        "hypothesis", "hypothesis.stateful", "RuleBasedStateMachine.setup_state", "attribute",
        "rules_of: the rules and initialize rules of a machine class",
    ),
    Reached(
        "hypothesis", "hypothesis.stateful", "Rule.function", "instance",
        "rules_of: a rule's function (its name)",
    ),
    Reached(
        "hypothesis", "hypothesis.stateful", "Rule.preconditions", "instance",
        "rules_of: a rule's preconditions (why a rule never fired)",
    ),
    Reached(
        "hypothesis", "hypothesis.stateful", "RuleBasedStateMachine.bundle", "attribute",
        "prune_bundle: the live entries of a bundle",
    ),
    Reached(
        "hypothesis", "hypothesis.stateful", "RuleBasedStateMachine.names_to_values",
        "instance", "prune_bundle: a bundle entry's value",
    ),
    Reached(
        "hypothesis", "hypothesis.internal.conjecture.engine", "MAX_SHRINKING_SECONDS",
        "attribute", "shrink_time_limit: Hypothesis has no setting for the shrink-time cap",
    ),
    Reached(
        "hypothesis", "hypothesis.internal.conjecture.data", "ConjectureData._draw",
        "attribute", "align_forced_choices: wraps every draw",
    ),
    Reached(
        "hypothesis", "hypothesis.internal.conjecture.data", "ConjectureData.prefix",
        "instance", "align_forced_choices: a replayed prefix is Hypothesis's own",
    ),
    Reached(
        "hypothesis", "hypothesis.internal.conjecture.data", "ConjectureData.index",
        "instance", "align_forced_choices: the position in that prefix",
    ),
    Reached(
        "hypothesis", "hypothesis.internal.conjecture.data", "ConjectureResult.span_comments",
        "parameter", "keep_shrunk_failures: the name HypoFuzz reads as slice_comments",
    ),
    Reached(
        "hypofuzz", "hypofuzz.detection", "in_hypofuzz_run", "attribute",
        "in_hypofuzz_run: the plugin mends HypoFuzz's collection only",
    ),
    Reached(
        "hypofuzz", "hypofuzz.provider", "HypofuzzProvider._state", "instance",
        "align_forced_choices: the provider's replay state",
    ),
    Reached(
        "hypofuzz", "hypofuzz.provider", "State.choices", "instance",
        "align_forced_choices: the recorded choices being replayed",
    ),
    Reached(
        "hypofuzz", "hypofuzz.provider", "State.choice_index", "instance",
        "align_forced_choices: the replay's position",
    ),
    Reached(
        "hypofuzz", "hypofuzz.hypofuzz", "FuzzWorker._update_targets", "attribute",
        "report_targets_early: wraps a worker taking its assignment",
    ),
    Reached(
        "hypofuzz", "hypofuzz.hypofuzz", "FuzzWorker.valid_targets", "attribute",
        "report_targets_early: the tests a worker may still fuzz",
    ),
    Reached(
        "hypofuzz", "hypofuzz.hypofuzz", "FuzzWorker.shared_state", "parameter",
        "report_targets_early: what the hub reads",
    ),
)  # fmt: skip


def _resolve(module: str, dotted: str) -> object:
    obj: object = importlib.import_module(module)
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def missing(reached: Reached) -> str | None:
    """Why ``reached`` is not there in the installed release, or ``None`` when it is.

    Args:
        reached: an entry of :data:`REACHED`.

    Returns:
        A sentence naming the release and the name, or ``None``.
    """
    owner, _, last = reached.name.rpartition(".")
    try:
        if reached.kind == "attribute":
            _resolve(reached.module, reached.name)
            return None
        target = _resolve(reached.module, owner)
        if reached.kind == "parameter":
            if callable(target) and last in inspect.signature(target).parameters:
                return None
        elif isinstance(target, type):
            fields = getattr(target, "__dataclass_fields__", None) or {}
            attrs_fields = getattr(target, "__attrs_attrs__", ())
            if last in fields or any(f.name == last for f in attrs_fields):
                return None
            if f"self.{last}" in inspect.getsource(target):
                return None
    except (ImportError, AttributeError, TypeError, ValueError, OSError) as exc:
        cause = f" ({type(exc).__name__}: {exc})"
    else:
        cause = ""
    version = _version(reached.package)
    return (
        f"{reached.package} {version} has no {reached.module}.{reached.name} ({reached.kind})"
        f"{cause}; prefixkv.conformance._compat reaches it for {reached.why}"
    )


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def hypofuzz_version() -> tuple[int, ...] | None:
    """HypoFuzz's release as numbers (``(25, 11, 1)``), or ``None`` when it is not installed."""
    try:
        text = importlib.metadata.version("hypofuzz")
    except importlib.metadata.PackageNotFoundError:
        return None
    parts: list[int] = []
    for part in text.split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def in_hypofuzz_run() -> bool:
    """Whether this session is HypoFuzz's collection (``hypothesis fuzz``). HypoFuzz is
    imported by then; without it nothing is imported here."""
    detection = sys.modules.get("hypofuzz.detection")
    check = getattr(detection, "in_hypofuzz_run", None)
    return callable(check) and bool(check())


def mends_due(*, force: bool = False) -> bool:
    """Whether the HypoFuzz mends apply: HypoFuzz is installed, and is a release up to
    :data:`AFFECTED_UP_TO` (``force``: any release)."""
    version = hypofuzz_version()
    return version is not None and (version <= AFFECTED_UP_TO or force)


# -- the state machines' rule table and bundles ------------------------------------------


@attrs.frozen
class RuleInfo:
    """One rule of a machine class: its function's name and its preconditions."""

    name: str
    preconditions: tuple[Callable[[object], object], ...]
    initialize: bool = False


class _Rule(Protocol):
    function: Callable[..., object]
    preconditions: tuple[Callable[[object], object], ...]


def rules_of(machine: type[RuleBasedStateMachine]) -> list[RuleInfo]:
    """Every rule and initialize rule of a Hypothesis machine class, as Hypothesis sees it.

    Args:
        machine: a ``RuleBasedStateMachine`` subclass.

    Returns:
        Its rules, then its initialize rules.
    """
    state = machine.setup_state()
    rules: list[_Rule] = list(state.rules)
    inits: list[_Rule] = list(state.initializers)
    return [
        RuleInfo(r.function.__name__, tuple(r.preconditions), initialize=r in inits)
        for r in (*rules, *inits)
    ]


def prune_bundle(machine: object, name: str, keep: Callable[[object], bool]) -> None:
    """Drop from the bundle ``name`` of a running machine the entries whose value fails
    ``keep`` (a no-op on a Hypothesis without these internals: the entries stay drawable,
    and rules refuse them as they would any stale id).

    Args:
        machine: a running ``RuleBasedStateMachine``.
        name: the bundle's name.
        keep: ``value -> whether it stays``.
    """
    bundle = getattr(machine, "bundle", None)
    values = getattr(machine, "names_to_values", None)
    if bundle is None or values is None:  # pragma: no cover - other Hypothesis internals
        return
    entries: list[object] = bundle(name)
    entries[:] = [ref for ref in entries if keep(values[getattr(ref, "name")])]  # noqa: B009


@contextlib.contextmanager
def shrink_time_limit(seconds: float | None) -> Iterator[None]:
    """Hypothesis stops shrinking after ``seconds`` and fails with the shortest failing run
    found so far.

    NOTE: Hypothesis has no setting for it: its engine reads the module constant
    ``MAX_SHRINKING_SECONDS`` (300) when it starts to shrink, and then replays the best
    run so far. The constant is set for this run only and restored after it; if a future
    Hypothesis drops it, the cap is a no-op (the run is still correct, only longer).

    Args:
        seconds: the cap (``None``: Hypothesis's own).
    """
    engine = importlib.import_module("hypothesis.internal.conjecture.engine")
    before = getattr(engine, "MAX_SHRINKING_SECONDS", None)
    if seconds is None or before is None:
        yield
        return
    setattr(engine, "MAX_SHRINKING_SECONDS", seconds)  # noqa: B010
    try:
        yield
    finally:
        setattr(engine, "MAX_SHRINKING_SECONDS", before)  # noqa: B010


# -- HypoFuzz mends (see fuzz_replay, fuzz_hub and fuzz_shrink for the defects) -----------

#: Marks the wrapped ``ConjectureData._draw``, so that installing twice wraps once.
_ALIGNED = "_prefixkv_aligns_forced_choices"
#: Marks the wrapped ``FuzzWorker._update_targets``, so that installing twice wraps once.
_REPORTS = "_prefixkv_reports_targets_early"

#: HypoFuzz's coverage collector ignores code whose file name is ``<...>`` (generated code).
#: The wrapper's own branches differ between a first run (the choices run out) and its
#: re-run (they do not); traced, they alone would make every re-run unstable again.
_UNTRACED_FILENAME = "<prefixkv.conformance.fuzz_replay>"


def _untraced(function: _F) -> _F:
    """``function`` with a code object named like generated code, which coverage skips."""
    assert isinstance(function, FunctionType)
    function.__code__ = function.__code__.replace(co_filename=_UNTRACED_FILENAME)
    return function


def _wrap(owner: type, name: str, wrapper: Callable[..., object], mark: str) -> None:
    """``owner.<name> = wrapper``, marked and pointing at what it wraps."""
    setattr(wrapper, mark, True)
    setattr(wrapper, "__wrapped__", getattr(owner, name))  # noqa: B010
    setattr(owner, name, wrapper)


def installed() -> bool:
    """Whether :func:`align_forced_choices` is in place in this process."""
    from hypothesis.internal.conjecture.data import ConjectureData

    return bool(getattr(ConjectureData._draw, _ALIGNED, False))


def align_forced_choices(*, force: bool = False) -> bool:
    """Make HypoFuzz's provider step over forced draws when it replays a recorded input.

    Returns whether the alignment is in place afterwards. It is installed only on HypoFuzz
    releases up to :data:`AFFECTED_UP_TO` (``force=True``: any release), and only when the
    private attributes it relies on are there.
    """
    if not mends_due(force=force):
        return False
    from hypofuzz.provider import HypofuzzProvider, State
    from hypothesis.internal.conjecture.data import ConjectureData

    if installed():
        return True
    fields = getattr(State, "__dataclass_fields__", {})
    if not {"choices", "choice_index"} <= set(fields) or not hasattr(ConjectureData, "_draw"):
        return False
    draw: Callable[..., object] = ConjectureData._draw

    @_untraced
    def aligned_draw(
        self: ConjectureData,
        choice_type: object,
        constraints: object,
        *,
        observe: bool,
        forced: object,
    ) -> object:
        # A forced draw never reaches the provider, but its value sits in the recorded
        # sequence the provider replays: consume that position, so that the next draw the
        # provider answers reads the value recorded for it. (Within a ``for_choices``
        # prefix Hypothesis replays by itself and handles forced draws already.)
        provider = self.provider
        state = getattr(provider, "_state", None)
        if (
            forced is not None
            and observe
            and isinstance(provider, HypofuzzProvider)
            and state is not None
            and not (self.prefix is not None and self.index < len(self.prefix))
            and state.choice_index < len(state.choices)
        ):
            state.choice_index += 1
        return draw(self, choice_type, constraints, observe=observe, forced=forced)

    _wrap(ConjectureData, "_draw", aligned_draw, _ALIGNED)
    return True


def report_targets_early(*, force: bool = False) -> bool:
    """Make HypoFuzz workers report their tests to the hub before fuzzing them.

    Returns whether it is in place afterwards: only on HypoFuzz releases up to
    :data:`AFFECTED_UP_TO` (``force=True``: any release).
    """
    if not mends_due(force=force):
        return False
    from hypofuzz.hypofuzz import FuzzWorker

    update = getattr(FuzzWorker, "_update_targets", None)
    if update is None or not hasattr(FuzzWorker, "valid_targets"):
        return False
    if getattr(update, _REPORTS, False):
        return True

    def update_and_report(self: FuzzWorker, nodeids: list[str]) -> None:
        update(self, nodeids)
        # The hub stops when every worker reports no test left; a worker that has just
        # been given tests it has not fuzzed yet has some.
        self.shared_state["worker_state"]["valid_nodeids"] = [
            target.nodeid for target in self.valid_targets
        ]

    _wrap(FuzzWorker, "_update_targets", update_and_report, _REPORTS)
    return True


def _get_comments(self: object) -> object:
    return getattr(self, "span_comments")  # noqa: B009


def _set_comments(self: object, value: object) -> None:
    setattr(self, "span_comments", value)  # noqa: B010


def keep_shrunk_failures(*, force: bool = False) -> bool:
    """Alias ``slice_comments`` to ``span_comments`` on Hypothesis's ``ConjectureData`` and
    ``ConjectureResult``. Returns whether the alias is in place afterwards."""
    if not mends_due(force=force):
        return False
    from hypothesis.internal.conjecture.data import ConjectureData, ConjectureResult

    classes = (ConjectureData, ConjectureResult)
    if all(isinstance(getattr(c, "slice_comments", None), property) for c in classes):
        return True  # installed already
    if any(hasattr(c, "slice_comments") for c in classes):
        return False  # Hypothesis has the old name itself
    if "span_comments" not in inspect.signature(ConjectureResult).parameters:
        return False  # neither name: nothing to alias
    setattr(ConjectureData, "slice_comments", property(_get_comments, _set_comments))  # noqa: B010
    setattr(ConjectureResult, "slice_comments", property(_get_comments))  # noqa: B010
    return True
