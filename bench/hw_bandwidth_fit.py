"""How much of the HBM bandwidth a v5e delivers, fitted on the bench kernels measured there (bench/hw_measure.py).

    python bench/hw_bandwidth_fit.py .hw/run bench/results/hw-v5e-2026-12-05/report.json \
        --out bench/results/hw-v5e-2026-12-05/hbm-efficiency.json [--points-from EARLIER.json]

`.hw/run` is `hw_measure.py prepare`'s folder (the variants' sources). For each naive and best variant timed on the
chip, the compiler tier (`Tiers(chip).compiler`, deviceless) gives its static part S (libtpu's schedule less the
fitted per-step excess, `search/tiers.py: corrected_static`) and its HBM floor F (bytes at the datasheet bandwidth);
the tier's model is chip time ~= max(S, F / eff). The split is fixed before fitting: kernels sorted by name, even
positions train, odd positions validation; eff is the grid value (0.40-1.00) with the least median
|log(predicted / chip)| on the training kernels, and the report gives that error on the validation kernels for the
fitted eff and for eff = 1. The roofline model (whose DMA time divides by the same delivered bandwidth) is scored on
the same split at eff = 1 and at the fitted eff (`model`). `--points-from` reuses an earlier run's compiler points.
The fitted value is `Chip.hbm_efficiency` (cost_model/hardware.py); run this with the tier as it is, any eff there.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

Point = tuple[str, str, float, float, float]  # kernel, variant, static s, floor s, chip s


def timed_entries(run_dir: Path, report: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's bench variants of the kernels the chip timed."""
    timed = {r["kernel"] for r in report["rows"] if (r["baseline"] or {}).get("median_s")}
    entries = json.loads((run_dir / "manifest.json").read_text())["entries"]
    return [e for e in entries if e["group"] == "bench" and e["kernel"] in timed]


def compiler_data(run_dir: Path, report: dict[str, Any], target: str) -> dict[str, dict[str, Any]]:
    from pallasopt.cost_model.hardware import get_chip
    from pallasopt.ir.kernel_ir import KernelIR
    from pallasopt.search.tiers import Tiers, corrected_static

    tiers = Tiers(get_chip(target))
    todo = timed_entries(run_dir, report)

    def one(e: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        ir = KernelIR.from_source((run_dir / e["file"]).read_text(), e["kernel_path"])
        r = tiers.compiler(ir)
        data = dict(r.data) if r is not None else {}
        # The tier's own static part (libtpu's estimate less the fitted per-step excess) and its HBM floor at the
        # datasheet bandwidth (the tier's floor times the efficiency it already applied).
        raw, steps, floor = data.get("static_raw_s"), data.get("grid_steps"), data.get("hbm_floor_s")
        static = corrected_static(raw, int(steps), tiers.chip) if raw and steps else None
        return e["id"], {"static": static, "floor": floor * tiers.chip.floor_chip.hbm_efficiency if floor else None}

    with ThreadPoolExecutor(2) as ex:
        return dict(ex.map(one, todo))


def model_data(
    run_dir: Path, report: dict[str, Any], target: str, effs: Sequence[float]
) -> dict[str, dict[float, float]]:
    """The roofline model's time of every naive and best variant timed on the chip, per HBM efficiency in `effs`
    (the model's DMA time divides bytes by the delivered bandwidth, so each eff is one more estimate)."""
    from dataclasses import replace

    from pallasopt.cost_model.hardware import get_chip
    from pallasopt.ir.kernel_ir import KernelIR
    from pallasopt.search.tiers import model_tier

    chip = get_chip(target)
    out: dict[str, dict[float, float]] = {}
    for e in timed_entries(run_dir, report):
        ir = KernelIR.from_source((run_dir / e["file"]).read_text(), e["kernel_path"])
        times = {eff: model_tier(ir, replace(chip, hbm_efficiency=eff)).time_s for eff in effs}
        out[e["id"]] = {k: v for k, v in times.items() if v}
    return out


def model_fit(report: dict[str, Any], data: dict[str, dict[float, float]], fitted: dict[str, Any]) -> dict[str, Any]:
    """The model's median |log(model / chip)| on the compiler fit's own training / validation kernels (`fitted`:
    `fit`'s result; kernels with a model time but no compiler point, where libtpu gave no estimate, are in neither),
    at eff = 1, at the fitted eff, and at the model's own best eff on the training kernels (reported, not used)."""
    eff, train_k, val_k = fitted["eff"], set(fitted["train_kernels"]), set(fitted["validation_kernels"])
    pts = [
        (r["kernel"], data[f"{r['kernel']}__{v}"], r[v]["median_s"])
        for r in report["rows"]
        for v in ("baseline", "best")
        if r[v] and r[v].get("median_s") and data.get(f"{r['kernel']}__{v}")
    ]
    pts = [p for p in pts if p[0] in train_k | val_k]

    def err(e: float, train: bool) -> float:
        return statistics.median(abs(math.log(t[e] / h)) for k, t, h in pts if (k in train_k) == train and e in t)

    own = min(sorted(data[next(iter(data))]), key=lambda e: err(e, True))
    return {
        "points": len(pts),
        "train_median_abs_log_err": {
            "eff=1": err(1.0, True),
            "compiler_fit": err(eff, True),
            "model_own": err(own, True),
        },
        "validation_median_abs_log_err": {
            "eff=1": err(1.0, False),
            "compiler_fit": err(eff, False),
            "model_own": err(own, False),
        },
        "model_own_eff": own,
    }


def points(report: dict[str, Any], data: dict[str, dict[str, Any]]) -> list[Point]:
    out = []
    for r in report["rows"]:
        for v in ("baseline", "best"):
            rec, c = r[v], data.get(f"{r['kernel']}__{v}") or {}
            if rec and rec.get("median_s") and c.get("static") and c.get("floor"):
                out.append((r["kernel"], v, c["static"], c["floor"], rec["median_s"]))
    return out


P_GRID = (2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, math.inf)  # `Chip.overlap_p` candidates; inf is max(S, F / eff)


@functools.cache
def _chip(p: float) -> Any:
    """v5e with `overlap_p` = p: one per grid value, not one per point evaluated."""
    from dataclasses import replace

    from pallasopt.cost_model.hardware import get_chip

    return replace(get_chip("v5e"), overlap_p=p)


def joined(s: float, f: float, eff: float, p: float = math.inf) -> float:
    """The tier's time from its static part and its floor at datasheet bandwidth (`Chip.compiler_time`)."""
    return float(_chip(p).compiler_time(s, f / eff))


def error(eff: float, pts: Sequence[Point], p: float = math.inf) -> float:
    return statistics.median(abs(math.log(joined(s, f, eff, p) / h)) for _, _, s, f, h in pts)


def ratio(eff: float, pts: Sequence[Point], p: float = math.inf) -> float:
    return statistics.median(joined(s, f, eff, p) / h for _, _, s, f, h in pts)


def pair_order(
    pts: Sequence[Point], eff: float, p: float, among: Sequence[Point] = (), gaps: tuple[float, float] = (0.02, 0.5)
) -> tuple[int, int]:
    """Of the close pairs of variants of one kernel (chip times apart by more than gaps[0], less than gaps[1]: the
    calls a search has to get right; a naive kernel against a tuned one is not one), how many the tier orders as
    the chip does, and how many there are. `among`: more points to pair those of `pts` with (each pair holds at
    least one point of `pts`)."""
    right = total = 0
    by_kernel: dict[str, list[Point]] = {}
    for q in pts:
        by_kernel.setdefault(q[0], []).append(q)
    for group in by_kernel.values():
        for i, a in enumerate(group):
            others = [*group[i + 1 :], *(b for b in among if b[0] == a[0])]
            for b in others:
                if not gaps[0] < max(a[4], b[4]) / min(a[4], b[4]) - 1 < gaps[1]:
                    continue
                total += 1
                right += (joined(a[2], a[3], eff, p) < joined(b[2], b[3], eff, p)) == (a[4] < b[4])
    return right, total


def same_variant(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Two points of one source: same kernel and variant name, the same static part and floor (to 1e-6)."""
    return a[:2] == b[:2] and all(abs(x / y - 1) < 1e-6 for x, y in zip(a[2:4], b[2:4], strict=True))


def joint_fit(train: Sequence[Point], held_out: dict[str, Sequence[Point]], fixed_eff: float) -> dict[str, Any]:
    """`Chip.overlap_p` and eff together: the (eff, p) of the grid (0.40-1.00 x `P_GRID`) with the least training
    median |log(tier / chip)|; each held-out set scored at it, at max with the eff fitted alone (`fixed_eff`), and in
    pair order (`pair_order`)."""
    grid = [(x / 100, p) for x in range(40, 101) for p in P_GRID]
    eff, p = min(grid, key=lambda ep: (error(ep[0], train, ep[1]), ep[1] == math.inf))
    scores = {}
    every = [*train, *(q for pts in held_out.values() for q in pts)]
    for name, pts in {"train": train, **held_out}.items():
        if not pts:
            continue
        among = () if name in ("train", "validation") else [q for q in every if q not in pts]
        r_max, n = pair_order(pts, fixed_eff, math.inf, among)
        r_p, _ = pair_order(pts, eff, p, among)
        scores[name] = {
            "points": len(pts),
            "median_abs_log_err": {"max": error(fixed_eff, pts), "p-norm": error(eff, pts, p)},
            "median_pred_over_chip": {"max": ratio(fixed_eff, pts), "p-norm": ratio(eff, pts, p)},
            "pairs_ordered_right": {"max": r_max, "p-norm": r_p, "pairs": n},
        }
    return {"eff": eff, "p": p, "max_eff": fixed_eff, "scores": scores}


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
    ap.add_argument("--points-from", type=Path, help="reuse the compiler points of an earlier fit's JSON (no compiles)")
    ap.add_argument(
        "--held-out",
        type=Path,
        action="append",
        default=[],
        metavar="FIT.json",
        help="another fit's points (other variants timed on the chip later): scored at the joint fit, never fitted on",
    )
    a = ap.parse_args(argv)
    report = json.loads(a.report.read_text())
    if a.points_from:
        pts = [tuple(p) for p in json.loads(a.points_from.read_text())["points"]]
    else:
        pts = points(report, compiler_data(a.run_dir, report, a.target))
    result = fit(pts)  # type: ignore[arg-type]
    effs = [x / 100 for x in range(40, 101)]
    result["model"] = model_fit(report, model_data(a.run_dir, report, a.target, effs), result)
    train_k = set(result["train_kernels"])
    held = {"validation": [q for q in pts if q[0] not in train_k]}  # type: ignore[index]
    for f in a.held_out:  # a variant timed again (another session's run of a baseline) is not held out: left out
        other = [tuple(q) for q in json.loads(f.read_text())["points"]]
        held[f.stem] = [q for q in other if not any(same_variant(q, r) for r in pts)]  # type: ignore[arg-type]
    result["joint"] = joint_fit([q for q in pts if q[0] in train_k], held, result["eff"])  # type: ignore[arg-type]
    a.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("points", "floor_bound_validation")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
