"""A warm pytest: one process imports torch, pytest and hypothesis once; each mutant runs in
a fresh fork of it.

Importing torch, pytest and hypothesis costs a fresh interpreter several seconds, the same for
every mutant. The engine bug harness (:mod:`tests.mutation.engine_bugs`) therefore starts this
file once, as a script (``python tests/mutation/warm.py``), and sends it one job per patched
copy on stdin. The server forks; the child puts the copy first on ``sys.path``, moves into it
and runs ``pytest.main`` in-process. Each child is a fresh fork of the same warm state, so one
mutant cannot see another's modules.

NOTE: the server imports only third-party modules, never ``prefixkv`` (nor the ``tests``
package of the checkout): the child must import the patched copy, and a module imported
before the fork would be the checkout's. The server checks this before it says it is ready.

Protocol, one JSON object a line. The server prints ``{"ready": seconds}`` once its imports are
done. For each job (``cwd``, ``path``, ``env``, ``args``, ``log``) it prints
``{"started": pid}`` right after the fork and ``{"pid": pid, "exit": code}`` when the child
has ended. The child's stdout and stderr go to the job's ``log`` file; it stores the time of
its fork in ``PREFIXKV_MUTANT_T0`` (``time.monotonic()``, one clock for every process of the
machine), from which :mod:`tests.mutation.first_failure` measures start-up and search.

The server and its children share one process group (the client starts it in a new session),
and each asks the kernel to kill it when its parent dies (``PR_SET_PDEATHSIG``, Linux), so
killing the harness, the server or the group leaves nothing running.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import selectors
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PRELOAD", "WarmPytest", "WarmServerError"]

#: What every engine test run imports before its first test, minus prefixkv itself.
PRELOAD = (
    "torch",
    "numpy",
    "pytest",
    "_pytest.python",
    "_pytest.assertion.rewrite",
    "hypothesis",
    "hypothesis.stateful",
)

SCRIPT = Path(__file__).resolve()


class WarmServerError(RuntimeError):
    """The warm server died or answered something unexpected: a harness error, never a kill."""


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _child(job: dict[str, Any], parent: int) -> None:
    """In the fork: run pytest on the copy; never returns."""
    t0 = time.monotonic()
    code = 3
    try:
        _die_with_parent()
        if os.getppid() != parent:  # the server died before the kernel could be asked
            os._exit(1)
        fd = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.environ.update(job["env"])
        os.environ["PREFIXKV_MUTANT_T0"] = repr(t0)
        os.chdir(job["cwd"])
        sys.path[:0] = job["path"]
        import pytest

        code = int(pytest.main(list(job["args"])))
    except BaseException:  # whatever happens, the child must exit here
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    """The server's loop (run this file as a script)."""
    here = str(SCRIPT.parent)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    start = time.monotonic()
    for name in PRELOAD:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("prefixkv", "tests"))
    if leaked:
        raise SystemExit(f"the warm server imported {leaked[:5]}: the children would share them")
    out = sys.stdout
    print(json.dumps({"ready": round(time.monotonic() - start, 3)}), file=out, flush=True)
    me = os.getpid()
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(job, me)
        print(json.dumps({"started": pid}), file=out, flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"pid": pid, "exit": os.waitstatus_to_exitcode(status)}), flush=True)


class WarmPytest:
    """The harness's side: start the server once, run one job at a time, kill it on trouble.

    ``run`` returns the child's exit code, or None when it ran past ``timeout`` (the server and
    the child are then killed; the next ``run`` starts a new server).
    """

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup: float | None = None  # seconds from launch to "ready" (the last start)
        self._buffer = b""  # what the server printed that no _expect has consumed yet

    def __enter__(self) -> WarmPytest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> float:
        """Start the server (if it is not running); returns its start-up in seconds."""
        if self.proc is not None and self.proc.poll() is None:
            return self.startup or 0.0
        from tests.mutation.sandbox import _die_with_parent as die_with_harness

        begin = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-u", str(SCRIPT)],
            cwd=SCRIPT.parent,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,  # _expect reads the raw pipe: no line may hide in a Python buffer
            start_new_session=True,  # its own process group: its children die with it
            preexec_fn=die_with_harness,
        )
        self._buffer = b""
        try:
            self._expect("ready", timeout=300.0)
        except BaseException:
            self.close()
            raise
        self.startup = round(time.monotonic() - begin, 2)
        return self.startup

    def _expect(self, key: str, timeout: float | None) -> dict[str, Any]:
        """The next message of the server that holds ``key`` (earlier ones are skipped)."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                line, newline, rest = self._buffer.partition(b"\n")
                if newline:
                    self._buffer = rest
                    message: dict[str, Any] = json.loads(line)
                    if key in message:
                        return message
                    continue
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no {key!r} from the warm server in {timeout} s")
                if not sel.select(left):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    err = self.proc.stderr.read() if self.proc.stderr else b""
                    tail = " | ".join(err.decode(errors="replace").strip().splitlines()[-3:])
                    raise WarmServerError(f"the warm server died ({self.proc.wait()}): {tail}")
                self._buffer += chunk

    def run(
        self,
        *,
        cwd: Path,
        path: Sequence[str],
        env: Mapping[str, str],
        args: Sequence[str],
        log: Path,
        timeout: float | None,
        on_start: Callable[[int], None] | None = None,
    ) -> int | None:
        self.start()
        assert self.proc is not None and self.proc.stdin is not None
        job = {"cwd": str(cwd), "path": list(path), "env": dict(env), "args": list(args)}
        job["log"] = str(log)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            data = memoryview(json.dumps(job).encode() + b"\n")
            while data:  # a raw pipe may take part of it at a time
                data = data[self.proc.stdin.write(data) or 0 :]
            pid = int(self._expect("started", timeout=60.0)["started"])
            if on_start is not None:
                on_start(pid)
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            try:
                done = self._expect("exit", timeout=left)
            except TimeoutError:
                self.close()
                return None
            if done["pid"] != pid:
                raise WarmServerError(f"the warm server reported {done}, not pid {pid}")
            return int(done["exit"])
        except BaseException:
            self.close()  # Ctrl-C, SIGTERM (as SystemExit), a dead server: kill the group
            raise

    def close(self) -> None:
        """Kill the server and every child it forked (its whole process group)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


if __name__ == "__main__":
    serve()
