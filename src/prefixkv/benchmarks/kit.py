"""The conformance kit's throughput: checked operations per second, and time to a failure.

Two measurements, one run::

    python -m prefixkv.benchmarks.kit [--baseline TREE] [--examples 20] [--processes 5]

1. **Checked operations per second** on every example manager (:data:`TARGETS`: the adapters
   of ``examples/`` and :mod:`prefixkv.conformance.reference_adapters`). A *checked
   operation* is one the oracle ran on the candidate (and, in the exact mode, on the spec)
   and then checked: every invariant, the transaction and purity checks, the snapshots
   compared. Each value is the CPU time of one derandomized ``run_conformance`` under the
   ``ci`` profile (``--examples`` runs of up to ``--steps`` rule steps) in a fresh pyperf
   worker process, after a warm-up run, divided by the operations that run issued; the
   report gives the median and the spread of ``--processes`` values (:mod:`.worker`'s
   ``kit`` case). The values are taken in rounds: each round runs every manager on every
   side once, in a fresh process each, so the two sides of a ratio share the machine's load
   as it drifts.
2. **Time to the first failure** of every seeded bug of the example managers
   (:data:`BUG_MODULES`), each in a fresh process: the seconds until the kit's first failed
   check, then the seconds its shrink took (to the end, with Hypothesis' own cap), also in
   CPU seconds (on a shared machine the wall clock mostly measures the other jobs), the
   check that caught it and the steps of its replay.

``--baseline TREE`` measures another source tree's kit (another checkout: its package laid
out as installed, and its root for ``examples/``, first on ``PYTHONPATH``) in the same run,
case by case interleaved with this tree's, so the ratios compare the two on the same load.
Both sides run this tree's worker (the same timing code); only the kit and the managers they
import differ.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from prefixkv.outputs import Machine, machine_info, to_json

from .checkout import baseline_env, import_root
from .errors import BenchmarkFailed
from .timing import TimingSummary, run_pyperf

__all__ = [
    "BUG_MODULES",
    "TARGETS",
    "FirstFailure",
    "KitBenchResult",
    "Throughput",
    "first_failure",
    "main",
    "render_markdown",
    "run_kit_bench",
    "seeded_bugs",
]

#: label -> the adapter factory (``module:factory``) of every example manager.
TARGETS: dict[str, str] = {
    "engine_style": "examples.engine_style:make_manager",
    "vllm_style": "examples.vllm_style_adapter:make_manager",
    "radix_style": "examples.radix_style_adapter:make_manager",
    "hybrid_style": "examples.hybrid_style_adapter:make_manager",
    "minimal_engine": "examples.minimal_engine_adapter:make_manager",
    "mtp_engine": "examples.mtp_engine_adapter:make_manager",
    "impl (exact)": "prefixkv.conformance.reference_adapters:impl_adapter",
    "spec (exact)": "prefixkv.conformance.reference_adapters:spec_adapter",
    "hybrid impl (exact)": "prefixkv.conformance.reference_adapters:hybrid_impl_adapter",
}

#: The modules whose seeded bugs are timed: ``BUG_FACTORIES`` (name -> factory), or
#: ``BUGS`` (name -> buggy class) with ``factory_for(cls)``.
BUG_MODULES = (
    "examples.engine_style",
    "examples.vllm_style_adapter",
    "examples.radix_style_adapter",
    "examples.hybrid_style_adapter",
    "examples.minimal_engine_adapter",
    "examples.mtp_engine_adapter",
)

#: The search of a bug run: the tests' (tests/conformance/kit_runs.py).
BUG_EXAMPLES = 500
STEPS = 30

_SIDES = ("baseline", "this")


@attrs.frozen
class Throughput:
    """One manager on one side: checked operations per second over the values."""

    label: str
    side: str
    #: The values, CPU µs per checked operation (one per worker process).
    timing: TimingSummary

    @property
    def ops_per_s(self) -> float:
        return 1e6 / self.timing.median_us

    @property
    def spread(self) -> tuple[float, float]:
        """Operations per second at the slowest and the fastest value."""
        return 1e6 / self.timing.max_us, 1e6 / self.timing.min_us


@attrs.frozen
class FirstFailure:
    """One seeded bug's run, in a fresh process."""

    bug: str
    check: str
    #: Seconds from the run's start to the first failed check (the search).
    first_s: float
    #: Seconds the shrink of that failure took.
    shrink_s: float
    shrink_capped: bool
    #: Rule steps of the shrunk replay.
    steps: int
    #: The same two spans in this process's CPU seconds: on a machine shared with other
    #: jobs the wall-clock seconds mostly measure them.
    first_cpu_s: float = 0.0
    shrink_cpu_s: float = 0.0
    #: Calls of the candidate in the shrunk replay (building it not counted).
    calls: int = 0


@attrs.frozen
class KitBenchResult:
    machine: Machine
    examples: int
    steps: int
    processes: int
    baseline: bool
    throughput: tuple[Throughput, ...]
    bugs: tuple[FirstFailure, ...]

    def ratio(self, label: str) -> float | None:
        """This tree's operations per second over the baseline's (median over median)."""
        by = {(t.label, t.side): t for t in self.throughput}
        base, this = by.get((label, "baseline")), by.get((label, "this"))
        if base is None or this is None:
            return None
        return this.ops_per_s / base.ops_per_s


# -- where each side's code comes from --------------------------------------------------


def this_tree() -> Path:
    """The source checkout this package runs from (its root holds ``examples/``)."""
    root = Path(__file__).resolve().parents[3]
    if not (root / "examples").is_dir():
        raise BenchmarkFailed(
            f"{root} has no examples/: run the kit benchmark from a source checkout"
        )
    return root


def _env(tree: Path, workdir: Path) -> dict[str, str]:
    """This process's environment with ``tree``'s package and examples first.

    NOTE: ``tree/src`` on ``PYTHONPATH`` is not enough: the checkout's ``prefixkv.spec``,
    ``.impl`` and the others live outside ``src/`` (its ``package-dir``), so they would
    come from whatever prefixkv is installed here, a mix of two trees. The package is
    imported from a tree laid out as the install would (:func:`.checkout.import_root`),
    built once per tree under ``workdir``.
    """
    root = workdir / ("import-" + hashlib.sha256(str(tree).encode()).hexdigest()[:12])
    if not root.exists():
        import_root(tree, root)
    return baseline_env(root, tree)


def _check_side(tree: Path, workdir: Path) -> None:
    """The side's processes import prefixkv and the examples from ``tree``, not from here."""
    probe = (
        "import os, prefixkv, prefixkv.spec, prefixkv.impl, prefixkv.conformance, examples\n"
        "for m in (prefixkv, prefixkv.spec, prefixkv.impl, prefixkv.conformance, examples):\n"
        "    print(os.path.realpath(m.__file__))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=False,
        env=_env(tree, workdir),
        cwd=workdir,
    )
    found = done.stdout.split()
    if done.returncode != 0 or len(found) != 5:
        raise BenchmarkFailed(f"{tree} does not import: {done.stderr.strip()[-300:]}")
    for module in found:
        if not Path(module).resolve().is_relative_to(tree.resolve()):
            raise BenchmarkFailed(f"{tree}: the import resolved to {module}, another tree")


def _has_target(tree: Path, target: str) -> bool:
    module = target.split(":", 1)[0]
    rel = Path(*module.split("."))
    return any((base / rel).with_suffix(".py").is_file() for base in (tree / "src", tree))


# -- throughput -----------------------------------------------------------------------------


def run_throughput(
    trees: dict[str, Path],
    *,
    examples: int,
    steps: int,
    processes: int,
    warmups: int,
    workdir: Path,
    log: Callable[[str], None],
    targets: dict[str, str] | None = None,
) -> list[Throughput]:
    """Every target on every side (``side -> tree``), interleaved target by target."""
    worker = str(Path(__file__).with_name("worker.py"))
    runner = f"import runpy; runpy.run_path({worker!r}, run_name='__main__')"
    cases: list[dict[str, Any]] = []
    for label, target in (targets or TARGETS).items():
        for side, tree in trees.items():
            if not _has_target(tree, target):
                log(f"{side} has no {target}: skipped")
                continue
            case = {"kind": "kit", "side": side, "label": label, "target": target}
            cases.append({**case, "examples": examples, "steps": steps, "tree": str(tree)})

    def launch(case: dict[str, Any]) -> tuple[list[str], dict[str, str] | None]:
        return [sys.executable, "-c", runner], _env(Path(case["tree"]), workdir)

    def options(case: dict[str, Any]) -> list[str]:
        return ["-p", "1", "-n", "1", "-w", str(warmups), "-l", "1"]

    # run_pyperf starts every worker in ``workdir``, which its ``-c`` puts first on sys.path.
    timings = run_pyperf(cases, processes, options, workdir, log, launch=launch)
    from .worker import case_name

    return [Throughput(c["label"], c["side"], timings[case_name(c)].summary()) for c in cases]


# -- time to the first failure -------------------------------------------------------------


def seeded_bugs() -> dict[str, tuple[str, str]]:
    """``module.bug`` -> (module, bug name) for every seeded bug of :data:`BUG_MODULES`."""
    found: dict[str, tuple[str, str]] = {}
    for name in BUG_MODULES:
        module = importlib.import_module(name)
        table = getattr(module, "BUG_FACTORIES", None) or module.BUGS
        for bug in table:
            found[f"{name.removeprefix('examples.')}.{bug}"] = (name, bug)
    return found


def _bug_factory(module_name: str, bug: str) -> Any:
    module = importlib.import_module(module_name)
    table = getattr(module, "BUG_FACTORIES", None)
    if table is not None:
        return table[bug]
    return module.factory_for(module.BUGS[bug])


def first_failure(module_name: str, bug: str, *, max_shrink_s: float | None = None) -> FirstFailure:
    """Run the kit on one seeded bug (in this process) until its first failure, shrunk."""
    from prefixkv.conformance import ConformanceFailure, run_conformance
    from prefixkv.conformance.failures import failure_listeners

    factory = _bug_factory(module_name, bug)
    cpu: list[float] = []  # CPU seconds at the first failed check

    def first(_: object) -> None:
        if not cpu:
            cpu.append(time.process_time())

    failure_listeners.append(first)
    start = time.process_time()
    try:
        run_conformance(
            factory,
            max_examples=BUG_EXAMPLES,
            steps=STEPS,
            profile="ci",
            max_failures=1,
            max_shrink_s=max_shrink_s,
        )
    except ConformanceFailure as exc:
        end = time.process_time()
        f = exc.report.failures[0]
        seen = cpu[0] if cpu else end
        return FirstFailure(
            f"{module_name.removeprefix('examples.')}.{bug}",
            f.check,
            f.first_seen_s,
            f.shrink_s,
            f.shrink_capped,
            f.steps,
            seen - start,
            end - seen,
            sum(1 for line in f.calls if line.startswith("cache.")),
        )
    finally:
        failure_listeners.remove(first)
    raise BenchmarkFailed(f"{module_name}:{bug} was not caught in {BUG_EXAMPLES} runs")


def run_first_failures(
    workdir: Path, log: Callable[[str], None], only: str = ""
) -> list[FirstFailure]:
    """Every seeded bug in a fresh process of its own (this tree)."""
    out: list[FirstFailure] = []
    tree = this_tree()
    for key, (module, bug) in seeded_bugs().items():
        if only and only not in key:
            continue
        log(f"first failure: {key}")
        cmd = [sys.executable, "-m", "prefixkv.benchmarks.kit", "--first-failure", module, bug]
        done = subprocess.run(
            cmd, capture_output=True, text=True, check=False, env=_env(tree, workdir), cwd=workdir
        )
        if done.returncode != 0:
            raise BenchmarkFailed(f"{key} failed: {done.stderr.strip()[-300:]}")
        out.append(FirstFailure(**json.loads(done.stdout.strip().splitlines()[-1])))
    return out


# -- the run, and its report -----------------------------------------------------------------


def run_kit_bench(
    *,
    baseline: Path | None,
    examples: int,
    steps: int,
    processes: int,
    warmups: int,
    bugs: bool,
    throughput: bool = True,
    only: str = "",
    log: Callable[[str], None] = lambda _: None,
) -> KitBenchResult:
    """Both measurements (see the module doc)."""
    trees = {"this": this_tree()}
    if baseline is not None:
        trees = {"baseline": baseline.resolve(), **trees}
    targets = {k: v for k, v in TARGETS.items() if only in k}
    with tempfile.TemporaryDirectory(prefix="prefixkv-kit-bench-") as tmp:
        work = Path(tmp)
        for tree in trees.values():
            _check_side(tree, work)
        rows = (
            run_throughput(
                trees,
                examples=examples,
                steps=steps,
                processes=processes,
                warmups=warmups,
                workdir=work,
                log=log,
                targets=targets,
            )
            if throughput
            else []
        )
        failures = run_first_failures(work, log, only) if bugs else []
    return KitBenchResult(
        machine_info(),
        examples,
        steps,
        processes,
        baseline is not None,
        tuple(rows),
        tuple(failures),
    )


def render_markdown(result: KitBenchResult) -> str:
    """The result as the tables of ``docs/benchmarks.md``."""
    lines: list[str] = []
    if result.throughput:
        lines += [
            "| manager | side | checked ops per CPU second (median) | slowest - fastest | ratio |",
            "|---|---|---:|---:|---:|",
        ]
        for t in result.throughput:
            lo, hi = t.spread
            ratio = result.ratio(t.label) if t.side == "this" else None
            lines.append(
                f"| {t.label} | {'baseline' if t.side == 'baseline' else 'this tree'} "
                f"| {t.ops_per_s:,.0f} | {lo:,.0f} - {hi:,.0f} "
                f"| {'' if ratio is None else f'{ratio:.2f}x'} |"
            )
    if result.bugs:
        if lines:
            lines.append("")
        lines += [
            "| seeded bug | caught by | first failure (s) | shrink (s) | shrink (CPU s) "
            "| replay steps | replay calls |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for b in result.bugs:
            capped = " (capped)" if b.shrink_capped else ""
            lines.append(
                f"| {b.bug} | {b.check} | {b.first_s:.2f} | {b.shrink_s:.1f}{capped} "
                f"| {b.shrink_cpu_s:.1f} | {b.steps} | {b.calls} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m prefixkv.benchmarks.kit", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument(
        "--baseline", type=Path, help="another source tree whose kit runs beside this one"
    )
    parser.add_argument("--examples", type=int, default=20, help="runs per value (default 20)")
    parser.add_argument("--steps", type=int, default=STEPS, help="rule steps per run")
    parser.add_argument("--processes", type=int, default=5, help="values, one per process")
    parser.add_argument("--warmups", type=int, default=1, help="warm-up runs per process")
    parser.add_argument("--only", default="", help="only managers and bugs naming this")
    parser.add_argument("--no-bugs", action="store_true", help="skip the seeded bugs")
    parser.add_argument("--bugs-only", action="store_true", help="only the seeded bugs")
    parser.add_argument("--json", type=Path, help="also write the result as JSON here")
    parser.add_argument(
        "--first-failure", nargs=2, metavar=("MODULE", "BUG"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.first_failure:
        print(json.dumps(attrs.asdict(first_failure(*args.first_failure))))
        return 0
    start = time.perf_counter()
    result = run_kit_bench(
        baseline=args.baseline,
        examples=args.examples,
        steps=args.steps,
        processes=args.processes,
        warmups=args.warmups,
        bugs=not args.no_bugs,
        throughput=not args.bugs_only,
        only=args.only,
        log=lambda m: print(f"[{time.perf_counter() - start:6.0f}s] {m}", file=sys.stderr),
    )
    if args.json is not None:
        args.json.write_text(json.dumps(to_json(result), indent=2) + "\n", encoding="utf-8")
    print(render_markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
