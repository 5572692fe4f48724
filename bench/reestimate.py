"""A bench run's XLA reference figures estimated again at today's estimate method (`bench/estimate.py`), the rows'
recipes and times untouched.

    python bench/reestimate.py bench/results/v5e-....json --out DIR [--jobs 2] [--cache FILE.json]

When only the XLA side changed (`ESTIMATE_VERSION`), the recipes need no new search: each kernel's `reference` is
compiled deviceless again (`CompilerEstimator`, the bench's own estimator, default dims or reduced ones as the bench
does) and the results are written as a new set (JSON / Markdown / PNG, `bench.runner.write_results`), with what
changed printed per kernel. The meta's command says it was re-estimated and from which file.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    from pallasopt.bench.estimate import ESTIMATE_VERSION, CompilerEstimator
    from pallasopt.bench.render import write_results
    from pallasopt.bench.rows import Row
    from pallasopt.cost_model.hardware import get_chip
    from pallasopt.ir.kernel_ir import KernelIR

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cache", default=None, help="estimate cache (default OUT/reestimate.estimates.json)")
    args = ap.parse_args(argv)
    src = Path(args.results)
    doc = json.loads(src.read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chip = get_chip(doc["meta"]["target"])
    est = CompilerEstimator(chip, Path(args.cache) if args.cache else out / "reestimate.estimates.json")
    rows = [Row.from_dict(r) for r in doc["rows"]]

    def one(row: Row) -> Row:
        if row.xla is None:
            return row
        try:
            ir = KernelIR.from_file(ROOT / row.path)
        except Exception as e:
            print(f"{row.kernel}: not re-estimated: {type(e).__name__}: {e}", file=sys.stderr)
            return row
        return replace(row, xla=est(ir, "reference"))

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        new = list(pool.map(one, rows))
    for a, b in zip(rows, new, strict=True):
        ta, tb = (a.xla.time_s if a.xla else None), (b.xla.time_s if b.xla else None)
        if ta != tb:
            va, vb = a.vs_xla, b.vs_xla
            print(f"{a.kernel}: XLA {_ms(ta)} -> {_ms(tb)} ms; vs XLA {_x(va)} -> {_x(vb)}")
    meta: dict[str, Any] = dict(doc["meta"])
    meta["command"] = (
        f"{meta['command']} (XLA re-estimated at estimate version {ESTIMATE_VERSION}: bench/reestimate.py {src})"
    )
    meta["reestimated_from"] = str(src)
    paths = write_results(out, src.stem + f"-xla{ESTIMATE_VERSION}", new, meta)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}x"


if __name__ == "__main__":
    raise SystemExit(main())
