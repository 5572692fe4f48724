"""Every pass on kernels we did not write: apply each choice, re-trace, and check numerics in interpret mode.

    python bench/pass_sweep.py [--kernels 'bench/kernels/*.py'] [--per-pass 3] [--out bench/results/pass_sweep.json]

Counts per pass: choices offered, applied (re-traced), declined (with reasons), broken (apply raised something other
than a decline: a bug), and numerically checked ok / failed. A pass must apply correctly or decline with a reason.
"""

from __future__ import annotations

import argparse
import glob
import json
import time
from collections import Counter, defaultdict
from pathlib import Path

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PallasoptError, PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.registry import PASSES


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", default="bench/kernels/*.py")
    ap.add_argument("--per-pass", type=int, default=3, help="choices per pass and kernel to apply and check")
    ap.add_argument("--out", default="bench/results/pass_sweep.json")
    ap.add_argument("--target", default="v5e")
    args = ap.parse_args()
    chip = get_chip(args.target)
    stats: dict[str, Counter[str]] = defaultdict(Counter)
    rows = []
    start = time.perf_counter()
    for path in sorted(glob.glob(args.kernels)):
        try:
            ir = KernelIR.from_file(path)
        except PallasoptError as e:
            rows.append({"kernel": path, "load_error": str(e)})
            continue
        sources, specs = [], []
        for p in PASSES:
            try:
                options = p.choices(ir, chip)[: args.per_pass]
            except Exception as e:
                stats[p.name]["choices_crashed"] += 1
                rows.append({"kernel": path, "pass": p.name, "choices_error": f"{type(e).__name__}: {e}"})
                continue
            for choice in options:
                stats[p.name]["offered"] += 1
                try:
                    new = choice.apply(ir)
                except PassNotApplicable as e:
                    stats[p.name]["declined"] += 1
                    rows.append({"kernel": path, "spec": choice.spec(), "declined": e.reason})
                    continue
                except Exception as e:
                    stats[p.name]["broken"] += 1
                    rows.append({"kernel": path, "spec": choice.spec(), "broken": f"{type(e).__name__}: {e}"})
                    continue
                stats[p.name]["applied"] += 1
                sources.append(new.source)
                specs.append(choice.spec())
        for spec, r in zip(specs, check_many(sources, path), strict=True) if sources else ():
            name = spec.split("{")[0]
            stats[name]["check_ok" if r.ok else "check_failed"] += 1
            rows.append({"kernel": path, "spec": spec, "check": r.status, "message": r.message[:300]})
        print(f"{Path(path).name}: {len(specs)} applied, checked", flush=True)
    summary = {name: dict(c) for name, c in stats.items()}
    out = {"summary": summary, "rows": rows, "wall_s": time.perf_counter() - start, "target": args.target}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
