"""Cheap stand-ins for the compile and check child processes, importable by Ray workers (tests/ is on their
PYTHONPATH), and a driver for the kill test. Each call appends "kind sha pid" to $PALLASOPT_TEST_JOB_LOG, so a test
can count the evaluations that really ran and where."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from pallasopt.cost_model.compiler import CompileReport
from pallasopt.harness.check import CheckResult


def sha(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def _log(tier: str, source: str) -> None:
    """Log one run; first wait as long as the file `sleep` beside the log says (the kill test slows the jobs)."""
    path = os.environ.get("PALLASOPT_TEST_JOB_LOG")
    if not path:
        return
    pause = Path(path).with_name("sleep")
    if pause.exists():
        time.sleep(float(pause.read_text() or 0))
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{tier} {sha(source)} {os.getpid()}\n")


def logged(path: Path) -> list[tuple[str, str, str]]:
    """(tier, source sha, pid) of each job run since the log was emptied."""
    return [tuple(line.split()) for line in path.read_text().splitlines()]  # type: ignore[misc]


def fake_compile(
    source: str,
    path: str,
    entry: str,
    dims: Any,
    target: str,
    *,
    steps_scale: float,
    timeout_s: float,
    call_scales: Any = (),
    dump_profile: bool = True,
):
    """A deterministic 'static estimate' from the source text (a fixed table no executor can change); without the
    profile (the result's default-dims compile gate) a verdict only, as `compile_module` gives."""
    if not dump_profile:  # another job than the tier's compile of the same source: logged as its own kind
        _log("gate", source)
        return CompileReport(ok=True, target=target)
    _log("compiler", source)
    cycles = 1000 + int(sha(source), 16) % 9000
    return CompileReport(ok=True, target=target, estimated_cycles=cycles, estimated_s=cycles * 1e-9 * steps_scale)


def fake_check(source: str, path: str, seeds: Any, *, timeout_s: float) -> CheckResult:
    """Passes every candidate except those whose digest ends in 0 (a deterministic reject)."""
    _log("check", source)
    ok = not sha(source).endswith("0")
    return CheckResult(ok=ok, status="pass" if ok else "mismatch", message="fake", seeds=tuple(seeds))


def sleepy(marker: str) -> dict[str, Any]:
    """First attempt: writes its pid and sleeps (the test kills this worker); a retry answers at once."""
    p = Path(marker)
    attempts = p.read_text().split() if p.exists() else []
    with p.open("a") as f:
        f.write(f"{os.getpid()}\n")
    if not attempts:
        time.sleep(60)
    return {"ok": True, "attempt": len(attempts), "pid": os.getpid()}


def noop() -> int:
    return 0


def lost(message: str) -> dict[str, Any]:
    return {"ok": False, "lost": True, "message": message}


def patch_tiers(monkeypatch: Any = None) -> None:
    """Make `Tiers` build its compile and check jobs from the fakes above (what jobs.py looks up)."""
    from pallasopt.cost_model import compiler
    from pallasopt.harness import check

    if monkeypatch is None:
        compiler.compile_module = fake_compile  # type: ignore[assignment]
        check.check = fake_check  # type: ignore[assignment]
    else:
        monkeypatch.setattr(compiler, "compile_module", fake_compile)
        monkeypatch.setattr(check, "check", fake_check)


def search(kernel: str, db: str, executor: Any, **kw: Any) -> Any:
    """The search every Ray test runs: the real tiers and executor, the fake child processes."""
    from pallasopt.cost_model.hardware import get_chip
    from pallasopt.optimize import optimize
    from pallasopt.search.tiers import Tiers

    tiers = Tiers(get_chip("v5e"), executor=executor)
    return optimize(kernel, beam=2, depth=2, db_path=db, evaluator=tiers, jobs=2, write_output=False, **kw)


if __name__ == "__main__":  # the driver of the kill test: python ray_jobs.py KERNEL DB RAY_ADDRESS
    import ray_jobs  # by name, so Ray pickles the fakes by reference, as in the tests

    from pallasopt.executors.ray_cluster import RayExecutor

    ray_jobs.patch_tiers()
    kernel_path, db_path, address = sys.argv[1:4]
    ray_jobs.search(kernel_path, db_path, RayExecutor(address), resume=True)
