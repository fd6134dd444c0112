"""The shared example database: the one option that names it, and the replay it buys.

A failure found by one process must be the *first* example the next process tries, through
a directory and through Redis. The replays run the kit against one of the example engine's
classic bugs with the same seed twice: with an empty database the seeded search first fails
after several examples; with the database the first process filled, the very first example
fails. The seed is the same, so the database is the only difference.

Redis runs on ``fakeredis``, so no server is needed: once in this process (one
``FakeServer``, two clients) and once as a TCP server that two worker processes reach
through a ``redis://`` URL, as the machines of a fleet would reach a real one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import fakeredis
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase
from hypothesis.extra.redis import RedisExampleDatabase
from hypothesis.stateful import run_state_machine_as_test
from prefixkv.spec import PrefixCacheError
from replay_worker import run as run_worker

from examples import engine_style
from prefixkv.conformance import conformance_machine, run_conformance
from prefixkv.conformance.database import (
    DATABASE_ENV,
    DEFAULT_TIMEOUT,
    KEY_PREFIX,
    DatabaseUnavailable,
    DatabaseWarning,
    InvalidDatabase,
    campaign_settings,
    database_from_env,
    parse_database,
)
from prefixkv.conformance.profiles import register_profiles
from prefixkv.errors import PrefixKVError

_WORKER = Path(__file__).with_name("replay_worker.py")
_ROOT = Path(__file__).parents[2]
#: A test file of a few fast tests, for a whole session in a subprocess.
_SMALL_TEST = "tests/spec/test_framing.py"
_BUG = "double_free_in_batch"  # takes several examples to find under these seeds
_SEED = 0


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the option ---------------------------------------------------------------------------


def test_a_path_is_a_directory_database(tmp_path: Path) -> None:
    for value in (str(tmp_path / "db"), tmp_path / "db"):
        db = parse_database(value)
        assert isinstance(db, DirectoryBasedExampleDatabase)
        assert Path(db.path) == tmp_path / "db"


def test_a_database_object_is_kept() -> None:
    db = InMemoryExampleDatabase()
    assert parse_database(db) is db


@pytest.mark.parametrize(
    ("url", "host", "port", "db", "password"),
    [
        ("redis://ci-redis:6380/3", "ci-redis", 6380, 3, None),
        ("redis://ci-redis", "ci-redis", 6379, 0, None),
        ("redis://:s3cret@10.0.0.7:6379/0", "10.0.0.7", 6379, 0, "s3cret"),
        ("rediss://redis.example.org:6390/1", "redis.example.org", 6390, 1, None),
    ],
)
def test_a_redis_url_is_a_redis_database(
    url: str, host: str, port: int, db: int, password: str | None
) -> None:
    """Parsed without connecting; keys go under prefixkv's prefix."""
    database = parse_database(url)
    assert isinstance(database, RedisExampleDatabase)
    kwargs = database.redis.connection_pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["db"]) == (host, port, db)
    assert kwargs.get("password") == password
    assert database._prefix == KEY_PREFIX


BAD_DATABASES: list[Any] = [
    "",
    "   ",
    42,
    None,
    b"/tmp/db",
    "ftp://host/db",
    "http://redis:6379/0",
    "redis://",
    "redis://:6379/0",
    "redis://host:port/0",
    "redis://host:99999/0",
    "redis://host:6379/zero",
    "redis://host:6379/0?timeout=0",
    "redis://host:6379/0?timeout=-1",
    "redis://host:6379/0?timeout=nan",
    "redis://host:6379/0?timeout=1000",
    "redis://host:6379/0?timeout=",
    "redis://host:6379/0?retries=3",
    "redis://host:6379/0#frag",
]


@pytest.mark.parametrize("value", BAD_DATABASES)
def test_a_bad_database_is_a_typed_error(value: Any) -> None:
    with pytest.raises(InvalidDatabase) as info:
        parse_database(value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, PrefixCacheError)


def test_a_file_is_not_a_directory_database(tmp_path: Path) -> None:
    path = tmp_path / "db"
    path.write_text("not a directory")
    with pytest.raises(InvalidDatabase, match="is a file"):
        parse_database(path)


def test_a_redis_server_that_does_not_answer_is_refused_up_front() -> None:
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    assert isinstance(parse_database(url), RedisExampleDatabase)  # no connection yet
    with pytest.raises(DatabaseUnavailable) as info:
        parse_database(url, connect=True)
    assert isinstance(info.value, ConnectionError) and isinstance(info.value, PrefixCacheError)


# -- a server that refuses, stalls or answers wrongly -------------------------------------


def _fake_server(reply: Callable[[bytes], bytes]) -> str:
    """A TCP server that answers every command it receives with ``reply(command)`` (b"":
    no answer at all); its URL, with a one-second timeout. Its threads are daemons."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)

    def handle(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(65536):
                if out := reply(data):
                    conn.sendall(out)

    def accept() -> None:
        while True:
            conn, _ = server.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return f"redis://127.0.0.1:{server.getsockname()[1]}/0?timeout=1"


def _answers(smembers: bytes, hello: bytes = b"%1\r\n+proto\r\n:3\r\n") -> Callable[[bytes], bytes]:
    """A server that completes the handshake and PING, and answers ``SMEMBERS`` so."""

    def reply(command: bytes) -> bytes:
        upper = command.upper()
        if b"HELLO" in upper:
            return hello
        if b"PING" in upper:
            return b"+PONG\r\n"
        if b"SMEMBERS" in upper:
            return smembers
        return b"+OK\r\n"

    return reply


#: Servers a database URL may name that cannot be used: each is DatabaseUnavailable.
BAD_SERVERS: dict[str, Callable[[bytes], bytes] | None] = {
    "refused": None,
    "stalled": lambda command: b"",
    "malformed": lambda command: b"garbage\r\n",
    "malformed handshake": _answers(b"*0\r\n", hello=b":1\r\n"),
    "PING answered wrongly": lambda command: b"+OK\r\n",
    "a set of the wrong type": _answers(b"*1\r\n:5\r\n"),
    "no set at all": _answers(b":1\r\n"),
    "a key of the wrong type": _answers(b"-WRONGTYPE Operation against a key\r\n"),
}


def _bad_server_url(kind: str) -> str:
    reply = BAD_SERVERS[kind]
    if reply is None:
        return f"redis://127.0.0.1:{_closed_port()}/0?timeout=1"
    return _fake_server(reply)


@pytest.mark.parametrize("kind", sorted(BAD_SERVERS))
def test_a_server_that_cannot_be_used_is_database_unavailable(kind: str) -> None:
    """Refused, stalled (within the URL's timeout, not retried), malformed or wrong-type
    replies: each a DatabaseUnavailable, a PrefixKVError, never a raw redis error or
    builtin, and never a hang."""
    url = _bad_server_url(kind)
    database = parse_database(url)  # no connection yet
    kwargs = cast(Any, database).redis.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 1.0
    with pytest.raises(DatabaseUnavailable) as info:
        parse_database(url, connect=True)
    assert isinstance(info.value, PrefixKVError) and isinstance(info.value, ConnectionError)


def test_the_default_timeout() -> None:
    kwargs = cast(Any, parse_database("redis://host/0")).redis.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == DEFAULT_TIMEOUT <= 10


@pytest.mark.parametrize("kind", sorted(BAD_SERVERS))
def test_run_conformance_raises_database_unavailable_before_running(kind: str) -> None:
    made: list[int] = []

    def make(num_blocks: int, block_size: int, *, record_events: bool) -> Any:
        made.append(num_blocks)
        return engine_style.make_manager(num_blocks, block_size, record_events=record_events)

    with pytest.raises(DatabaseUnavailable):
        run_conformance(
            make, engine_style.make_manager.capabilities, database=_bad_server_url(kind)
        )
    assert made == []


def test_a_server_that_fails_later_raises_or_warns_once() -> None:
    """After the start-up check: every read and write of a database that went away is a
    DatabaseUnavailable; with on_error="warn" (the project's own sessions) one warning,
    and the session runs on without it, so no property fails for it."""
    server = fakeredis.TcpFakeServer(("127.0.0.1", 0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"redis://127.0.0.1:{server.server_address[1]}/0?timeout=1"
    strict = parse_database(url, connect=True)
    lenient = parse_database(url, connect=True, on_error="warn")
    strict.save(b"k", b"v")
    assert list(strict.fetch(b"k")) == [b"v"] == list(lenient.fetch(b"k"))
    server.shutdown()
    server.server_close()  # the server goes away: no new connection is accepted
    for db in (strict, lenient):
        cast(Any, db).redis.connection_pool.disconnect()
    for call in (
        lambda: list(strict.fetch(b"k")),
        lambda: strict.save(b"k", b"w"),
        lambda: strict.delete(b"k", b"v"),
        lambda: strict.move(b"k", b"j", b"v"),
    ):
        with pytest.raises(DatabaseUnavailable):
            call()
    with pytest.warns(DatabaseWarning, match="running on without it") as caught:
        assert list(lenient.fetch(b"k")) == []
        lenient.save(b"k", b"w")
        lenient.move(b"k", b"j", b"v")
        assert list(lenient.fetch(b"k")) == []
    assert len(caught) == 1


def test_a_session_checks_its_database_once_at_start() -> None:
    """``PREFIXKV_DATABASE`` naming a server that stalls: the project's own session stops
    at start-up with a usage error (exit 4), before any test runs, and fails no test."""
    env = {**os.environ, DATABASE_ENV: _bad_server_url("stalled")}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:xdist", _SMALL_TEST],
        capture_output=True,
        text=True,
        cwd=_ROOT,
        env=env,
        check=False,
    )
    assert out.returncode == pytest.ExitCode.USAGE_ERROR, out.stdout[-2000:] + out.stderr[-2000:]
    assert "$PREFIXKV_DATABASE" in out.stderr and "DatabaseUnavailable" not in out.stdout
    assert "failed" not in out.stdout and "passed" not in out.stdout


def test_the_environment_variable(tmp_path: Path) -> None:
    assert database_from_env({}) is None
    assert database_from_env({DATABASE_ENV: "  "}) is None
    db = database_from_env({DATABASE_ENV: str(tmp_path)})
    assert isinstance(db, DirectoryBasedExampleDatabase)
    with pytest.raises(InvalidDatabase):
        database_from_env({DATABASE_ENV: "ftp://x"})


def test_a_database_turns_derandomization_off() -> None:
    """A derandomized profile has no database in Hypothesis; a campaign needs both off."""
    register_profiles()
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.database is None
    db = InMemoryExampleDatabase()
    campaign = campaign_settings(ci, db)
    assert not campaign.derandomize and campaign.database is db
    assert campaign.max_examples == ci.max_examples


def test_run_conformance_refuses_a_bad_database_before_running() -> None:
    made: list[int] = []

    def make(num_blocks: int, block_size: int, *, record_events: bool) -> Any:
        made.append(num_blocks)
        return engine_style.make_manager(num_blocks, block_size, record_events=record_events)

    with pytest.raises(InvalidDatabase):
        run_conformance(make, engine_style.make_manager.capabilities, database="ftp://x")
    assert made == []


# -- a failure found by one process is replayed first by another --------------------------


def _worker(database: str) -> dict[str, Any]:
    """One run of replay_worker.py in a fresh process."""
    out = subprocess.run(
        [
            sys.executable,
            str(_WORKER),
            "--bug",
            _BUG,
            "--seed",
            str(_SEED),
            "--no-shrink",
            "--database",
            database,
        ],
        capture_output=True,
        text=True,
        cwd=_ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _assert_replayed_first(found: dict[str, Any], replayed: dict[str, Any]) -> None:
    # Without the shared failure the seeded search needs several examples...
    assert found["check"] is not None and found["first_failure_example"] > 1, found
    # ...with it, the same seeded search fails on its first example, on the same check.
    assert replayed == {"check": found["check"], "first_failure_example": 1}, replayed


def test_replayed_first_through_a_directory(tmp_path: Path) -> None:
    db = str(tmp_path / "examples")
    found = _worker(db)
    assert any(Path(db).iterdir())  # the failure was written down
    _assert_replayed_first(found, _worker(db))


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A fakeredis server on a local TCP port, as a real Redis would be reached."""
    server = fakeredis.TcpFakeServer(("127.0.0.1", 0))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{server.server_address[1]}/0"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_replayed_first_through_redis_across_processes(redis_url: str) -> None:
    found = _worker(redis_url)
    _assert_replayed_first(found, _worker(redis_url))


def test_replayed_first_through_redis_by_two_clients() -> None:
    """One fakeredis server, two clients: what two machines of a fleet see."""
    server = fakeredis.FakeServer()

    def client() -> RedisExampleDatabase:
        redis = fakeredis.FakeRedis(server=server)
        return RedisExampleDatabase(redis, key_prefix=KEY_PREFIX, expire_after=timedelta(1))

    found = run_worker(_BUG, client(), _SEED, examples=500, steps=30, shrink=False)
    replayed = run_worker(_BUG, client(), _SEED, examples=500, steps=30, shrink=False)
    _assert_replayed_first(found, replayed)


def test_a_failure_found_by_the_machine_test_case_replays_in_the_kit() -> None:
    """HypoFuzz runs ``conformance_machine(...).TestCase``; the kit (and its plugin) keys
    the database the same way, so what a campaign found overnight is the first example of
    the next ``run_conformance`` or ``pytest --prefixkv-adapter`` run."""
    db = InMemoryExampleDatabase()
    factory = getattr(engine_style, f"make_{_BUG}")
    machine = conformance_machine(factory, factory.capabilities)
    with pytest.raises(AssertionError):
        run_state_machine_as_test(
            machine,
            settings=settings(
                database=db,
                derandomize=False,
                max_examples=500,
                stateful_step_count=30,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            ),
        )
    fresh = run_worker(_BUG, InMemoryExampleDatabase(), _SEED, examples=500, steps=30, shrink=False)
    replayed = run_worker(_BUG, db, _SEED, examples=500, steps=30, shrink=False)
    _assert_replayed_first(fresh, replayed)


# -- the plugin ---------------------------------------------------------------------------

_ARGS = ("-p", "no:cacheprovider", "--prefixkv-profile=dev", "--prefixkv-steps=30")


def _plugin(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.syspathinsert(_ROOT)
    return pytester.runpytest_inprocess(*_ARGS, *args)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("another scheme", "*--prefixkv-database: *scheme must be redis*"),
        ("no server", "*--prefixkv-database: *"),
        ("malformed handshake", "*--prefixkv-database: *the start-up check failed*"),
        ("stalled", "*--prefixkv-database: *the start-up check failed*"),
    ],
)
def test_the_plugin_refuses_a_bad_database_as_a_usage_error(
    pytester: pytest.Pytester, kind: str, message: str
) -> None:
    # The port is picked here, not in the parameters: xdist workers must collect equal ids.
    if kind == "another scheme":
        value = "ftp://host/db"
    elif kind == "no server":
        value = f"redis://127.0.0.1:{_closed_port()}/0"
    else:
        value = _bad_server_url(kind)
    result = _plugin(
        pytester,
        "--prefixkv-adapter=examples.engine_style:make_manager",
        f"--prefixkv-database={value}",
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_the_plugin_shares_the_database(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The first session writes its failure to the directory; a second session with a budget
    of one example fails on it."""
    db = tmp_path / "examples"
    adapter = f"--prefixkv-adapter=examples.engine_style:make_{_BUG}"
    first = _plugin(pytester, adapter, "--prefixkv-max-failures=1", f"--prefixkv-database={db}")
    first.assert_outcomes(failed=1)
    assert any(db.iterdir())
    second = _plugin(
        pytester,
        adapter,
        "--prefixkv-max-failures=1",
        "--prefixkv-examples=1",
        f"--prefixkv-database={db}",
    )
    second.assert_outcomes(failed=1)
    second.stdout.fnmatch_lines(["*minimal replay*", "*cache = make(num_blocks=*"])
