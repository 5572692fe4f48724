"""The kernel database (SQLite, WAL): workloads, candidates, evaluations, runs, LLM cache. See docs/database.md."""

from .schema import (
    SCHEMA_VERSION,
    CandidateRow,
    EvalRow,
    LLMRow,
    ParentRow,
    PopulationRow,
    RunRow,
    WorkloadRow,
    default_path,
)
from .store import KernelDB

__all__ = [
    "SCHEMA_VERSION",
    "CandidateRow",
    "EvalRow",
    "KernelDB",
    "LLMRow",
    "ParentRow",
    "PopulationRow",
    "RunRow",
    "WorkloadRow",
    "default_path",
]
