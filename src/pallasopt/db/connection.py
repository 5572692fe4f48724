"""KernelDB's connection: opening and checking the file, creating the schema, transactions retried while locked."""

from __future__ import annotations

import functools
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ..errors import DatabaseError
from .schema import SCHEMA_SQL, SCHEMA_VERSION, TABLES, decode_row

R = TypeVar("R")
CORRUPTED_HINT = "move the file aside and run again to start a new one"

BUSY_TIMEOUT_MS = 30_000
LOCK_RETRIES = 3  # extra attempts after sqlite's own 30 s busy wait gave up (or never waited, e.g. WAL recovery)

T = TypeVar("T")


def _is_locked(exc: sqlite3.Error) -> bool:
    msg = str(exc).lower()
    return "database is locked" in msg or "database is busy" in msg or "database table is locked" in msg


def _until_unlocked(fn: Callable[[], T], start: float | None = None) -> T:
    """`fn()`, called again while SQLite answers 'locked' *without* having waited, until BUSY_TIMEOUT_MS have passed
    since `start`. SQLite skips its busy handler for some locks: two connections switching a new file to WAL at once
    get 'database is locked' at once (29 of 200 two-thread opens of a fresh file here), not after the 30 s wait."""
    start = time.monotonic() if start is None else start
    pause = 0.005
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as e:
            if not _is_locked(e) or time.monotonic() - start >= BUSY_TIMEOUT_MS / 1000:
                raise
        time.sleep(pause)
        pause = min(0.5, pause * 2)


class Connection:
    """The connection of a KernelDB and the transaction machinery its methods write and read through."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._host = socket.gethostname()
        self._key = str(self.path.resolve())
        self._my_runs: set[int] = set()  # runs this handle started and has not finished
        self._closed = False
        self._conn = self._connect()

    def _fail(self, what: str, hint: str) -> DatabaseError:
        return DatabaseError(what, path=str(self.path), hint=hint)

    def _connect(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise self._fail(
                f"cannot create the folder {self.path.parent}: {e.strerror}", "pass another --db path"
            ) from e
        if self.path.is_dir():
            raise self._fail("is a folder, not a database file", "pass a file path to --db")
        try:
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as e:
            raise self._fail(f"cannot open the database: {e}", "check the path and its permissions") from e
        try:
            _until_unlocked(lambda: self._prepare(conn))
        except DatabaseError:
            conn.close()
            raise
        except sqlite3.OperationalError as e:
            conn.close()
            if _is_locked(e):
                raise self._fail(
                    f"is locked by another process for over {BUSY_TIMEOUT_MS // 1000} s",
                    "wait for the other pallasopt to finish or pass another --db path",
                ) from e
            raise self._fail(f"cannot use the database ({e})", "check free disk space and permissions") from e
        except sqlite3.Error as e:
            conn.close()
            raise self._fail(f"is not a usable SQLite database ({e})", CORRUPTED_HINT) from e
        return conn

    def _prepare(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        version = conn.execute("PRAGMA user_version").fetchone()[0]  # fails on a file that is not a database
        if version > SCHEMA_VERSION:
            raise DatabaseError(
                f"was written by a newer pallasopt (schema {version} > {SCHEMA_VERSION}); "
                "use a newer pallasopt or another --db path",
                path=str(self.path),
            )
        check = [row[0] for row in conn.execute("PRAGMA quick_check")]
        if check != ["ok"]:
            raise self._fail(f"is corrupted (quick_check: {check[0]})", CORRUPTED_HINT)
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise self._fail(f"cannot use write-ahead logging (journal_mode={mode})", "put --db on a local disk")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        if version == SCHEMA_VERSION:
            damage = schema_damage(conn)
            if damage:
                raise self._fail(f"is corrupted ({damage})", CORRUPTED_HINT)
            return
        ours = set(TABLES)

        def create(c: sqlite3.Connection) -> None:
            if c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                return  # another process created it while we waited for the lock
            names = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if names - ours:
                raise self._fail(
                    "is a SQLite file of another program, not a pallasopt database", "pass another --db path"
                )
            for stmt in SCHEMA_SQL.split(";"):
                if stmt.strip():
                    c.execute(stmt)
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

        self._transaction(conn, create)

    def _decode(self, cls: Callable[..., R], row: sqlite3.Row) -> R:
        """A row as `cls`; a value that no longer decodes (JSON cut or overwritten) is a corrupted database."""
        try:
            return decode_row(cls, row)
        except (ValueError, TypeError) as e:
            table = getattr(cls, "__name__", "row")
            raise self._fail(f"is corrupted (a {table} holds a value that does not decode: {e})", CORRUPTED_HINT) from e

    @property
    def conn(self) -> sqlite3.Connection:
        """The live connection; a forked child gets its own (the parent's is left alone, never closed here)."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if os.getpid() != self._pid:
            _ORPHANS.append(self._conn)  # closing a connection inherited over fork() could disturb the parent's locks
            self._pid = os.getpid()
            self._my_runs = set()
            LIVE_RUNS.clear()  # the parent's runs are not ours
            self._lock = threading.RLock()
            self._conn = self._connect()
        return self._conn

    @staticmethod
    def _transaction(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
        conn.execute("BEGIN IMMEDIATE")  # take the write lock now: no deadlock upgrading a read to a write
        try:
            out = body(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return out

    def _retrying(self, fn: Callable[[], T]) -> T:
        start = time.monotonic()
        for attempt in range(LOCK_RETRIES + 1):
            try:
                return _until_unlocked(fn, start)
            except sqlite3.OperationalError as e:
                if not _is_locked(e):
                    raise self._fail(f"database error: {e}", "check free disk space and permissions") from e
                if attempt == LOCK_RETRIES:
                    raise self._fail(
                        f"is locked by another process for over {BUSY_TIMEOUT_MS // 1000} s",
                        "wait for the other pallasopt to finish or pass another --db path",
                    ) from e
                time.sleep(0.05 * 2**attempt)
            except (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError):
                raise  # our bug: a wrong id, a closed handle
            except sqlite3.DatabaseError as e:
                raise self._fail(f"is corrupted ({e})", CORRUPTED_HINT) from e
        raise AssertionError("unreachable")

    def _write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run `body` in one committed transaction, retrying the whole of it while the file is locked."""
        with self._lock:
            conn = self.conn
            return self._retrying(lambda: self._transaction(conn, body))

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            conn = self.conn
            return self._retrying(lambda: rows_of(conn, sql, args))

    @contextmanager
    def _snapshot(self) -> Iterator[sqlite3.Connection]:
        """One read transaction, so that several SELECTs see the same state."""
        with self._lock:
            conn = self.conn
            self._retrying(lambda: conn.execute("BEGIN DEFERRED"))
            try:
                yield conn
            finally:
                conn.execute("COMMIT")


_ORPHANS: list[sqlite3.Connection] = []  # connections inherited over fork(), kept open on purpose
LIVE_RUNS: set[tuple[str, int]] = set()  # (resolved db path, run id) of runs started and not finished here


@functools.cache
def expected_columns() -> dict[str, tuple[str, ...]]:
    """The columns of each table of the current schema (read from a fresh in-memory database)."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(SCHEMA_SQL)
        return {t: tuple(r[1] for r in mem.execute(f"PRAGMA table_info({t})")) for t in TABLES}
    finally:
        mem.close()


def schema_damage(conn: sqlite3.Connection) -> str:
    """What is missing from a database that claims the current schema: '' when every table and column is there."""
    for table, columns in expected_columns().items():
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if not have:
            return f"table {table} is missing"
        missing = [c for c in columns if c not in have]
        if missing:
            return f"table {table} lacks column {missing[0]}"
    return ""


def rows_of(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    cur = conn.cursor()
    cur.row_factory = sqlite3.Row
    return list(cur.execute(sql, args))
