"""Where the state machines keep the failures they find, so that every run replays them first.

Hypothesis saves every failing example it finds (shrunk) in its *example database*, and a
later run of the same machine replays the saved examples before it generates new ones.
Point every run of a campaign at one database and a failure found by any of them is the
first example every other one tries: a directory for one machine (or a shared
filesystem), Redis for a fleet. This module turns the one option the kit accepts
(``--prefixkv-database``, ``run_conformance(database=...)``, ``$PREFIXKV_DATABASE``) into a
Hypothesis database::

    parse_database(".hypothesis/campaign")        # DirectoryBasedExampleDatabase
    parse_database("redis://ci-redis:6379/3")     # RedisExampleDatabase (needs `redis`)

NOTE: the value is parsed here and nowhere else, so that the plugin, the runner and the
project's own test sessions accept exactly the same spellings and refuse the same ones with
the same typed error.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, cast
from urllib.parse import urlsplit

from hypothesis import settings as Settings
from hypothesis.database import ExampleDatabase

from prefixkv.spec.errors import PrefixCacheError

if TYPE_CHECKING:
    from redis import Redis

__all__ = [
    "DATABASE_ENV",
    "DEFAULT_TIMEOUT",
    "KEY_PREFIX",
    "MAX_TIMEOUT",
    "DatabaseOption",
    "DatabaseUnavailable",
    "DatabaseWarning",
    "GuardedDatabase",
    "InvalidDatabase",
    "campaign_settings",
    "database_from_env",
    "parse_database",
]

#: The environment variable the project's own test sessions read (see tests/conftest.py).
DATABASE_ENV = "PREFIXKV_DATABASE"

#: Prefix of every key prefixkv writes to a shared Redis, so that one server can hold the
#: databases of several projects side by side.
KEY_PREFIX = b"prefixkv-example:"

_REDIS_SCHEMES = ("redis", "rediss")

#: A directory path, a ``redis://`` / ``rediss://`` URL, or a database object as it is.
DatabaseOption: TypeAlias = str | os.PathLike[str] | ExampleDatabase


class InvalidDatabase(PrefixCacheError, ValueError):
    """The database option is neither a directory path nor a ``redis://host:port/db`` URL."""


class DatabaseUnavailable(PrefixCacheError, ConnectionError):
    """The Redis server of a database URL refused the connection, did not answer within
    the timeout, or answered with a malformed reply or one of the wrong type: at start-up
    (``connect=True``) or on any later read or write of the database."""


#: Seconds a Redis database may take to connect or to answer one command before it is
#: :class:`DatabaseUnavailable`; a URL's ``?timeout=SECONDS`` sets another.
DEFAULT_TIMEOUT = 5.0

#: The longest ``?timeout=`` a URL may ask for.
MAX_TIMEOUT = 300.0


def parse_database(
    value: DatabaseOption, *, connect: bool = False, on_error: str = "raise"
) -> ExampleDatabase:
    """The Hypothesis example database that ``value`` names.

    * an :class:`~hypothesis.database.ExampleDatabase` is returned as it is (a test passes a
      ``RedisExampleDatabase`` over a ``fakeredis`` client this way);
    * ``redis://[:password@]host[:port][/db][?timeout=SECONDS]`` (``rediss://`` for TLS)
      is a :class:`~hypothesis.extra.redis.RedisExampleDatabase` on that server, with its
      keys under :data:`KEY_PREFIX`. Every connection and every command has the URL's
      timeout (default :data:`DEFAULT_TIMEOUT`) and is not retried. With ``connect=True``
      the server must answer a ``PING`` and a read of the kind the database makes, with
      replies of the right type (:class:`DatabaseUnavailable` otherwise), so that a fleet
      with a wrong address stops at start-up instead of at its first failure;
    * anything else is a directory (created on first write): a
      :class:`~hypothesis.database.DirectoryBasedExampleDatabase`.

    Every later failure of a Redis database (refused, stalled, a malformed or wrong-type
    reply) is a :class:`DatabaseUnavailable` too, never a raw ``redis`` or builtin error
    (``on_error="raise"``), or, with ``on_error="warn"``, one warning after which the
    database is left alone for the rest of the process: what the project's own test
    sessions use, so that a server that goes away mid-session never fails a property.

    Raises :class:`InvalidDatabase` (a ``ValueError``) for an empty value, a value of another
    type, a URL of another scheme, a malformed Redis URL, or a path that is an existing file.
    """
    if on_error not in ("raise", "warn"):
        raise InvalidDatabase(f"on_error must be 'raise' or 'warn', got {on_error!r}")
    from hypothesis.database import DirectoryBasedExampleDatabase

    if isinstance(value, ExampleDatabase):
        return value
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise InvalidDatabase(
            f"a database is a directory path or a redis:// URL, got {type(value).__name__}"
        )
    if not value.strip():
        raise InvalidDatabase("the database option is empty")
    if "://" in value:
        return _redis_database(value, connect=connect, on_error=on_error)
    if Path(value).exists() and not Path(value).is_dir():
        raise InvalidDatabase(f"database path {value!r} is a file, not a directory")
    return DirectoryBasedExampleDatabase(value)


def _timeout(url: str, query: str) -> float:
    """The URL's ``?timeout=SECONDS`` (the only query understood), else the default."""
    if not query:
        return DEFAULT_TIMEOUT
    name, eq, text = query.partition("=")
    if name != "timeout" or not eq:
        raise InvalidDatabase(f"database URL {url!r}: the only query understood is ?timeout=S")
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_TIMEOUT:  # also refuses nan
        raise InvalidDatabase(
            f"database URL {url!r}: the timeout must be seconds in (0, {MAX_TIMEOUT:g}]"
        )
    return seconds


def _redis_database(url: str, *, connect: bool, on_error: str) -> ExampleDatabase:
    """``redis://host:port/db`` -> a RedisExampleDatabase (validated before any connection)."""
    parts = urlsplit(url)
    if parts.scheme not in _REDIS_SCHEMES:
        raise InvalidDatabase(
            f"database URL {url!r}: the scheme must be redis:// or rediss://, "
            "or give a directory path"
        )
    try:
        port = parts.port  # a ValueError for a port that is no int or out of range
    except ValueError:
        raise InvalidDatabase(
            f"database URL {url!r}: the port is not a number in 0..65535"
        ) from None
    if not parts.hostname:
        raise InvalidDatabase(f"database URL {url!r} names no host")
    db = parts.path.lstrip("/")
    if db and not db.isdigit():
        raise InvalidDatabase(f"database URL {url!r}: the database must be a number, got {db!r}")
    if parts.fragment:
        raise InvalidDatabase(f"database URL {url!r}: no fragment is understood")
    timeout = _timeout(url, parts.query)
    try:
        from hypothesis.extra.redis import RedisExampleDatabase
        from redis import Redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry
    except ImportError as exc:  # pragma: no cover - the campaign extra is not installed
        raise InvalidDatabase(
            f"database URL {url!r} needs the redis client: pip install 'prefixkv[campaign]'"
        ) from exc
    client = Redis(
        host=parts.hostname,
        port=6379 if port is None else port,
        db=int(db or 0),
        username=parts.username or None,
        password=parts.password or None,
        ssl=parts.scheme == "rediss",
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        # NOTE: no retries: the client's default retries a timeout three times with
        # backoff, which turns a stalled server into a wait of several timeouts per call.
        retry=Retry(NoBackoff(), 0),
    )
    database: GuardedDatabase = _guarded(RedisExampleDatabase)(
        client, url=_without_password(url, parts.password), on_error=on_error
    )
    if connect:
        database.check()
    return database


def _without_password(url: str, password: str | None) -> str:
    return url.replace(f":{password}@", ":***@") if password else url


def _guarded(base: type[ExampleDatabase]) -> type[GuardedDatabase]:
    """:class:`GuardedDatabase` over Hypothesis's ``RedisExampleDatabase`` (imported only
    when a Redis URL is given: the campaign extra may be missing)."""
    global _GUARDED
    if _GUARDED is None:
        _GUARDED = cast(
            "type[GuardedDatabase]", type("GuardedDatabase", (GuardedDatabase, base), {})
        )
    return _GUARDED


_GUARDED: type[GuardedDatabase] | None = None


class GuardedDatabase(ExampleDatabase):
    """A Redis example database whose every failure is a :class:`DatabaseUnavailable`.

    Mixed in before Hypothesis's ``RedisExampleDatabase`` (it is one, with its ``redis``
    client and key prefix). ``on_error="raise"`` raises from the call that failed;
    ``"warn"`` warns once, and from then on the database is empty and saves nothing
    (Hypothesis runs on without it).

    NOTE: every exception the client or the database raises is translated, not only
    ``redis``'s own: a malformed reply surfaces as a builtin (an ``AttributeError`` in
    the handshake, a ``TypeError`` where a set was due), and anything raised inside a call
    to the database is the database's failure, never the property's.
    """

    redis: Redis

    def __init__(self, client: Redis, *, url: str, on_error: str = "raise") -> None:
        super().__init__(client, key_prefix=KEY_PREFIX)  # type: ignore[call-arg]
        self.url = url
        self.on_error = on_error
        #: The failure that turned a ``"warn"`` database off (None while it works).
        self.failed: DatabaseUnavailable | None = None

    def _fail(self, what: str, exc: BaseException | None) -> DatabaseUnavailable:
        why = f"{type(exc).__name__}: {exc}" if exc is not None else "a wrong-type reply"
        return DatabaseUnavailable(
            f"database {self.url}: {what} failed ({why}); check that a Redis server "
            "answers there, or set ?timeout=SECONDS in the URL"
        )

    def _failed(self, error: DatabaseUnavailable) -> None:
        if self.on_error == "raise":
            raise error
        if self.failed is None:
            self.failed = error
            warnings.warn(f"{error}; running on without it", DatabaseWarning, stacklevel=3)

    def check(self) -> None:
        """Raise :class:`DatabaseUnavailable` unless the server answers a ``PING`` and a
        read of a set with replies of the right types, within the timeout.

        Raises:
            DatabaseUnavailable: whatever ``on_error`` says.
        """
        try:
            pong = self.redis.ping()
            probe = self.redis.smembers(KEY_PREFIX + b"probe")
        except Exception as exc:
            raise self._fail("the start-up check", exc) from exc
        if pong is not True:
            raise self._fail(f"the start-up check (PING answered {pong!r})", None)
        if not isinstance(probe, (set, list)) or not all(isinstance(v, bytes) for v in probe):
            raise self._fail("the start-up check", None)

    def fetch(self, key: bytes) -> Iterable[bytes]:
        """The values saved under ``key`` (every one bytes).

        Args:
            key: the test's database key.

        Returns:
            The saved values; none once a ``"warn"`` database has failed.
        """
        if self.failed is not None:
            return
        try:
            # NOTE: super() is RedisExampleDatabase in the class _guarded builds.
            values = list(super().fetch(key))  # type: ignore[safe-super]
        except Exception as exc:
            self._failed(self._fail("a read", exc))
            return
        if not all(isinstance(v, bytes) for v in values):
            self._failed(self._fail("a read", None))
            return
        yield from values

    def save(self, key: bytes, value: bytes) -> None:
        """Save ``value`` under ``key``.

        Args:
            key: the test's database key.
            value: the example to keep.
        """
        self._call("a write", super().save, key, value)  # type: ignore[safe-super]

    def delete(self, key: bytes, value: bytes) -> None:
        """Forget ``value`` under ``key``.

        Args:
            key: the test's database key.
            value: the example to forget.
        """
        self._call("a delete", super().delete, key, value)  # type: ignore[safe-super]

    def move(self, src: bytes, dest: bytes, value: bytes) -> None:
        """Move ``value`` from ``src`` to ``dest``.

        Args:
            src: the key it is under.
            dest: the key it goes to.
            value: the example.
        """
        self._call("a move", super().move, src, dest, value)

    def _call(self, what: str, call: Callable[..., None], *args: bytes) -> None:
        if self.failed is not None:
            return
        try:
            call(*args)
        except Exception as exc:
            self._failed(self._fail(what, exc))


class DatabaseWarning(UserWarning):
    """A ``on_error="warn"`` database failed; the run goes on without it."""


def database_from_env(
    environ: Mapping[str, str] | None = None, *, connect: bool = False, on_error: str = "raise"
) -> ExampleDatabase | None:
    """The database ``$PREFIXKV_DATABASE`` names; ``None`` when it is unset or empty.

    Args:
        environ: where to read the variable (default: the process environment).
        connect: check a Redis server at once (see :func:`parse_database`).
        on_error: what a Redis database's later failures do (see :func:`parse_database`).

    Returns:
        The database, or None.
    """
    value = (os.environ if environ is None else environ).get(DATABASE_ENV, "")
    return parse_database(value, connect=connect, on_error=on_error) if value.strip() else None


def campaign_settings(base: Settings, database: ExampleDatabase) -> Settings:
    """``base`` with ``database`` as its example database.

    NOTE: a derandomized profile (``ci``) has no database at all in Hypothesis: each run
    replays the same examples, so there is nothing to share. A campaign with a shared
    database wants the opposite (every machine searches somewhere else, and every failure
    found is replayed by all), so a database turns derandomization off.
    """
    return Settings(base, database=database, derandomize=False)
