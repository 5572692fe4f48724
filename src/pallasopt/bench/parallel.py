"""`pallasopt bench --executor ray`: one search per kernel at a time on threads of this driver, their compiles,
checks and timings sharing the cluster through one executor. Rows are written as kernels finish (in suite order)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from .estimate import Estimate, Estimator
from .render import write_results
from .rows import Row


def kernels_in_flight(slots: int, jobs: int, kernels: int) -> int:
    """Searches run at once: enough that their `jobs` evaluations each fill the cluster's slots."""
    return max(1, min(kernels, max(2, slots // max(1, jobs))))


class _Serialized:
    """The compiler estimator on one thread at a time (it keeps its JSON cache in a dict and a file)."""

    def __init__(self, inner: Estimator) -> None:
        self.inner, self.lock = inner, threading.Lock()

    def __call__(self, ir: Any, fn: str) -> Estimate:
        with self.lock:
            return self.inner(ir, fn)


def run_parallel(
    kernels: Sequence[Path],
    out: Path,
    stem: str,
    meta: dict[str, Any],
    *,
    console: Console,
    estimator: Estimator | None,
    in_flight: int,
    failed: Sequence[Row] = (),
    notes: Mapping[str, dict[str, Any]] | None = None,
    **opts: Any,
) -> tuple[list[Row], dict[str, Path]]:
    """Bench `kernels` with `in_flight` searches at once (each `optimize()` gets `opts`, the shared executor among
    them); results are rewritten after each kernel so an interrupted suite leaves what it finished."""
    from .runner import _row_line, bench_kernel

    notes = notes or {}
    head: list[Row] = [replace(r, suite=notes.get(r.kernel)) for r in failed]
    done: dict[int, Row] = {}
    paths: dict[str, Path] = {}
    est = _Serialized(estimator) if estimator is not None else None
    start = time.perf_counter()
    console.print(f"{in_flight} kernels at a time on the {getattr(opts.get('executor'), 'name', 'local')} executor")

    def rows() -> list[Row]:
        return head + [done[i] for i in sorted(done)]

    try:
        with ThreadPoolExecutor(in_flight, thread_name_prefix="pallasopt-kernel") as pool:
            futures = {pool.submit(bench_kernel, p, estimator=est, **opts): i for i, p in enumerate(kernels)}
            for n, fut in enumerate(as_completed(futures), 1):
                i = futures[fut]
                row = replace(fut.result(), suite=notes.get(kernels[i].stem))
                done[i] = row
                console.print(_row_line(n, len(kernels), row))
                meta["wall_s"] = time.perf_counter() - start
                paths = write_results(out, stem, rows(), meta, plot=False)
    finally:
        meta["wall_s"] = time.perf_counter() - start
        if done or head:
            paths = write_results(out, stem, rows(), meta)
    return rows(), paths
