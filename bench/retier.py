"""A bench run's best recipes re-timed at today's compiler tier without compiling them again.

    python bench/retier.py bench/results/v5e-2026-12-05-full-cba93ae.json NEW.json [--md OUT.md]

When only the tier's HBM floor changed (`Chip.hbm_efficiency`), a recipe's compiler-tier time is max(its static part,
its HBM floor): the static part is the old run's time wherever that time was above the old floor (else it is at most
the old floor), and the new floor is `search/tiers.py: compile_floor` at today's chip. So the old best recipe's time
at the new tier is max(old time, new floor) when the old time was the static part, and the new floor when it was the
old floor. That tells a recipe that got slower from a tier that got stricter: for each kernel of the old run ranked by
the compiler, the old recipe at the new tier against the new run's best (same tier, same kernel). Rows ranked by the roofline model
are re-timed by today's model outright (no compile involved).

Only for runs whose compiler tier differs in the floor alone (the same libtpu, the same step excess) and joins the
two parts by max (`Chip.overlap_p` infinite; it refuses otherwise); the script checks the old floor it recomputes
with the efficiency at 1.0 against the old time (never below it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def retime(row: dict[str, Any], target: str) -> dict[str, Any]:
    """The old row's best recipe at today's tier: {kernel, old_s, old_floor_s, new_floor_s, retier_s, bound}."""
    from pallasopt.cost_model.hardware import get_chip
    from pallasopt.ir.kernel_ir import KernelIR
    from pallasopt.passes.pipeline import apply_pipeline
    from pallasopt.passes.registry import parse_pipeline
    from pallasopt.search.tiers import compile_floor, model_tier

    chip = get_chip(target)
    if chip.overlap_p != float("inf"):  # the p-norm tier needs each recipe's static part, which the JSON does not keep
        raise RuntimeError(f"{target}'s compiler tier joins static and floor by a p-norm: retier handles max only")
    ir = KernelIR.from_file(ROOT / row["path"])  # a relative path is the repository's; an absolute one stays
    if row["recipe"]:
        ir, records = apply_pipeline(ir, parse_pipeline(",".join(row["recipe"])))
        declined = [r.spec for r in records if not r.applied]
        if declined:
            raise RuntimeError(f"{row['kernel']}: the recipe no longer applies ({declined[0]})")
    if row.get("tier") == "model":  # the model is cheap: the old recipe's time at today's model, computed outright
        t = model_tier(ir, chip).time_s
        assert t is not None
        return {"kernel": row["kernel"], "old_s": float(row["best_s"]), "retier_s": t, "bound": "model"}
    old_floor = compile_floor(ir, replace(chip, hbm_efficiency=1.0))
    new_floor = compile_floor(ir, chip)
    old = float(row["best_s"])
    if old < old_floor * (1 - 1e-6):
        raise RuntimeError(f"{row['kernel']}: old time {old:.3e} s under its recomputed old floor {old_floor:.3e} s")
    static_bound = old > old_floor * (1 + 1e-6)
    t = max(old, new_floor) if static_bound else new_floor
    return {
        "kernel": row["kernel"],
        "old_s": old,
        "old_floor_s": old_floor,
        "new_floor_s": new_floor,
        "retier_s": t,
        "bound": "static schedule" if static_bound and old >= new_floor else "HBM floor",
    }


def compare(old_run: dict[str, Any], new_run: dict[str, Any], target: str) -> list[dict[str, Any]]:
    new = {r["kernel"]: r for r in new_run["rows"]}
    out = []
    for row in old_run["rows"]:
        n = new.get(row["kernel"])
        if row.get("tier") not in ("compiler", "model") or not row.get("best_s") or n is None:
            continue
        if n.get("tier") != row["tier"]:  # ranked by another tier this time: no common scale
            out.append({"kernel": row["kernel"], "error": f"ranked by the {row['tier']} then, the {n.get('tier')} now"})
            continue
        try:
            rec = retime(row, target)
        except Exception as e:  # a recipe that no longer applies or traces: said, not dropped
            out.append({"kernel": row["kernel"], "error": str(e)})
            continue
        rec["new_best_s"] = n["best_s"]
        rec["new_recipe"] = n["recipe"]
        rec["same_recipe"] = n["recipe"] == row["recipe"]
        rec["new_over_old"] = n["best_s"] / rec["retier_s"]
        out.append(rec)
    return out


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| kernel | old best, old tier | old recipe, new tier | new best, new tier | new / old recipe | same recipe |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| `{r['kernel']}` | {r['error']} | | | | |")
            continue
        lines.append(
            f"| `{r['kernel']}` | {r['old_s'] * 1e3:.3f} ms | {r['retier_s'] * 1e3:.3f} ms ({r['bound']}) | "
            f"{r['new_best_s'] * 1e3:.3f} ms | {r['new_over_old']:.3f} | {'yes' if r['same_recipe'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--target", default="v5e")
    ap.add_argument("--md", type=Path)
    a = ap.parse_args(argv)
    rows = compare(json.loads(a.old.read_text()), json.loads(a.new.read_text()), a.target)
    text = markdown(rows)
    if a.md:
        a.md.write_text(text)
    print(text)
    worse = [r for r in rows if r.get("new_over_old", 1.0) > 1.0 + 1e-6]
    print(f"{len(rows)} kernels; new best slower than the old recipe at the new tier: {len(worse)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
