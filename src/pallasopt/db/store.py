"""The kernel database: workloads, candidates, evaluations, runs and an LLM reply cache in one SQLite file.

Shaped after TVM MetaSchedule's database: a *workload* is one kernel at one size for one target, a *candidate* is one
rewritten source of it (recipe + digest), an *evaluation* is what one tier (model, compiler, check, hardware) said
about one candidate. Failures are stored like successes (`ok=False` plus the reason), so a search never repeats one.

Every write is one `BEGIN IMMEDIATE` transaction committed before the method returns, in WAL mode with
`synchronous=FULL`: a process killed at any moment loses no committed row. See docs/database.md.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

from ..errors import DatabaseError

SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 30_000
LOCK_RETRIES = 3  # extra attempts after sqlite's own 30 s busy wait gave up (or never waited, e.g. WAL recovery)

T = TypeVar("T")
R = TypeVar("R")
RunState = Literal["running", "done", "interrupted"]

_TABLES = ("workloads", "candidates", "evaluations", "runs", "llm_cache")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS workloads (
    id INTEGER PRIMARY KEY,
    source_digest TEXT NOT NULL,
    path TEXT NOT NULL,
    dims_json TEXT NOT NULL,
    target TEXT NOT NULL,
    versions_json TEXT NOT NULL,
    created REAL NOT NULL,
    UNIQUE (source_digest, dims_json, target, versions_json)
);
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY,
    workload_id INTEGER NOT NULL REFERENCES workloads(id),
    source_digest TEXT NOT NULL,
    recipe TEXT NOT NULL,
    source TEXT NOT NULL,
    parent_id INTEGER REFERENCES candidates(id),
    depth INTEGER NOT NULL,
    created REAL NOT NULL,
    UNIQUE (workload_id, source_digest)
);
CREATE TABLE IF NOT EXISTS evaluations (
    id INTEGER PRIMARY KEY,
    candidate_id INTEGER NOT NULL REFERENCES candidates(id),
    tier TEXT NOT NULL,
    key TEXT NOT NULL,
    ok INTEGER NOT NULL,
    result_json TEXT NOT NULL,
    wall_s REAL NOT NULL,
    created REAL NOT NULL,
    UNIQUE (candidate_id, tier, key)
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    workload_id INTEGER NOT NULL REFERENCES workloads(id),
    config_json TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('running', 'done', 'interrupted')),
    result_json TEXT,
    started REAL NOT NULL,
    finished REAL,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_workload ON runs (workload_id, id);
CREATE TABLE IF NOT EXISTS llm_cache (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    prompt TEXT NOT NULL,
    reply TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    created REAL NOT NULL
);
"""


# ---------------------------------------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class WorkloadRow:
    """One kernel (by source digest) at one set of dims, for one target, under one set of tool versions."""

    id: int
    source_digest: str
    path: str  # where the kernel file was when the workload was first seen
    dims: dict[str, int]
    target: str
    versions: dict[str, str]
    created: float  # seconds since the epoch


@dataclass(frozen=True)
class CandidateRow:
    """One distinct rewritten source of a workload: the recipe that made it and the candidate it was made from."""

    id: int
    workload_id: int
    source_digest: str
    recipe: str
    source: str
    parent_id: int | None
    depth: int
    created: float


@dataclass(frozen=True)
class EvalRow:
    """What one tier said about one candidate; `key` tells variants apart (target, seeds). Failures have ok=False."""

    id: int
    candidate_id: int
    tier: str
    key: str
    ok: bool
    result: dict[str, Any]
    wall_s: float
    created: float


@dataclass(frozen=True)
class RunRow:
    """One search over a workload. `state` reads 'interrupted' when the process that started it died."""

    id: int
    workload_id: int
    config: dict[str, Any]
    state: RunState
    result: dict[str, Any] | None
    started: float
    finished: float | None
    pid: int
    host: str


@dataclass(frozen=True)
class LLMRow:
    """A cached model reply, keyed by a digest of everything that can change it."""

    key: str
    model: str
    prompt: str
    reply: str
    input_tokens: int
    output_tokens: int
    created: float


# ------------------------------------------------------------------------------------------------------- helpers


def default_path(kernel_path: Path) -> Path:
    """Where the database of a kernel file lives by default: `<kernel folder>/.pallasopt/kernels.db`."""
    return Path(kernel_path).parent / ".pallasopt" / "kernels.db"


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(value: Any) -> str:
    """Deterministic JSON: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_json_default)


def _is_locked(exc: sqlite3.Error) -> bool:
    msg = str(exc).lower()
    return "database is locked" in msg or "database is busy" in msg or "database table is locked" in msg


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


# -------------------------------------------------------------------------------------------------------- the db


class KernelDB:
    """A handle on one database file. Safe to share between threads; open one per process (a fork reconnects)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._host = socket.gethostname()
        self._key = str(self.path.resolve())
        self._my_runs: set[int] = set()  # runs this handle started and has not finished
        self._closed = False
        self._conn = self._connect()

    @classmethod
    def open(cls, path: Path | str) -> KernelDB:
        """Open (creating if needed) the database at `path`; raises DatabaseError if it cannot be used."""
        return cls(path)

    def __enter__(self) -> KernelDB:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"KernelDB({str(self.path)!r})"

    def close(self) -> None:
        """Mark runs this object started and never finished as interrupted, then close the file."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._my_runs and os.getpid() == self._pid:
                    ids = sorted(self._my_runs)
                    _LIVE_RUNS.difference_update((self._key, i) for i in ids)
                    marks = ",".join("?" * len(ids))
                    self._write(
                        lambda c: c.execute(
                            "UPDATE runs SET state='interrupted', finished=?"
                            f" WHERE state='running' AND id IN ({marks})",
                            (time.time(), *ids),
                        )
                    )
            finally:
                self._closed = True
                if os.getpid() == self._pid:
                    self._conn.close()

    # ----------------------------------------------------------------------------------------------- connection

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
            self._prepare(conn)
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
            raise self._fail(
                f"is not a usable SQLite database ({e})", "move the file aside and run again to start a new one"
            ) from e
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
            raise self._fail(
                f"is corrupted (quick_check: {check[0]})", "move the file aside and run again to start a new one"
            )
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise self._fail(f"cannot use write-ahead logging (journal_mode={mode})", "put --db on a local disk")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        if version == SCHEMA_VERSION:
            return
        ours = set(_TABLES)

        def create(c: sqlite3.Connection) -> None:
            if c.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
                return  # another process created it while we waited for the lock
            names = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if names - ours:
                raise self._fail(
                    "is a SQLite file of another program, not a pallasopt database", "pass another --db path"
                )
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    c.execute(stmt)
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

        self._transaction(conn, create)

    @property
    def conn(self) -> sqlite3.Connection:
        """The live connection; a forked child gets its own (the parent's is left alone, never closed here)."""
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if os.getpid() != self._pid:
            _ORPHANS.append(self._conn)  # closing a connection inherited over fork() could disturb the parent's locks
            self._pid = os.getpid()
            self._my_runs = set()
            _LIVE_RUNS.clear()  # the parent's runs are not ours
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
        for attempt in range(LOCK_RETRIES + 1):
            try:
                return fn()
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
                raise self._fail(f"is corrupted ({e})", "move the file aside and run again to start a new one") from e
        raise AssertionError("unreachable")

    def _write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run `body` in one committed transaction, retrying the whole of it while the file is locked."""
        with self._lock:
            conn = self.conn
            return self._retrying(lambda: self._transaction(conn, body))

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            conn = self.conn
            return self._retrying(lambda: _rows(conn, sql, args))

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

    # ------------------------------------------------------------------------------------------------ workloads

    def workload(
        self, source_digest: str, path: Path | str, dims: Mapping[str, int], target: str, versions: Mapping[str, str]
    ) -> int:
        """The id of this workload, created on first sight."""
        key = (source_digest, _dumps(dict(dims)), target, _dumps(dict(versions)))

        def body(c: sqlite3.Connection) -> int:
            c.execute(
                "INSERT INTO workloads (source_digest, path, dims_json, target, versions_json, created)"
                " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (key[0], str(path), key[1], key[2], key[3], time.time()),
            )
            sql = "SELECT id FROM workloads WHERE source_digest=? AND dims_json=? AND target=? AND versions_json=?"
            return int(c.execute(sql, key).fetchone()[0])

        return self._write(body)

    def workloads(self) -> list[WorkloadRow]:
        """Every workload, oldest first."""
        return [_decode(WorkloadRow, r) for r in self._read("SELECT * FROM workloads ORDER BY id")]

    def get_workload(self, workload_id: int) -> WorkloadRow | None:
        rows = self._read("SELECT * FROM workloads WHERE id=?", (workload_id,))
        return _decode(WorkloadRow, rows[0]) if rows else None

    # ----------------------------------------------------------------------------------------------- candidates

    def add_candidate(
        self, workload_id: int, source_digest: str, recipe: str, source: str, parent_id: int | None, depth: int
    ) -> int:
        """The id of the candidate with this digest; created (with this recipe and parent) on first sight."""

        def body(c: sqlite3.Connection) -> int:
            c.execute(
                "INSERT INTO candidates (workload_id, source_digest, recipe, source, parent_id, depth, created)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (workload_id, source_digest, recipe, source, parent_id, depth, time.time()),
            )
            sql = "SELECT id FROM candidates WHERE workload_id=? AND source_digest=?"
            return int(c.execute(sql, (workload_id, source_digest)).fetchone()[0])

        return self._write(body)

    def candidate(self, candidate_id: int) -> CandidateRow | None:
        rows = self._read("SELECT * FROM candidates WHERE id=?", (candidate_id,))
        return _decode(CandidateRow, rows[0]) if rows else None

    def candidate_by_digest(self, workload_id: int, digest: str) -> CandidateRow | None:
        rows = self._read("SELECT * FROM candidates WHERE workload_id=? AND source_digest=?", (workload_id, digest))
        return _decode(CandidateRow, rows[0]) if rows else None

    def candidates(self, workload_id: int) -> list[CandidateRow]:
        """Every candidate of a workload, in the order they were first seen."""
        rows = self._read("SELECT * FROM candidates WHERE workload_id=? ORDER BY id", (workload_id,))
        return [_decode(CandidateRow, r) for r in rows]

    # ---------------------------------------------------------------------------------------------- evaluations

    def put_eval(
        self, candidate_id: int, tier: str, key: str, ok: bool, result: Mapping[str, Any], wall_s: float
    ) -> None:
        """Store (or replace) what `tier` said about a candidate; committed when this returns."""
        result_json = _dumps(dict(result))
        self._write(
            lambda c: c.execute(
                "INSERT INTO evaluations (candidate_id, tier, key, ok, result_json, wall_s, created)"
                " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (candidate_id, tier, key) DO UPDATE SET"
                " ok=excluded.ok, result_json=excluded.result_json, wall_s=excluded.wall_s, created=excluded.created",
                (candidate_id, tier, key, int(bool(ok)), result_json, float(wall_s), time.time()),
            )
        )

    def get_eval(self, candidate_id: int, tier: str, key: str) -> EvalRow | None:
        sql = "SELECT * FROM evaluations WHERE candidate_id=? AND tier=? AND key=?"
        rows = self._read(sql, (candidate_id, tier, key))
        return _decode(EvalRow, rows[0]) if rows else None

    def evaluations(self, workload_id: int, tier: str | None = None) -> list[EvalRow]:
        """Every evaluation of a workload's candidates (optionally of one tier), oldest first."""
        sql = "SELECT e.* FROM evaluations e JOIN candidates c ON e.candidate_id = c.id WHERE c.workload_id=?"
        args: tuple[Any, ...] = (workload_id,)
        if tier is not None:
            sql += " AND e.tier=?"
            args += (tier,)
        return [_decode(EvalRow, r) for r in self._read(sql + " ORDER BY e.id", args)]

    # ----------------------------------------------------------------------------------------------------- runs

    def start_run(self, workload_id: int, config: Mapping[str, Any]) -> int:
        """Record that a search over `workload_id` starts now; returns the run id."""
        config_json = _dumps(dict(config))

        def body(c: sqlite3.Connection) -> int:
            cur = c.execute(
                "INSERT INTO runs (workload_id, config_json, state, started, pid, host)"
                " VALUES (?, ?, 'running', ?, ?, ?)",
                (workload_id, config_json, time.time(), os.getpid(), self._host),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

        run_id = self._write(body)
        self._my_runs.add(run_id)
        _LIVE_RUNS.add((self._key, run_id))
        return run_id

    def finish_run(self, run_id: int, result: Mapping[str, Any], *, state: RunState = "done") -> None:
        """Record the outcome of a run (state 'done', or 'interrupted' for a run stopped early on purpose)."""
        if state not in ("done", "interrupted"):
            raise ValueError(f"a finished run is 'done' or 'interrupted', not {state!r}")
        result_json = _dumps(dict(result))

        def body(c: sqlite3.Connection) -> None:
            cur = c.execute(
                "UPDATE runs SET state=?, result_json=?, finished=? WHERE id=?",
                (state, result_json, time.time(), run_id),
            )
            if cur.rowcount != 1:
                raise KeyError(f"no run {run_id} in {self.path}")

        self._write(body)
        self._my_runs.discard(run_id)
        _LIVE_RUNS.discard((self._key, run_id))

    def last_run(self, workload_id: int) -> RunRow | None:
        """The newest run of a workload; one left 'running' by a process that died is marked 'interrupted'."""
        rows = self._read("SELECT * FROM runs WHERE workload_id=? ORDER BY id DESC LIMIT 1", (workload_id,))
        if not rows:
            return None
        row = _decode(RunRow, rows[0])
        if row.state == "running" and self._owner_dead(row):
            self._write(
                lambda c: c.execute("UPDATE runs SET state='interrupted' WHERE id=? AND state='running'", (row.id,))
            )
            row = replace(row, state="interrupted")
        return row

    def runs(self, workload_id: int | None = None) -> list[RunRow]:
        """Runs (of one workload, or all), oldest first; stored states, no liveness check."""
        if workload_id is None:
            return [_decode(RunRow, r) for r in self._read("SELECT * FROM runs ORDER BY id")]
        return [
            _decode(RunRow, r) for r in self._read("SELECT * FROM runs WHERE workload_id=? ORDER BY id", (workload_id,))
        ]

    def _owner_dead(self, row: RunRow) -> bool:
        if row.host != self._host:
            return False  # another machine sharing the file: we cannot tell
        if row.pid == os.getpid():
            return (self._key, row.id) not in _LIVE_RUNS  # started here by a handle that was dropped unfinished
        return not _pid_alive(row.pid)

    # ------------------------------------------------------------------------------------------------ llm cache

    def llm_get(self, key: str) -> LLMRow | None:
        rows = self._read("SELECT * FROM llm_cache WHERE key=?", (key,))
        return _decode(LLMRow, rows[0]) if rows else None

    def llm_put(self, key: str, model: str, prompt: str, reply: str, input_tokens: int, output_tokens: int) -> None:
        """Store (or replace) a model reply under `key`."""
        self._write(
            lambda c: c.execute(
                "INSERT OR REPLACE INTO llm_cache (key, model, prompt, reply, input_tokens, output_tokens, created)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (key, model, prompt, reply, int(input_tokens), int(output_tokens), time.time()),
            )
        )

    # ------------------------------------------------------------------------------------------- whole-file views

    def stats(self) -> dict[str, Any]:
        """Row counts per table, evaluations per tier (total and ok), and the size on disk (file + WAL)."""
        with self._snapshot() as c:
            counts = {t: int(c.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in _TABLES}
            tiers = {
                r[0]: {"total": int(r[1]), "ok": int(r[2])}
                for r in c.execute("SELECT tier, COUNT(*), SUM(ok) FROM evaluations GROUP BY tier ORDER BY tier")
            }
        size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())
        return {
            "path": str(self.path),
            "schema_version": SCHEMA_VERSION,
            **counts,
            "evaluations_per_tier": tiers,
            "file_bytes": size,
        }

    def export(self) -> dict[str, Any]:
        """Everything in the file as plain JSON values (sources and prompts included), from one consistent snapshot."""
        kinds: dict[str, Callable[..., Any]] = {
            "workloads": WorkloadRow,
            "candidates": CandidateRow,
            "evaluations": EvalRow,
            "runs": RunRow,
            "llm_cache": LLMRow,
        }
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        with self._snapshot() as c:
            for table, cls in kinds.items():
                order = "key" if table == "llm_cache" else "id"
                out[table] = [asdict(_decode(cls, r)) for r in _rows(c, f"SELECT * FROM {table} ORDER BY {order}")]
        return out


_ORPHANS: list[sqlite3.Connection] = []  # connections inherited over fork(), kept open on purpose
_LIVE_RUNS: set[tuple[str, int]] = set()  # (resolved db path, run id) of runs started and not finished here


def _rows(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    cur = conn.cursor()
    cur.row_factory = sqlite3.Row
    return list(cur.execute(sql, args))


def _decode(cls: Callable[..., R], r: sqlite3.Row) -> R:
    """A row as `cls`: `x_json` columns become decoded `x` fields, `ok` a bool."""
    fields: dict[str, Any] = {}
    for name in r.keys():  # noqa: SIM118 (sqlite3.Row is not a mapping)
        value = r[name]
        if name.endswith("_json"):
            fields[name.removesuffix("_json")] = None if value is None else json.loads(value)
        else:
            fields[name] = bool(value) if name == "ok" else value
    return cls(**fields)
