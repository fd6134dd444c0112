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
from collections.abc import Mapping
from pathlib import Path
from typing import TypeAlias
from urllib.parse import urlsplit

from hypothesis import settings as Settings
from hypothesis.database import ExampleDatabase

from prefixkv.spec.errors import PrefixCacheError

__all__ = [
    "DATABASE_ENV",
    "KEY_PREFIX",
    "DatabaseOption",
    "DatabaseUnavailable",
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
    """The Redis server of a database URL did not answer (only checked with ``connect=True``)."""


def parse_database(value: DatabaseOption, *, connect: bool = False) -> ExampleDatabase:
    """The Hypothesis example database that ``value`` names.

    * an :class:`~hypothesis.database.ExampleDatabase` is returned as it is (a test passes a
      ``RedisExampleDatabase`` over a ``fakeredis`` client this way);
    * ``redis://[:password@]host[:port][/db]`` (``rediss://`` for TLS) is a
      :class:`~hypothesis.extra.redis.RedisExampleDatabase` on that server, with its keys
      under :data:`KEY_PREFIX`; with ``connect=True`` the server must answer a ``PING``
      (:class:`DatabaseUnavailable` otherwise), so that a fleet with a wrong address stops
      at start-up instead of at its first failure;
    * anything else is a directory (created on first write): a
      :class:`~hypothesis.database.DirectoryBasedExampleDatabase`.

    Raises :class:`InvalidDatabase` (a ``ValueError``) for an empty value, a value of another
    type, a URL of another scheme, a malformed Redis URL, or a path that is an existing file.
    """
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
        return _redis_database(value, connect=connect)
    if Path(value).exists() and not Path(value).is_dir():
        raise InvalidDatabase(f"database path {value!r} is a file, not a directory")
    return DirectoryBasedExampleDatabase(value)


def _redis_database(url: str, *, connect: bool) -> ExampleDatabase:
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
    if parts.query or parts.fragment:
        raise InvalidDatabase(f"database URL {url!r}: no query or fragment is understood")
    try:
        from hypothesis.extra.redis import RedisExampleDatabase
        from redis import Redis
        from redis.exceptions import RedisError
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
    )
    if connect:
        try:
            client.ping()
        except (RedisError, OSError) as exc:
            raise DatabaseUnavailable(f"database URL {url!r}: {exc}") from exc
    return RedisExampleDatabase(client, key_prefix=KEY_PREFIX)


def database_from_env(environ: Mapping[str, str] | None = None) -> ExampleDatabase | None:
    """The database ``$PREFIXKV_DATABASE`` names; ``None`` when it is unset or empty."""
    value = (os.environ if environ is None else environ).get(DATABASE_ENV, "")
    return parse_database(value) if value.strip() else None


def campaign_settings(base: Settings, database: ExampleDatabase) -> Settings:
    """``base`` with ``database`` as its example database.

    NOTE: a derandomized profile (``ci``) has no database at all in Hypothesis: each run
    replays the same examples, so there is nothing to share. A campaign with a shared
    database wants the opposite (every machine searches somewhere else, and every failure
    found is replayed by all), so a database turns derandomization off.
    """
    return Settings(base, database=database, derandomize=False)
