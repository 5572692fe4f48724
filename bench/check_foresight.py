"""How well the search foresees a check's wall time, read back from a bench run's kernel DB.

The search starts a check (and, since 2026-12-03, compiles a candidate) only if the check is foreseen to end in the
budget: the baseline's check time + the cost of the extra interpret-mode work of the candidate's check dims (grid
steps, block element-steps, matmul FLOPs, compared output elements: `Funnel.check_seconds`,
`harness.check_dims.check_work`). This recomputes that foresight for every
candidate check the DB holds and sets it beside the measured wall time. Over-foresight costs candidates (a check that
would have fit is passed over); under-foresight costs budget (a check stopped at the deadline has no verdict).

    python bench/check_foresight.py RUN/bench.db [MORE.db ...] [--rerun] [--fit] [--out FILE.json]

`--rerun` measures every check again now (alone, in a fresh child) instead of reading the DB's wall times.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import zlib
from pathlib import Path
from typing import Any


def _work(source: str, path: str) -> tuple[int, int, int, int] | None:
    from pallasopt.harness.check_dims import check_work_parts
    from pallasopt.ir.kernel_ir import KernelIR

    ir = KernelIR.from_source(source, path=path)
    return None if ir.workload is None else check_work_parts(ir.workload, ir.calls)


UNITS = ("s_per_step", "s_per_element_step", "s_per_flop", "s_per_output")


def _current() -> dict[str, float]:
    from pallasopt.harness.check_dims import UNIT_COSTS

    return dict(zip(UNITS, UNIT_COSTS, strict=True))


def _remeasure(source: str, path: str) -> float:
    """This check's wall time now, in a fresh child alone (the DB's was measured beside another search)."""
    from pallasopt.harness.check import check

    result = check(source, path, timeout_s=900)
    return result.wall_s


def rows_of(db: Path, rerun: bool = False) -> list[dict[str, Any]]:
    """One row per candidate check in `db` (its first, at the search's seeds) with foresight and measurement;
    `rerun`: every check (and its kernel's baseline check) measured again now instead of read from the DB."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    q = """SELECT w.path, c.id, c.depth, c.recipe, c.source, e.wall_s, e.ok FROM evaluations e
           JOIN candidates c ON c.id = e.candidate_id JOIN workloads w ON w.id = c.workload_id
           WHERE e.tier = 'check' ORDER BY e.id"""
    seen: set[int] = set()
    base: dict[str, tuple[float, tuple[int, int, int, int] | None]] = {}
    out = []
    for path, cid, depth, recipe, source, wall, ok in con.execute(q).fetchall():
        if cid in seen:
            continue  # the final re-check on fresh seeds: same dims, the search did not foresee it
        seen.add(cid)
        try:
            work = _work(source, path)
        except Exception as e:  # a module that no longer loads here: not part of the sample
            print(f"{path} {recipe}: skipped ({type(e).__name__})", file=sys.stderr)
            continue
        if depth != 0 and (path not in base or work is None or base[path][1] is None):
            continue
        if rerun:
            wall = _remeasure(source, path)
            print(f"  {Path(path).stem} {recipe or 'baseline'}: {wall:.1f} s", file=sys.stderr)
        if depth == 0:
            base[path] = (wall, work)
            continue
        b_wall, b_work = base[path]
        assert b_work is not None and work is not None
        row = {"kernel": Path(path).stem, "recipe": recipe, "ok": bool(ok), "measured_s": wall, "base_s": b_wall}
        row |= {"d_" + u: w - bw for u, w, bw in zip(UNITS, work, b_work, strict=True)}
        row["foreseen_s"] = foresee(row, _current())
        out.append(row)
    return out


def foresee(row: dict[str, Any], unit: dict[str, float]) -> float:
    """The search's foresight of a row's check: the baseline's measured time plus the extra work's cost (never
    less than the baseline's)."""
    return float(row["base_s"] + max(0.0, sum(unit[u] * row["d_" + u] for u in UNITS)))


def is_validation(kernel: str) -> bool:
    """The held-out third of the kernels, fixed by name (crc32), chosen before any fit."""
    return zlib.crc32(kernel.encode()) % 3 == 0


def fit(rows: list[dict[str, Any]]) -> dict[str, float]:
    """measured = base_s + the extra work at per-step, per-element-step and per-FLOP seconds, by least squares in
    relative error (each check weighs the same whatever its length), every unit cost kept >= 0."""
    import numpy as np

    x = np.array([[max(0, r["d_" + u]) for u in UNITS] for r in rows], dtype=float)
    y = np.array([r["measured_s"] - r["base_s"] for r in rows])
    w = 1.0 / np.array([r["measured_s"] for r in rows])
    cols = list(range(len(UNITS)))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, cols] * w[:, None], y * w, rcond=None)
        if (coef >= 0).all() or len(cols) == 1:
            break
        cols = [c for c, v in zip(cols, coef, strict=True) if v >= 0] or [cols[0]]
    out = dict.fromkeys(UNITS, 0.0)
    for c, v in zip(cols, coef, strict=True):
        out[UNITS[c]] = max(0.0, float(v))
    return out


def score(rows: list[dict[str, Any]], unit: dict[str, float]) -> dict[str, float]:
    """Foreseen / measured over `rows` at the unit costs `unit`."""
    ratios = [foresee(r, unit) / r["measured_s"] for r in rows]
    under = sum(x < 1.0 for x in ratios)
    return {"n": len(rows), "median": statistics.median(ratios), "max": max(ratios), "min": min(ratios), "under": under}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dbs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--fit", action="store_true", help="fit the interpret-mode unit costs (held-out kernels)")
    ap.add_argument("--rerun", action="store_true", help="measure every check again now (fresh child, alone)")
    args = ap.parse_args(argv)
    rows = [r for db in args.dbs for r in rows_of(db, rerun=args.rerun)]
    for r in rows:
        print(f"{r['kernel']:36s} measured {r['measured_s']:7.1f} s  foreseen {r['foreseen_s']:7.1f} s  {r['recipe']}")
    if not rows:
        print("no candidate checks in these databases")
        return 1
    ratios = [r["foreseen_s"] / r["measured_s"] for r in rows]
    under = sum(r["foreseen_s"] < r["measured_s"] for r in rows)
    q = statistics.quantiles(ratios, n=10) if len(ratios) >= 2 else ratios
    print(
        f"{len(rows)} candidate checks: foreseen / measured median {statistics.median(ratios):.2f}, "
        f"10th-90th percentile {q[0]:.2f}-{q[-1]:.2f}, under-foreseen {under}"
    )
    report: dict[str, Any] = {"dbs": [str(d) for d in args.dbs], "rerun": args.rerun, "rows": rows}
    if args.fit:
        train = [r for r in rows if not is_validation(r["kernel"])]
        val = [r for r in rows if is_validation(r["kernel"])]
        got = fit(train)
        report["fit"] = {
            "train_kernels": sorted({r["kernel"] for r in train}),
            "validation_kernels": sorted({r["kernel"] for r in val}),
            "coefficients": got,
            "current": _current(),
            "validation_fitted": score(val, got),
            "validation_current": score(val, _current()),
            "train_fitted": score(train, got),
        }
        print(json.dumps(report["fit"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
