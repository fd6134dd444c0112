"""The command line: its registry, exit codes, ``--json`` errors and every command's help.

No test here asserts a speed: speed is what ``prefixkv bench`` measures, on a quiet machine.
Each command has its own file beside this one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

import pytest

from prefixkv import cli

SMALL = ["--conversations", "6", "--turns", "3"]


def _run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, object]]:
    code = cli.main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out)  # the whole of stdout is one JSON document


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


@pytest.mark.parametrize("name", [c.name for c in cli.commands()])
def test_every_command_loads_and_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    # --help loads the command's module and runs its setup: a broken import or flag
    # definition fails here, for every registered command.
    assert cli.main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: prefixkv {name}") and "--json" in out


def test_a_command_error_carries_its_exit_status(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_REGISTRY", dict(cli._REGISTRY))

    def setup(parser: argparse.ArgumentParser) -> cli.Runner:
        def run(args: argparse.Namespace) -> int:
            raise cli.CommandError("nothing to measure here", exit_code=3)

        return run

    cli.register("refuse", "always refuses", setup)
    assert cli.main(["refuse"]) == 3
    assert "nothing to measure here" in capsys.readouterr().err
    assert cli.main(["refuse", "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report == {
        "command": "refuse",
        "ok": False,
        "error": "CommandError: nothing to measure here",
        "exit_code": 3,
    }


def test_a_configuration_error_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any error prefixkv raises on purpose is reported in one line, not a traceback."""
    from prefixkv.errors import InvalidConfig

    monkeypatch.setattr(cli, "_REGISTRY", dict(cli._REGISTRY))

    def setup(parser: argparse.ArgumentParser) -> cli.Runner:
        def run(args: argparse.Namespace) -> int:
            raise InvalidConfig("num_blocks must be an int >= 1, got 0")

        return run

    cli.register("bad-config", "raises InvalidConfig", setup)
    assert cli.main(["bad-config", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["error"] == "InvalidConfig: num_blocks must be an int >= 1, got 0"
    with pytest.raises(InvalidConfig):
        cli.register("bad name", "spaces are refused", setup)


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


# -- every size flag has an upper bound ----------------------------------------------------

#: Command lines past a size bound, a bogus device or an empty selection: each a usage
#: error (exit 2) reported before any work, and under --json one JSON object.
PAST_A_BOUND: tuple[tuple[str, ...], ...] = (
    ("simulate", "--conversations", str(10**23)),
    ("simulate", "--num-blocks", str(10**12)),
    ("simulate", "--block-size", str(2**40)),
    ("simulate", "--turns", str(10**6)),
    ("simulate", "--live", str(10**9)),
    ("simulate", "--check-invariants", str(10**12)),
    ("simulate", "--num-blocks", str(2**24), "--block-size", "4096"),
    ("simulate", "--conversations", str(10**6), "--turns", "1000"),
    ("simulate", "--spec", "--num-blocks", str(10**6)),
    ("serve-sim", "--conversations", str(10**23)),
    ("serve-sim", "--num-blocks", str(10**12)),
    ("serve-sim", "--block-size", str(2**40)),
    ("serve-sim", "--turns", str(10**6)),
    ("serve-sim", "--system-tokens", str(10**9)),
    ("serve-sim", "--budget", str(10**9)),
    ("serve-sim", "--draft-tokens", str(10**6)),
    ("serve-sim", "--replicas", str(10**6)),
    ("serve-sim", "--replicas", "0"),
    ("serve-sim", "--num-blocks", str(2**16), "--block-size", "1024"),
    ("serve-sim", "--conversations", "10000", "--turns", "100"),
    ("serve-sim", "--device", "bogus"),
    ("serve-sim", "--device", "cuda:x"),
    ("serve-sim", "--plot", "ttft.xyz"),
    ("serve-sim", "--stall-timeout", "inf"),
    ("audit-events", "tcp://127.0.0.1:9", "--num-blocks", str(2**40)),
    ("audit-events", "tcp://127.0.0.1:9", "--duration", "inf"),  # a bound that never ends
    ("bench-engine", "--device", "bogus"),
    ("prove", "--invariants", ""),
    ("prove", "--invariants", " , "),
    ("prove", "--operations", ""),
    ("prove", "--seqs", str(10**6)),
    ("prove", "--table", str(10**6)),
    ("prove", "--rlimit", str(2**40)),
    ("prove", "--seed", str(2**40)),
    ("prove", "--drift", str(10**9)),
)


@pytest.mark.parametrize("argv", PAST_A_BOUND, ids=" ".join)
def test_sizes_past_their_bound_are_usage_errors(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    if argv[0] == "prove":  # the command loads only with the proofs extra
        pytest.importorskip("z3")
    assert cli.main(list(argv)) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "error" in captured.err
    code = cli.main([*argv, "--json"])
    report = json.loads(capsys.readouterr().out)  # the whole of stdout is one JSON object
    assert code == 2 and report["ok"] is False and report["exit_code"] == 2


def test_plot_path_is_the_file_written(tmp_path: Any) -> None:
    from prefixkv.commands.support import plot_path

    assert plot_path(str(tmp_path / "ttft")) == tmp_path / "ttft.png"
    assert plot_path(str(tmp_path)) == tmp_path / "figure.png"
    assert plot_path(str(tmp_path / "ttft.svg")) == tmp_path / "ttft.svg"
    with pytest.raises(argparse.ArgumentTypeError):
        plot_path(str(tmp_path / "ttft.xyz"))
