"""The model and compiler tiers against measured TPU times: tokamax's autotuning points and the Pallas tutorials.

    python bench/fidelity_tokamax.py [--split validation] [--per-group 8] [--compile 0] [--out bench/results]

For each sampled point (per device and op, the first `--per-group` in the file's order of the chosen split) it writes
the kernel module that calls tokamax's Pallas kernel with the point's config (`fidelity_modules.py`), traces it and
records the model tier (roofline, `estimate_calls`; the chip is the point's device), and for the first `--compile`
points of a chip libtpu can target the compiler tier (`Tiers(chip).compiler`). Tutorial points
(`fidelity_tutorials.json`) are run too. Writes `<out>/fidelity-tokamax-<date>.json`: per point model / compiler /
measured (ms), and per family and device the median and p90 |error|, Spearman, and the ordering of config pairs of
one problem that differ by > 15% in measured time. Needs the `fidelity` extra (tokamax); no TPU.

The measured times are tokamax's XProf device times of the whole op (median of 5 runs); the tutorial times are host
wall clock over 100 calls. The model tier is the search's (`search.tiers.model_tier`): the pallas_calls plus the HBM
traffic of the wrapper's data-movement ops (`cost_model/wrapper.py`: the transposes tokamax's attention wraps around
the splash kernel); `calls_ms` and `wrapper_ms` give the two parts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

from fidelity_data import Point, config_pairs, load_points, split_table, summary, write_results  # noqa: E402
from fidelity_modules import Unsupported, module_for  # noqa: E402

CHIPS = {"tpu7x": "tpu7x", "tpu_v5_lite": "v5e"}
OPS = ("pallas_mosaic_tpu_flash_attention", "pallas_mosaic_tpu_ragged_dot")
TUTORIALS = ROOT / "bench" / "fidelity_tutorials.json"


def run_point(source: str, path: str, chip_name: str, compile_: bool) -> dict[str, Any]:
    from pallasopt.cost_model.hardware import get_chip
    from pallasopt.cost_model.roofline import estimate_calls
    from pallasopt.cost_model.wrapper import wrapper_cost
    from pallasopt.ir.kernel_ir import KernelIR

    t0 = time.time()
    ir = KernelIR.from_source(source, path)
    chip = get_chip(chip_name)
    est = estimate_calls(ir.calls, chip)
    wrapper_s = wrapper_cost(ir).seconds(chip)  # the model tier the search uses: calls + the wrapper's transposes
    row: dict[str, Any] = {
        "model_ms": (est.time_s + wrapper_s) * 1e3,
        "calls_ms": est.time_s * 1e3,
        "wrapper_ms": wrapper_s * 1e3,
        "model_ok": est.ok,
        "calls": [
            {
                "grid": list(c.grid),
                "inner_steps": c.body.inner_steps,  # loop iterations per grid step (simulated: ir/loops.py)
                "bound": e.bound,
                "prefetch": c.prefetch_note,
                "notes": list(e.notes),
                **{k: getattr(e, k) * 1e3 for k in ("mxu_s", "vpu_s", "eup_s", "dma_s", "overhead_s", "edge_s")},
            }
            for c, e in zip(ir.calls, est.calls, strict=True)
        ],
        "trace_s": round(time.time() - t0, 2),
    }
    if compile_:
        from pallasopt.search.tiers import Tiers

        t1 = time.time()
        r = Tiers(chip, compile_timeout_s=300).compiler(ir)
        row["compiler_ms"] = r.time_s * 1e3 if r is not None and r.time_s is not None else None
        row["compiler_note"] = "" if r is None else r.message
        if r is not None:  # what a correction of the static estimate is fitted on (bench/fidelity_fit.py --compiler)
            row["compiler_static_ms"] = r.data.get("static_raw_s", math.nan) * 1e3
            row["compiler_floor_ms"] = r.data.get("hbm_floor_s", math.nan) * 1e3
            row["grid_steps"] = sum(c.steps for c in ir.calls)
        row["compile_s"] = round(time.time() - t1, 1)
    return row


def with_params(source: str, params: dict[str, Any]) -> str:
    """The module source with each top-level `NAME = ...` line of `params` set to the point's value."""
    for name, value in params.items():
        source, n = re.subn(rf"^{name} = .*$", f"{name} = {value!r}", source, count=1, flags=re.M)
        if n != 1:
            raise ValueError(f"the module has no top-level `{name} = ...` line to set")
    return source


def tutorial_rows(compile_: bool, split: str = "all") -> list[dict[str, Any]]:
    """The tutorial points of `split` ("all": every one; a point without a "split" is validation)."""
    rows = []
    for t in json.loads(TUTORIALS.read_text())["points"]:
        half = t.get("split", "validation")
        if "module" not in t or split not in ("all", half):
            continue
        path = ROOT / t["module"]
        digest = hashlib.sha256(t["name"].encode()).hexdigest()[:10]
        try:
            src = with_params(path.read_text(), t.get("params", {}))
            row = run_point(src, f"/tmp/pallasopt_fidelity/{path.stem}_{digest}.py", t["chip"], compile_)
        except Exception as e:  # one bad point never stops the bench
            row = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        rows.append({"source": "tutorial", "name": t["name"], "family": t["family"], "device": t["chip"],
                     "split": half, "key": t.get("problem", t["name"]), "config": t.get("config", ""),
                     "measured_ms": t["measured_ms"], "tier": t["tier"], **row})
        print(f"{t['chip']} {t['name']}: measured {t['measured_ms']:.3f} ms, model {row.get('model_ms')}, "
              f"compiler {row.get('compiler_ms')} {row.get('error', '')[:120]}", flush=True)
    return rows


def sample(points: list[Point], split: str, per_group: int) -> list[Point]:
    groups: dict[tuple[str, str], list[Point]] = defaultdict(list)
    for p in points:
        if p.device in CHIPS and (split == "all" or p.split == split):
            groups[(p.device, p.op)].append(p)
    out = []
    for key in sorted(groups):
        taken = 0
        for p in groups[key]:
            try:
                module_for(p)
            except Unsupported:
                continue
            out.append(p)
            taken += 1
            if taken >= per_group:
                break
    return out


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if r.get("model_ms"):
            by[f"{r['family']}/{r['device']}/{r['split']}"].append(r)
    out = {}
    for key, rs in sorted(by.items()):
        entry: dict[str, Any] = {"model": summary([r["model_ms"] for r in rs], [r["measured_ms"] for r in rs])}
        comp = [r for r in rs if r.get("compiler_ms")]
        entry["compiler"] = summary([r["compiler_ms"] for r in comp], [r["measured_ms"] for r in comp])
        # Two configs of one problem whose measured times differ by > 15%: how many each tier orders right.
        entry["config_pairs_over_15pct"] = {"model": config_pairs(rs, "model_ms"),
                                            "compiler": config_pairs(rs, "compiler_ms")}
        out[key] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="validation", choices=("train", "validation", "all"))
    ap.add_argument("--per-group", type=int, default=8, help="points per (device, op)")
    ap.add_argument("--compile", type=int, default=0, help="compiler-tier points per (device, op), v5e only")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--write-split", action="store_true", help="rewrite bench/fidelity_split.json and exit")
    ap.add_argument("--tutorials-only", action="store_true", help="only the tutorial points (no tokamax needed)")
    args = ap.parse_args(argv)
    if args.tutorials_only:
        rows = tutorial_rows(compile_=args.compile > 0, split=args.split)
        name = "fidelity-tutorials" + ("-train" if args.split == "train" else "")
        write_results(args.out, name, argv if argv is not None else sys.argv[1:], script="fidelity_tokamax.py",
                      summary=aggregate(rows), points=rows)
        return 0
    points, notes = load_points()
    if args.write_split:
        (ROOT / "bench" / "fidelity_split.json").write_text(json.dumps(split_table(points), indent=1) + "\n")
        return 0
    chosen = sample([p for p in points if p.op in OPS], args.split, args.per_group)
    rows = tutorial_rows(compile_=args.compile > 0, split=args.split)
    compiled: dict[tuple[str, str], int] = defaultdict(int)
    for p in chosen:
        compile_ = CHIPS[p.device] == "v5e" and compiled[(p.device, p.op)] < args.compile
        compiled[(p.device, p.op)] += compile_
        digest = hashlib.sha256(f"{p.key}/{p.config}".encode()).hexdigest()[:10]
        base = {"source": "tokamax", "family": p.family, "device": p.device, "op": p.op, "split": p.split,
                "key": p.key, "config": p.config, "measured_ms": p.measured_ms, "tier": "measured (tokamax XProf)"}
        try:
            row = run_point(module_for(p), f"/tmp/pallasopt_fidelity/{p.op}_{digest}.py", CHIPS[p.device], compile_)
        except Exception as e:
            row = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        rows.append({**base, **row})
        print(f"{p.device} {p.family} measured {p.measured_ms:.3f} ms model {row.get('model_ms', float('nan')):.3f} "
              f"compiler {row.get('compiler_ms')} {row.get('error', '')[:120]}", flush=True)
    write_results(
        args.out,
        "fidelity-tokamax",
        argv if argv is not None else sys.argv[1:],
        notes=notes,
        summary=aggregate(rows),
        points=rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
