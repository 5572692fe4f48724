"""How much of the HBM bandwidth a v5e delivers, fitted on the bench kernels measured there (bench/hw_measure.py).

    python bench/hw_bandwidth_fit.py .hw/run bench/results/hw-v5e-2026-12-05/report.json \
        --out bench/results/hw-v5e-2026-12-05/hbm-efficiency.json

`.hw/run` is `hw_measure.py prepare`'s folder (the variants' sources). For each naive and best variant timed on the
chip, the compiler tier (`Tiers(chip).compiler`, deviceless) gives its static schedule S and its HBM floor F (bytes at
the datasheet bandwidth); the model is chip time ~= max(S, F / eff). The split is fixed before fitting: kernels sorted
by name, even positions train, odd positions validation; eff is the grid value (0.40-1.00) with the least median
|log(predicted / chip)| on the training kernels, and the report gives that error on the validation kernels for the
fitted eff and for eff = 1 (the tier as it is).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

Point = tuple[str, str, float, float, float]  # kernel, variant, static s, floor s, chip s


def compiler_data(run_dir: Path, report: dict[str, Any], target: str) -> dict[str, dict[str, Any]]:
    from pallasopt.cost_model.hardware import get_chip
    from pallasopt.ir.kernel_ir import KernelIR
    from pallasopt.search.tiers import Tiers

    tiers = Tiers(get_chip(target))
    timed = {r["kernel"] for r in report["rows"] if (r["baseline"] or {}).get("median_s")}
    entries = json.loads((run_dir / "manifest.json").read_text())["entries"]
    todo = [e for e in entries if e["group"] == "bench" and e["kernel"] in timed]

    def one(e: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        ir = KernelIR.from_source((run_dir / e["file"]).read_text(), e["kernel_path"])
        r = tiers.compiler(ir)
        data = dict(r.data) if r is not None else {}
        return e["id"], {"static": data.get("static_raw_s"), "floor": data.get("hbm_floor_s")}

    with ThreadPoolExecutor(2) as ex:
        return dict(ex.map(one, todo))


def points(report: dict[str, Any], data: dict[str, dict[str, Any]]) -> list[Point]:
    out = []
    for r in report["rows"]:
        for v in ("baseline", "best"):
            rec, c = r[v], data.get(f"{r['kernel']}__{v}") or {}
            if rec and rec.get("median_s") and c.get("static") and c.get("floor"):
                out.append((r["kernel"], v, c["static"], c["floor"], rec["median_s"]))
    return out


def error(eff: float, pts: Sequence[Point]) -> float:
    return statistics.median(abs(math.log(max(s, f / eff) / h)) for _, _, s, f, h in pts)


def ratio(eff: float, pts: Sequence[Point]) -> float:
    return statistics.median(max(s, f / eff) / h for _, _, s, f, h in pts)


def fit(pts: Sequence[Point]) -> dict[str, Any]:
    kernels = sorted({p[0] for p in pts})
    train_k, val_k = set(kernels[0::2]), set(kernels[1::2])
    train = [p for p in pts if p[0] in train_k]
    val = [p for p in pts if p[0] in val_k]
    eff = min((x / 100 for x in range(40, 101)), key=lambda e: error(e, train))
    return {
        "eff": eff,
        "train_kernels": sorted(train_k),
        "validation_kernels": sorted(val_k),
        "train_points": len(train),
        "validation_points": len(val),
        "train_median_abs_log_err": {"eff=1": error(1.0, train), "fitted": error(eff, train)},
        "validation_median_abs_log_err": {"eff=1": error(1.0, val), "fitted": error(eff, val)},
        "validation_median_pred_over_chip": {"eff=1": ratio(1.0, val), "fitted": ratio(eff, val)},
        "floor_bound_validation": [
            {"kernel": k, "variant": v, "chip_s": h, "pred_eff1": max(s, f) / h, "pred_fitted": max(s, f / eff) / h}
            for k, v, s, f, h in val
            if f / eff > s
        ],
        "points": [list(p) for p in pts],
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("report", type=Path)
    ap.add_argument("--target", default="v5e")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    report = json.loads(a.report.read_text())
    result = fit(points(report, compiler_data(a.run_dir, report, a.target)))
    a.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("points", "floor_bound_validation")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
