"""The database's tables: the schema, its version, and the row types that reading a table gives back."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

SCHEMA_VERSION = 2  # 2: candidate_parents and population (a version-1 file gains them on open)

R = TypeVar("R")
RunState = Literal["running", "done", "interrupted"]

TABLES = ("workloads", "candidates", "evaluations", "runs", "llm_cache", "candidate_parents", "population")

SCHEMA_SQL = """
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
CREATE TABLE IF NOT EXISTS candidate_parents (
    candidate_id INTEGER NOT NULL REFERENCES candidates(id),
    position INTEGER NOT NULL,
    parent_id INTEGER NOT NULL REFERENCES candidates(id),
    PRIMARY KEY (candidate_id, position)
);
CREATE TABLE IF NOT EXISTS population (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    generation INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    candidate_id INTEGER NOT NULL REFERENCES candidates(id),
    PRIMARY KEY (run_id, generation, rank)
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
class ParentRow:
    """One parent of a candidate (a crossover has two); `position` 0 is the candidates table's `parent_id`."""

    candidate_id: int
    position: int
    parent_id: int


@dataclass(frozen=True)
class PopulationRow:
    """A member of an evolutionary search's population after one generation, best first (`rank` 0)."""

    run_id: int
    generation: int
    rank: int
    candidate_id: int


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


def dumps(value: Any) -> str:
    """Deterministic JSON: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_json_default)


def decode_row(cls: Callable[..., R], r: sqlite3.Row) -> R:
    """A row as `cls`: `x_json` columns become decoded `x` fields, `ok` a bool."""
    fields: dict[str, Any] = {}
    for name in r.keys():  # noqa: SIM118 (sqlite3.Row is not a mapping)
        value = r[name]
        if name.endswith("_json"):
            fields[name.removesuffix("_json")] = None if value is None else json.loads(value)
        else:
            fields[name] = bool(value) if name == "ok" else value
    return cls(**fields)
