"""The command line (simulate, bench, prove), its registry and exit codes, and the workloads.

No test here asserts a speed: speed is what ``prefixkv bench`` measures, on a quiet machine.
These tests only keep the commands working (``bench`` has its own, in test_cache_bench.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import attrs
import pytest

from prefixkv import cli
from prefixkv.simulation import WORKLOADS, make_cache, replay
from prefixkv.workloads import ChatConfig, chat_workload, interleave

SMALL = ["--conversations", "6", "--turns", "3"]


def _run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    code = cli.main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)  # the whole of stdout is one JSON document


# -- workloads -----------------------------------------------------------------------------


def test_workload_is_deterministic() -> None:
    cfg = ChatConfig(conversations=7, turns=3, system_tokens=64, seed=11)
    a, b = chat_workload(cfg), chat_workload(cfg)
    assert a == b
    assert a.schedule() == b.schedule()
    other = chat_workload(ChatConfig(conversations=7, turns=3, system_tokens=64, seed=12))
    assert other.system_prompts != a.system_prompts


def test_workload_shape() -> None:
    cfg = ChatConfig(conversations=9, turns=4, system_prompts=3, system_tokens=128)
    w = chat_workload(cfg)
    assert len(w.system_prompts) == 3 and all(len(s) == 128 for s in w.system_prompts)
    assert w.num_requests == 36
    for conv in w.conversations:
        system = w.system_prompts[conv.system_prompt]
        previous = None
        for turn in conv.turns:
            assert turn.prompt[: len(system)] == system
            lo, hi = cfg.reply_tokens
            assert lo <= len(turn.reply) <= hi
            if previous is not None:
                # every turn re-sends the whole history: previous prompt and reply
                history = previous.prompt + previous.reply
                assert turn.prompt[: len(history)] == history
                lo, hi = cfg.user_tokens
                assert lo <= len(turn.prompt) - len(history) <= hi
            previous = turn
    assert w.blocks_touched(16) == sum(-(-t.num_tokens // 16) for t in w.turns())


def test_schedule_keeps_turn_order_and_interleaves() -> None:
    w = chat_workload(ChatConfig(conversations=20, turns=4, system_tokens=16))
    order = [(t.conversation, t.turn) for t in w.schedule()]
    assert sorted(order) == [(c, t) for c in range(20) for t in range(4)]
    seen: dict[int, int] = {}
    for c, t in order:
        assert t == seen.get(c, -1) + 1
        seen[c] = t
    assert order != sorted(order)  # actually shuffled
    assert interleave([2, 0, 1], seed=5) == interleave([2, 0, 1], seed=5)


def test_workload_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError):
        ChatConfig(conversations=0)
    with pytest.raises(ValueError):
        ChatConfig(user_tokens=(5, 2))


# -- simulate ------------------------------------------------------------------------------


def test_simulate_json_reports_hits_and_checks_invariants(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, report = _run_json(
        capsys, "simulate", *SMALL, "--num-blocks", "512", "--check-invariants", "400"
    )
    assert code == 0 and report["ok"] is True and report["cache"] == "impl"
    assert isinstance(report["hit_rate"], float) and report["hit_rate"] > 0
    assert (
        report["prefill_tokens_computed"] + report["prefill_tokens_skipped"]
        == (  # type: ignore[operator]
            report["prefill_tokens"]
        )
    )
    assert isinstance(report["invariant_checks"], int) and report["invariant_checks"] > 1
    assert report["requests"] == 18
    for key in ("evictions", "blocks_published", "peak_utilization", "wall_time_s"):
        assert key in report


def test_simulate_spec_small_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, report = _run_json(capsys, "simulate", "--spec", "--check-invariants", "25")
    assert code == 0 and report["cache"] == "spec"
    assert report["hit_rate"] > 0  # type: ignore[operator]
    assert report["invariant_checks"] > 1  # type: ignore[operator]


@pytest.mark.parametrize("name", ["multimodal", "speculative"])
def test_feature_workloads_report_their_lost_reuse_split(
    capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """The multimodal and speculative workloads run on the spec, invariants checked, and
    their lost-reuse split adds up to the prompt tokens computed."""
    code, report = _run_json(
        capsys, "simulate", "--workload", name, "--spec", "--check-invariants", "40"
    )
    assert code == 0 and report["workload_name"] == name
    lost = sum(
        report[f"lost_{c}"]  # type: ignore[misc]
        for c in ("window", "span", "cap", "evicted", "never_cached")
    )
    assert lost == report["prefill_tokens_computed"]
    assert 0 < report["hit_rate"] < 1  # type: ignore[operator]
    if name == "speculative":
        assert report["lost_window"] > 0 and report["drafts_proposed"] > 0  # type: ignore[operator]
        assert 0 < report["drafts_accepted"] < report["drafts_proposed"]  # type: ignore[operator]
    else:
        assert report["prefill_chunks"] > 0  # type: ignore[operator]
        assert report["workload"]["image_tokens"] > 0  # type: ignore[index]


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_spec_and_impl_agree_on_every_workload(name: str) -> None:
    """Spans, chunks, windows and drafts: the impl saves exactly what the spec saves."""
    _, preset = WORKLOADS[name]
    w = chat_workload(attrs.evolve(preset.workload, conversations=6, seed=3))
    results = [
        replay(make_cache(kind, 48, 4), w, live=2, drive=preset.drive, check_every=30)
        for kind in ("spec", "impl")
    ]
    spec, impl = (attrs.asdict(r, filter=lambda a, _: a.name != "wall_time_s") for r in results)
    assert spec == impl
    assert results[0].evictions > 0


def test_spec_and_impl_report_the_same_reuse() -> None:
    """Same workload, same pool: the impl must save exactly what the spec saves."""
    w = chat_workload(
        ChatConfig(
            conversations=5,
            turns=3,
            system_prompts=2,
            system_tokens=32,
            user_tokens=(4, 12),
            reply_tokens=(3, 9),
            seed=4,
        )
    )
    results = [replay(make_cache(kind, 40, 4), w, live=2) for kind in ("spec", "impl")]
    keys = (
        "hit_rate",
        "prefill_tokens_computed",
        "evictions",
        "blocks_published",
        "peak_used_blocks",
        "early_frees",
    )
    spec, impl = ({k: getattr(r, k) for k in keys} for r in results)
    assert spec == impl
    assert results[0].evictions > 0  # the pool is small enough to exercise eviction


def test_weak_hash_changes_no_result(capsys: pytest.CaptureFixture[str]) -> None:
    reports = []
    for name in ("fast", "weak", "sha256"):
        code, report = _run_json(capsys, "simulate", *SMALL, "--num-blocks", "300", "--hash", name)
        assert code == 0
        reports.append({k: report[k] for k in ("hit_rate", "evictions", "blocks_published")})
    assert reports[0] == reports[1] == reports[2]


def test_simulate_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", *SMALL]) == 0
    out = capsys.readouterr().out
    assert "hit rate" in out and "prefill tokens skipped" in out and "wall time" in out


# -- exit codes and the registry -----------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["no-such-command"],
        ["simulate", "--num-blocks", "0"],
        ["simulate", "--hash", "md5"],
        ["simulate", "--conversations", "many"],
        ["bench", "--bogus"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert capsys.readouterr().out == ""


#: Bad command lines: a usage error for every command (an unknown flag, checked for every
#: registered command below), bad values caught by argparse, and a bad value caught late
#: by the command itself (``prove --operations``).
BAD_ARGV: tuple[tuple[str, ...], ...] = (
    (),
    ("no-such-command",),
    ("simulate", "--num-blocks", "0"),
    ("simulate", "--hash", "md5"),
    ("simulate", "--conversations", "many"),
    ("bench", "--out"),
    ("serve-sim", "--num-blocks", "0"),
    ("serve-sim", "--backend", "gpu"),
    ("bench-engine", "--backend", "gpu"),
    ("prove", "--seed", "x"),
    ("prove", "--operations", "nope"),
    *((command.name, "--no-such-flag") for command in cli.commands()),
)


@pytest.mark.parametrize("argv", BAD_ARGV, ids=" ".join)
def test_json_errors_are_json(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    """Under --json every failure, a usage error included, prints one JSON object on stdout,
    with the exit status the same command line has without --json."""
    plain = cli.main(list(argv))
    assert plain != 0 and capsys.readouterr().out == ""
    for position in ("end", "first"):
        line = [*argv, "--json"] if position == "end" else ["--json", *argv]
        if position == "first" and argv:  # before the command: the top-level parser's error
            line = [argv[0], "--json", *argv[1:]]
        code = cli.main(line)
        captured = capsys.readouterr()
        report = json.loads(captured.out)  # the whole of stdout is one JSON document
        assert code == plain
        assert report["ok"] is False and report["exit_code"] == code
        assert isinstance(report["error"], str) and report["error"]
        assert "error" in captured.err  # the human-readable message is still on stderr


def test_every_command_has_a_bad_argument_row() -> None:
    covered = {argv[0] for argv in BAD_ARGV if argv}
    assert {command.name for command in cli.commands()} <= covered


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "simulate" in capsys.readouterr().out
    assert cli.main(["simulate", "--help"]) == 0
    assert "--check-invariants" in capsys.readouterr().out


def test_failure_exits_1_with_json_error(capsys: pytest.CaptureFixture[str]) -> None:
    # 8 blocks of 16 tokens cannot hold one 1,024-token system prompt.
    code, report = _run_json(capsys, "simulate", "--conversations", "1", "--num-blocks", "8")
    assert code == 1
    assert report["ok"] is False and "OutOfBlocks" in str(report["error"])


def test_registry_adds_json_and_runs_a_plugin_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_REGISTRY", dict(cli._REGISTRY))

    def setup(parser: argparse.ArgumentParser) -> cli.Runner:
        parser.add_argument("--fail", action="store_true")

        def run(args: argparse.Namespace) -> int:
            if args.fail:
                raise cli.CommandError("asked to fail")
            cli.emit_json({"json": args.json})
            return 0

        return run

    cli.register("echo", "test command", setup)
    assert [c.name for c in cli.commands()][-1] == "echo"
    assert cli.main(["echo", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"json": True}
    assert cli.main(["echo", "--fail"]) == 1
    assert "asked to fail" in capsys.readouterr().err


def test_a_command_may_declare_json_itself(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_REGISTRY", dict(cli._REGISTRY))

    def setup(parser: argparse.ArgumentParser) -> cli.Runner:
        parser.add_argument("--json", action="store_true", help="its own help")
        parser.add_argument("--mode", default="ok")

        def run(args: argparse.Namespace) -> int:
            if args.mode != "ok":
                raise SystemExit(f"unknown mode {args.mode}")  # late usage error
            return 0 if args.json else 3

        return run

    cli.register("own-json", "declares --json", setup)
    assert cli.main(["own-json", "--json"]) == 0
    assert cli.main(["own-json"]) == 3
    assert cli.main(["own-json", "--mode", "bad"]) == 2
    assert "unknown mode bad" in capsys.readouterr().err


def test_missing_optional_dependency_fails_only_that_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_REGISTRY", dict(cli._REGISTRY))
    cli.register("broken", "needs a missing module", "prefixkv._no_such_module:setup")
    assert cli.main(["broken"]) == 1
    assert "cannot load" in capsys.readouterr().err
    assert cli.main(["simulate", "--help"]) == 0


def test_python_dash_m_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "prefixkv", "simulate", "--json", "--conversations", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
    bad = subprocess.run(
        [sys.executable, "-m", "prefixkv", "simulate", "--seed", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2 and bad.stdout == ""


def test_prove_is_a_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    """``prefixkv prove`` reaches the Z3 proofs through the command registry."""
    code, report = _run_json(capsys, "prove", "--no-kernels", "--operations", "free")
    assert code == 0
    assert report["ok"] is True
    assert isinstance(report["obligations"], list)
    assert {row["operation"] for row in report["obligations"]} == {"free"}
