"""Which XLA reference figures of a bench run are faster than physics allows.

For each row of a bench results JSON with a compiler-tier XLA figure, the reference is compiled deviceless once more
without the profile (seconds) to read XLA's cost analysis, and its figure is compared with `reference_floor`: the
bytes accessed over HBM bandwidth and the FLOPs at the chip's matmul peak. A figure under the FLOP floor came from a
libtpu profile that undercounts the op (fused_21's convolution); `ESTIMATE_VERSION` 3 floors it there.

    python bench/xla_floor_audit.py bench/results/v5e-2026-12-02-full.json [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def audit_row(row: dict[str, Any], target: str) -> dict[str, Any] | None:
    """The row's XLA figure against its floors (None: no compiler-tier XLA figure to audit)."""
    import jax

    from pallasopt.bench.estimate import reference_floor, xla_work
    from pallasopt.cost_model.compiler import compile_module
    from pallasopt.cost_model.hardware import get_chip
    from pallasopt.ir.kernel_ir import KernelIR
    from pallasopt.ir.trace import arg_structs

    xla = row.get("xla") or {}
    if xla.get("tier") != "compiler" or xla.get("time_s") is None:
        return None
    ir = KernelIR.from_file(ROOT / row["path"])
    assert ir.workload is not None
    chip = get_chip(target)
    rep = compile_module(ir.source, ir.path, "reference", dict(ir.dims), chip.name, dump_profile=False)
    flops, nbytes = xla_work(rep)
    dtypes = tuple(a.dtype for a in jax.tree.leaves(arg_structs(ir.workload)) if hasattr(a, "dtype"))
    floor, why = reference_floor(chip, flops, nbytes, dtypes)
    old = float(xla["time_s"])
    out = {"kernel": row["kernel"], "xla_s": old, "floor_s": floor, "bound": why, "gflop": flops / 1e9}
    out["best_s"], out["tier"] = row.get("best_s"), row.get("tier")
    out["under_floor"] = old < floor * 0.999
    if out["under_floor"] and row.get("tier") == "compiler" and row.get("best_s"):
        out["vs_xla_old"], out["vs_xla_floored"] = old / row["best_s"], floor / row["best_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    data = json.loads(args.results.read_text())
    target = data["meta"]["target"]
    found = []
    for row in data["rows"]:
        try:
            r = audit_row(row, target)
        except Exception as e:  # an audit of one row must not end the others
            print(f"{row['kernel']}: not audited ({type(e).__name__}: {e})"[:200], file=sys.stderr)
            continue
        if r is None:
            continue
        found.append(r)
        flag = "UNDER THE FLOOR" if r["under_floor"] else "ok"
        print(
            f"{r['kernel']:40s} XLA {r['xla_s'] * 1e3:9.4f} ms  floor {r['floor_s'] * 1e3:9.4f} ms ({r['bound']})  {flag}"
        )
    if args.out:
        args.out.write_text(json.dumps({"source": str(args.results), "target": target, "rows": found}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
