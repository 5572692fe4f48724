"""How well the search foresees a check's wall time, read back from a bench run's kernel DB.

The search starts a check (and, since 2026-12-03, compiles a candidate) only if the check is foreseen to end in the
budget: the baseline's check time + INTERPRET_S_PER_ELEMENT_STEP x the extra interpret-mode work of the candidate's
check dims (`Funnel.check_seconds`, `harness.check_dims.check_work`). This recomputes that foresight for every
candidate check the DB holds and sets it beside the measured wall time. Over-foresight costs candidates (a check that
would have fit is passed over); under-foresight costs budget (a check stopped at the deadline has no verdict).

    python bench/check_foresight.py RUN/bench.db [MORE.db ...] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
from pathlib import Path
from typing import Any


def _work(source: str, path: str) -> int | None:
    from pallasopt.harness.check_dims import check_work
    from pallasopt.ir.kernel_ir import KernelIR

    ir = KernelIR.from_source(source, path=path)
    return None if ir.workload is None else check_work(ir.workload, ir.calls)


def rows_of(db: Path) -> list[dict[str, Any]]:
    """One row per candidate check in `db` (its first, at the search's seeds) with foresight and measurement."""
    from pallasopt.harness.check_dims import INTERPRET_S_PER_ELEMENT_STEP

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    q = """SELECT w.path, c.id, c.depth, c.recipe, c.source, e.wall_s, e.ok FROM evaluations e
           JOIN candidates c ON c.id = e.candidate_id JOIN workloads w ON w.id = c.workload_id
           WHERE e.tier = 'check' ORDER BY e.id"""
    seen: set[int] = set()
    base: dict[str, tuple[float, int | None]] = {}
    out = []
    for path, cid, depth, recipe, source, wall, ok in con.execute(q):
        if cid in seen:
            continue  # the final re-check on fresh seeds: same dims, the search did not foresee it
        seen.add(cid)
        try:
            work = _work(source, path)
        except Exception as e:  # a module that no longer loads here: not part of the sample
            print(f"{path} {recipe}: skipped ({type(e).__name__})", file=sys.stderr)
            continue
        if depth == 0:
            base[path] = (wall, work)
            continue
        if path not in base or work is None or base[path][1] is None:
            continue
        b_wall, b_work = base[path]
        assert b_work is not None
        foreseen = b_wall + INTERPRET_S_PER_ELEMENT_STEP * max(0, work - b_work)
        kernel = Path(path).stem
        out.append({"kernel": kernel, "recipe": recipe, "ok": bool(ok), "measured_s": wall, "foreseen_s": foreseen})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dbs", type=Path, nargs="+")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = [r for db in args.dbs for r in rows_of(db)]
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
    if args.out:
        args.out.write_text(json.dumps({"dbs": [str(d) for d in args.dbs], "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
