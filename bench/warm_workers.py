"""What a warm worker saves per candidate: compiles and interpret-mode checks of tile variants of examples/matmul.py,
each in a fresh child (the old path) and in a warm worker (`harness/warm.py`), interleaved so both see the same
machine load. The first warm request of each pool pays the worker's start-up and is reported apart.

    PYTHONPATH=src python bench/warm_workers.py [--n 4] [--checks 3]

Every figure is wall time on this machine (a CPU host, no TPU), not a kernel time; the compiles are the deviceless
compiler tier's (libtpu with the static profile, v5e), the checks the oracle's (interpret mode, two seeds).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time
from pathlib import Path

from pallasopt.cost_model.compiler import CompilePool, compile_module
from pallasopt.cost_model.hardware import get_chip
from pallasopt.harness.check import check, check_pool
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.tile import TilePass
from pallasopt.search.tiers import reduce_dims_for_compile

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4, help="compiles per path")
    ap.add_argument("--checks", type=int, default=3, help="checks per path")
    args = ap.parse_args()
    chip = get_chip("v5e")
    base = KernelIR.from_file(ROOT / "examples" / "matmul.py")
    variants = [c.apply(base) for c in TilePass.choices(base, chip)[: max(args.n, args.checks) + 1]]
    print(f"load before: {os.getloadavg()[0]:.1f}")

    pool = CompilePool()
    fresh_s, warm_s, same = [], [], True
    try:
        for i, ir in enumerate(variants[: args.n + 1]):
            dims, scale = reduce_dims_for_compile(ir)
            t = time.perf_counter()
            a = compile_module(ir.source, ir.path, ir.entry, dims, chip.name, steps_scale=scale)
            t_fresh = time.perf_counter() - t
            t = time.perf_counter()
            b = compile_module(ir.source, ir.path, ir.entry, dims, chip.name, steps_scale=scale, pool=pool)
            t_warm = time.perf_counter() - t
            same &= dataclasses.replace(a, compile_s=0) == dataclasses.replace(b, compile_s=0)
            print(f"compile {i}: fresh {t_fresh:.2f} s, warm {t_warm:.2f} s" + (" (worker start-up)" if i == 0 else ""))
            if i:
                fresh_s.append(t_fresh)
                warm_s.append(t_warm)
    finally:
        pool.close()
    print(
        f"compile median: fresh {statistics.median(fresh_s):.2f} s, warm {statistics.median(warm_s):.2f} s; "
        f"same reports: {same}"
    )

    cpool = check_pool()
    fresh_c, warm_c, same_c = [], [], True
    try:
        for i, ir in enumerate(variants[: args.checks + 1]):
            t = time.perf_counter()
            a2 = check(ir.source, ir.path, seeds=(101, 202))
            t_fresh = time.perf_counter() - t
            t = time.perf_counter()
            b2 = check(ir.source, ir.path, seeds=(101, 202), pool=cpool)
            t_warm = time.perf_counter() - t
            same_c &= dataclasses.replace(a2, wall_s=0) == dataclasses.replace(b2, wall_s=0)
            print(f"check {i}: fresh {t_fresh:.2f} s, warm {t_warm:.2f} s" + (" (worker start-up)" if i == 0 else ""))
            if i:
                fresh_c.append(t_fresh)
                warm_c.append(t_warm)
    finally:
        cpool.close()
    print(
        f"check median: fresh {statistics.median(fresh_c):.2f} s, warm {statistics.median(warm_c):.2f} s; "
        f"same verdicts: {same_c}"
    )
    print(f"load after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
