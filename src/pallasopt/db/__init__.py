"""The kernel database (SQLite, WAL): workloads, candidates, evaluations, runs, LLM cache. See docs/database.md."""

from .store import (
    SCHEMA_VERSION,
    CandidateRow,
    EvalRow,
    KernelDB,
    LLMRow,
    RunRow,
    WorkloadRow,
    default_path,
)

__all__ = [
    "SCHEMA_VERSION",
    "CandidateRow",
    "EvalRow",
    "KernelDB",
    "LLMRow",
    "RunRow",
    "WorkloadRow",
    "default_path",
]
