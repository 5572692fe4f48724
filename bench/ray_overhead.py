"""What the Ray executor costs per task compared with the local one (measured on this machine, no TPU).

    python bench/ray_overhead.py [--trivial 300] [--compiles 3] [--out bench/results/ray-overhead.json]

Trivial tasks (`os.getpid`, no child process) give the executor's own cost per job: local (a call in this thread)
against Ray (a task on a local loopback-only 2-CPU instance: one at a time, then all submitted at once). Real
compiles (examples/matmul.py for v5e, the deviceless compiler tier's child process with its profile) give the cost
of a real job through each executor. Every figure is wall time on this machine ("measured, 2-core CPU host").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

from pallasopt.config import RAY_LOCAL_ENV
from pallasopt.executors import Job, Needs
from pallasopt.executors.jobs import compile_job
from pallasopt.executors.local import LocalExecutor
from pallasopt.ir.kernel_ir import KernelIR

ROOT = Path(__file__).resolve().parents[1]


def _lost(message: str) -> dict[str, str]:
    return {"lost": message}


def trivial(n: int) -> Job:
    return Job("noop", os.getpid, {}, 10.0, _lost, Needs(cpus=1))


def per_task(executor, n: int, *, at_once: bool) -> float:
    t0 = time.perf_counter()
    if at_once:
        futures = [executor.submit(trivial(n)) for _ in range(n)]
        [f.result() for f in futures]
    else:
        for _ in range(n):
            executor.run(trivial(n))
    return (time.perf_counter() - t0) / n


def compiles(executor, k: int) -> list[float]:
    ir = KernelIR.from_file(ROOT / "examples" / "matmul.py")
    walls = []
    for _ in range(k):
        job = compile_job(ir.source, ir.path, ir.entry, ir.dims, "v5e", steps_scale=1.0, timeout_s=300)
        t0 = time.perf_counter()
        rep = executor.run(job)
        walls.append(time.perf_counter() - t0)
        assert rep.ok, rep.error
    return walls


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trivial", type=int, default=300)
    ap.add_argument("--compiles", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "ray-overhead.json"))
    args = ap.parse_args()
    os.environ.update(RAY_LOCAL_ENV)
    local = LocalExecutor(warm=False)  # a fresh child per compile, as measured before the warm workers
    out: dict[str, object] = {"machine": f"{os.cpu_count()}-core {platform.machine()}, measured", "n": args.trivial}
    out["local_per_task_s"] = per_task(local, args.trivial, at_once=False)
    out["local_compile_s"] = compiles(local, args.compiles)
    from pallasopt.executors.ray_cluster import RayExecutor

    t0 = time.perf_counter()
    ray_ex = RayExecutor(None, num_cpus=2)
    ray_ex.run(trivial(1))  # the first task starts the worker processes
    out["ray_start_s"] = time.perf_counter() - t0
    out["ray_per_task_s"] = per_task(ray_ex, args.trivial, at_once=False)
    out["ray_per_task_at_once_s"] = per_task(ray_ex, args.trivial, at_once=True)
    out["ray_compile_s"] = compiles(ray_ex, args.compiles)
    ray_ex.close()
    out["compile_overhead_s"] = statistics.mean(out["ray_compile_s"]) - statistics.mean(out["local_compile_s"])  # type: ignore[arg-type]
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    for k, v in out.items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
