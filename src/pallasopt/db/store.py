"""The kernel database: workloads, candidates, evaluations, runs and an LLM reply cache in one SQLite file.

Shaped after TVM MetaSchedule's database: a *workload* is one kernel at one size for one target, a *candidate* is one
rewritten source of it (recipe + digest), an *evaluation* is what one tier (model, compiler, check, hardware) said
about one candidate. Failures are stored like successes (`ok=False` plus the reason), so a search never repeats one.

Every write is one `BEGIN IMMEDIATE` transaction committed before the method returns, in WAL mode with
`synchronous=FULL`: a process killed at any moment loses no committed row. See docs/database.md.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from types import TracebackType
from typing import Any

from .connection import BUSY_TIMEOUT_MS, LIVE_RUNS, LOCK_RETRIES, Connection, rows_of
from .schema import (
    SCHEMA_VERSION,
    TABLES,
    CandidateRow,
    EvalRow,
    LLMRow,
    ParentRow,
    PopulationRow,
    RunRow,
    RunState,
    WorkloadRow,
    default_path,
    dumps,
)

__all__ = [
    "BUSY_TIMEOUT_MS",
    "LOCK_RETRIES",
    "SCHEMA_VERSION",
    "CandidateRow",
    "EvalRow",
    "KernelDB",
    "LLMRow",
    "ParentRow",
    "PopulationRow",
    "RunRow",
    "RunState",
    "WorkloadRow",
    "default_path",
]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


# -------------------------------------------------------------------------------------------------------- the db


class KernelDB(Connection):
    """A handle on one database file. Safe to share between threads; open one per process (a fork reconnects)."""

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
                    LIVE_RUNS.difference_update((self._key, i) for i in ids)
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

    # ------------------------------------------------------------------------------------------------ workloads

    def workload(
        self, source_digest: str, path: Path | str, dims: Mapping[str, int], target: str, versions: Mapping[str, str]
    ) -> int:
        """The id of this workload, created on first sight."""
        key = (source_digest, dumps(dict(dims)), target, dumps(dict(versions)))

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
        return [self._decode(WorkloadRow, r) for r in self._read("SELECT * FROM workloads ORDER BY id")]

    def get_workload(self, workload_id: int) -> WorkloadRow | None:
        rows = self._read("SELECT * FROM workloads WHERE id=?", (workload_id,))
        return self._decode(WorkloadRow, rows[0]) if rows else None

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

    def add_parents(self, candidate_id: int, parent_ids: Sequence[int]) -> None:
        """Record every parent of a candidate, in order (first sight wins, like the candidate row)."""

        def body(c: sqlite3.Connection) -> None:
            c.executemany(
                "INSERT INTO candidate_parents (candidate_id, position, parent_id) VALUES (?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                [(candidate_id, i, p) for i, p in enumerate(parent_ids)],
            )

        self._write(body)

    def parents(self, candidate_id: int) -> list[int]:
        """The candidate's parents in order (several for a crossover; the `parent_id` alone for older rows)."""
        rows = self._read(
            "SELECT parent_id FROM candidate_parents WHERE candidate_id=? ORDER BY position", (candidate_id,)
        )
        if rows:
            return [int(r[0]) for r in rows]
        row = self.candidate(candidate_id)
        return [row.parent_id] if row is not None and row.parent_id is not None else []

    def put_population(self, run_id: int, generation: int, candidate_ids: Sequence[int]) -> None:
        """The population of `run_id` after `generation`, best first (replaces a generation recorded before)."""

        def body(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM population WHERE run_id=? AND generation=?", (run_id, generation))
            c.executemany(
                "INSERT INTO population (run_id, generation, rank, candidate_id) VALUES (?, ?, ?, ?)",
                [(run_id, generation, i, cid) for i, cid in enumerate(candidate_ids)],
            )

        self._write(body)

    def population(self, run_id: int) -> list[PopulationRow]:
        """Every recorded generation of a run's population, in order."""
        rows = self._read("SELECT * FROM population WHERE run_id=? ORDER BY generation, rank", (run_id,))
        return [self._decode(PopulationRow, r) for r in rows]

    def candidate(self, candidate_id: int) -> CandidateRow | None:
        rows = self._read("SELECT * FROM candidates WHERE id=?", (candidate_id,))
        return self._decode(CandidateRow, rows[0]) if rows else None

    def candidate_by_digest(self, workload_id: int, digest: str) -> CandidateRow | None:
        rows = self._read("SELECT * FROM candidates WHERE workload_id=? AND source_digest=?", (workload_id, digest))
        return self._decode(CandidateRow, rows[0]) if rows else None

    def candidates(self, workload_id: int) -> list[CandidateRow]:
        """Every candidate of a workload, in the order they were first seen."""
        rows = self._read("SELECT * FROM candidates WHERE workload_id=? ORDER BY id", (workload_id,))
        return [self._decode(CandidateRow, r) for r in rows]

    # ---------------------------------------------------------------------------------------------- evaluations

    def put_eval(
        self, candidate_id: int, tier: str, key: str, ok: bool, result: Mapping[str, Any], wall_s: float
    ) -> None:
        """Store (or replace) what `tier` said about a candidate; committed when this returns."""
        result_json = dumps(dict(result))
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
        return self._decode(EvalRow, rows[0]) if rows else None

    def evaluations(self, workload_id: int, tier: str | None = None) -> list[EvalRow]:
        """Every evaluation of a workload's candidates (optionally of one tier), oldest first."""
        sql = "SELECT e.* FROM evaluations e JOIN candidates c ON e.candidate_id = c.id WHERE c.workload_id=?"
        args: tuple[Any, ...] = (workload_id,)
        if tier is not None:
            sql += " AND e.tier=?"
            args += (tier,)
        return [self._decode(EvalRow, r) for r in self._read(sql + " ORDER BY e.id", args)]

    # ----------------------------------------------------------------------------------------------------- runs

    def start_run(self, workload_id: int, config: Mapping[str, Any]) -> int:
        """Record that a search over `workload_id` starts now; returns the run id."""
        config_json = dumps(dict(config))

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
        LIVE_RUNS.add((self._key, run_id))
        return run_id

    def finish_run(self, run_id: int, result: Mapping[str, Any], *, state: RunState = "done") -> None:
        """Record the outcome of a run (state 'done', or 'interrupted' for a run stopped early on purpose)."""
        if state not in ("done", "interrupted"):
            raise ValueError(f"a finished run is 'done' or 'interrupted', not {state!r}")
        result_json = dumps(dict(result))

        def body(c: sqlite3.Connection) -> None:
            cur = c.execute(
                "UPDATE runs SET state=?, result_json=?, finished=? WHERE id=?",
                (state, result_json, time.time(), run_id),
            )
            if cur.rowcount != 1:
                raise KeyError(f"no run {run_id} in {self.path}")

        self._write(body)
        self._my_runs.discard(run_id)
        LIVE_RUNS.discard((self._key, run_id))

    def last_run(self, workload_id: int) -> RunRow | None:
        """The newest run of a workload; one left 'running' by a process that died is marked 'interrupted'."""
        rows = self._read("SELECT * FROM runs WHERE workload_id=? ORDER BY id DESC LIMIT 1", (workload_id,))
        if not rows:
            return None
        row = self._decode(RunRow, rows[0])
        if row.state == "running" and self._owner_dead(row):
            self._write(
                lambda c: c.execute("UPDATE runs SET state='interrupted' WHERE id=? AND state='running'", (row.id,))
            )
            row = replace(row, state="interrupted")
        return row

    def runs(self, workload_id: int | None = None) -> list[RunRow]:
        """Runs (of one workload, or all), oldest first; stored states, no liveness check."""
        if workload_id is None:
            return [self._decode(RunRow, r) for r in self._read("SELECT * FROM runs ORDER BY id")]
        return [
            self._decode(RunRow, r)
            for r in self._read("SELECT * FROM runs WHERE workload_id=? ORDER BY id", (workload_id,))
        ]

    def _owner_dead(self, row: RunRow) -> bool:
        if row.host != self._host:
            return False  # another machine sharing the file: we cannot tell
        if row.pid == os.getpid():
            return (self._key, row.id) not in LIVE_RUNS  # started here by a handle that was dropped unfinished
        return not _pid_alive(row.pid)

    # ------------------------------------------------------------------------------------------------ llm cache

    def llm_get(self, key: str) -> LLMRow | None:
        rows = self._read("SELECT * FROM llm_cache WHERE key=?", (key,))
        return self._decode(LLMRow, rows[0]) if rows else None

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
            counts = {t: int(c.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in TABLES}
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
            "candidate_parents": ParentRow,
            "population": PopulationRow,
        }
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        with self._snapshot() as c:
            for table, cls in kinds.items():
                order = {"llm_cache": "key", "candidate_parents": "candidate_id, position"}.get(table, "id")
                order = "run_id, generation, rank" if table == "population" else order
                out[table] = [
                    asdict(self._decode(cls, r)) for r in rows_of(c, f"SELECT * FROM {table} ORDER BY {order}")
                ]
        return out
