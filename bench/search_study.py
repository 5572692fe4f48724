"""Search efficiency study (issue 16): the best score each strategy reaches vs its evaluations, against exhaustive.

    python bench/search_study.py [--kernels 'bench/kernels/*.py'] [--limit 12] [--beam 8] [--depth 2]
        [--max-candidates 600] [--out bench/results/search_study]

Per kernel, every strategy (exhaustive, beam, evolve, random) runs through the same funnel on the same tiers:

- model: the real roofline model (`search.tiers.model_tier`);
- compiler: a STAND-IN that answers the model's time and verdict (counted as a compile; no libtpu compile is run);
- check: a STAND-IN that passes every candidate (counted; no interpret-mode check is run);
- hardware: none.

So the score is the model tier's time, and the counts say how many compiles and checks each strategy *would* pay on
the real tiers. With `--real` the study uses the real tiers instead (libtpu compiles, interpret-mode checks), one
kernel database per kernel shared by the four strategies, so a recipe's compile is paid once: hours on 2 cores.
Exhaustive is bounded by `--max-candidates`; where it hit the bound its "optimum" is only the best it reached, and
the table says so. `--reference OLD.json` reuses the complete exhaustive rows of an earlier study of the same target,
depth and passes (the optimum does not depend on the other strategies), so a change to a strategy can be measured
without paying for exhaustive again. Results: OUT.json, OUT.md (table), OUT.png (best score vs compiler evaluations).
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pallasopt.config import SearchConfig
from pallasopt.cost_model.hardware import Chip, get_chip
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.ir.library import untunable_notes
from pallasopt.optimize import select_passes
from pallasopt.search.node import BaselineIncorrect
from pallasopt.search.strategies import STRATEGIES
from pallasopt.search.tiers import TierResult, model_tier

ORDER = ("exhaustive", "beam", "evolve", "random")


class StandInTiers:
    """The model tier for real; compiler and check are counted stand-ins (see the module docstring)."""

    def __init__(self, chip: Chip) -> None:
        self.chip = chip
        self.counts: Counter[str] = Counter()
        self.curve: list[dict[str, Any]] = []  # after each passed check: counts so far and the best verified time
        self.best = math.inf
        self._time: dict[str, float] = {}

    def unavailable(self, tier: str) -> str | None:
        return "the study has no hardware tier" if tier == "hardware" else None

    def model(self, ir: KernelIR) -> TierResult:
        self.counts["model"] += 1
        return model_tier(ir, self.chip)

    def compiler(self, ir: KernelIR) -> TierResult | None:
        self.counts["compiler"] += 1
        r = model_tier(ir, self.chip)
        if r.ok and r.time_s is not None:
            self._time[ir.digest] = r.time_s
            return TierResult("compiler", True, r.time_s, "stand-in: the model's time")
        return TierResult("compiler", False, None, f"stand-in: {r.message}", {"error_kind": "vmem_oom"})

    def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
        self.counts["check"] += 1
        t = self._time.get(ir.digest)
        if t is not None and t < self.best:
            self.best = t
        self.curve.append({**self.counts, "best_s": self.best})
        return TierResult("check", True, None, "stand-in: not run")

    def hardware(self, ir: KernelIR) -> TierResult | None:
        return None


def reference_rows(path: str | None) -> dict[str, dict[str, Any]]:
    """kernel -> its exhaustive result from an earlier study's JSON (`--reference`), complete ones only."""
    if not path:
        return {}
    rows = json.loads(Path(path).read_text())["rows"]
    return {
        r["kernel"]: {**r["strategies"]["exhaustive"], "from": path}
        for r in rows
        if r.get("strategies", {}).get("exhaustive", {}).get("complete")
    }


def study_kernel(path: Path, chip: Chip, args: argparse.Namespace) -> dict[str, Any]:
    base = KernelIR.from_file(path)
    passes = select_passes(())
    out: dict[str, Any] = {"kernel": path.stem, "notes": list(untunable_notes(base)), "strategies": {}}
    known = reference_rows(args.reference).get(path.stem)
    for name in ORDER:
        if name == "exhaustive" and known is not None:  # the optimum is a property of the space: not recomputed
            out["strategies"][name] = known
            print(f"  {path.stem} exhaustive: best {known['best_s']} from {known['from']}", flush=True)
            continue
        tiers = StandInTiers(chip)
        depth = args.depth if name == "exhaustive" else args.strategy_depth
        cfg = SearchConfig(
            beam=args.beam,
            depth=depth,
            target=chip.name,
            strategy=name,
            jobs=1,
            seed=args.seed,
            max_candidates=args.max_candidates if name == "exhaustive" else None,
        )
        t0 = time.perf_counter()
        try:
            res = STRATEGIES[name](base, passes, tiers, chip, cfg)
        except BaselineIncorrect as e:
            out["strategies"][name] = {"error": e.message}
            continue
        s = res.score(res.best)
        out["strategies"][name] = {
            "best_s": s.time_s if s else None,
            "baseline_s": (res.score(res.baseline).time_s if res.score(res.baseline) else None),
            "recipe": list(res.best.recipe),
            "counts": dict(tiers.counts),
            "nodes": len(res.nodes),
            "stop": res.stop_reason,
            "complete": name != "exhaustive" or len(res.nodes) < args.max_candidates,
            "wall_s": time.perf_counter() - t0,
            "curve": tiers.curve,
        }
        print(f"  {path.stem} {name}: best {out['strategies'][name]['best_s']} counts {dict(tiers.counts)}", flush=True)
    return out


def _ratio(x: Any, ref: Any) -> float | None:
    return None if not x or not ref else float(x) / float(ref)


def _complete(ex: dict[str, Any]) -> str:
    if not ex.get("complete"):
        return "NO (bound)"
    return f"yes (from {Path(ex['from']).name})" if ex.get("from") else "yes"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| kernel | exhaustive best (model) | complete | "
        + " | ".join(f"{n}: best/opt, compiles, checks" for n in ORDER[1:])
        + " | exhaustive compiles, checks |"
    )
    lines = [head, "|" + " --- |" * (3 + len(ORDER))]
    for r in rows:
        st = r["strategies"]
        ex = st.get("exhaustive", {})
        cells = [r["kernel"], f"{(ex.get('best_s') or 0) * 1e3:.4f} ms", _complete(ex)]
        for n in ORDER[1:]:
            s = st.get(n, {})
            q = _ratio(s.get("best_s"), ex.get("best_s"))
            c = s.get("counts", {})
            cells.append(f"{q:.3f}, {c.get('compiler', 0)}, {c.get('check', 0)}" if q else "-")
        c = ex.get("counts", {})
        cells.append(f"{c.get('compiler', 0)}, {c.get('check', 0)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per strategy: kernels within 5% of the exhaustive best, geometric-mean ratio, compiles as a share of exhaustive's."""
    out: dict[str, Any] = {}
    for n in ORDER[1:]:
        qs, shares = [], []
        for r in rows:
            s, ex = r["strategies"].get(n, {}), r["strategies"].get("exhaustive", {})
            q = _ratio(s.get("best_s"), ex.get("best_s"))
            if q:
                qs.append(q)
                ce = ex.get("counts", {}).get("compiler", 0)
                shares.append(s.get("counts", {}).get("compiler", 0) / ce if ce else math.nan)
        out[n] = {
            "kernels": len(qs),
            "within_5pct": sum(q <= 1.05 for q in qs),
            "geomean_ratio": math.exp(sum(map(math.log, qs)) / len(qs)) if qs else None,
            "median_compile_share": sorted(shares)[len(shares) // 2] if shares else None,
        }
    return out


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows)
    cols = 4
    fig, axes = plt.subplots(math.ceil(n / cols), cols, figsize=(4 * cols, 2.8 * math.ceil(n / cols)), squeeze=False)
    for ax, r in zip(axes.flat, rows, strict=False):
        opt = r["strategies"].get("exhaustive", {}).get("best_s")
        for i, name in enumerate(ORDER):
            s = r["strategies"].get(name, {})
            pts = [(p.get("compiler", 0), opt / p["best_s"]) for p in s.get("curve", []) if opt and p["best_s"] < 1e9]
            if pts:
                ax.step([x for x, _ in pts], [y for _, y in pts], where="post", label=name, color=f"C{i}")
        ax.set_title(r["kernel"], fontsize=8)
        ax.set_xscale("symlog")
        ax.set_ylim(0, 1.05)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.supxlabel("compiler evaluations (stand-in compiles, counted)")
    fig.supylabel("exhaustive best / best verified so far (model tier)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", default="bench/kernels/*.py", help="comma-separated globs")
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("--target", default="v5e")
    ap.add_argument("--beam", type=int, default=8)
    ap.add_argument("--depth", type=int, default=2, help="exhaustive depth")
    ap.add_argument("--strategy-depth", type=int, default=4, help="depth / generations / rounds of the others")
    ap.add_argument("--max-candidates", type=int, default=600, help="bound on exhaustive's candidates")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results/search_study")
    ap.add_argument(
        "--reference",
        help="an earlier study's JSON: its complete exhaustive rows are reused (same target, depth and passes)",
    )
    args = ap.parse_args()
    chip = get_chip(args.target)
    found = {Path(p) for g in args.kernels.split(",") for p in glob.glob(g.strip())}
    paths = sorted(found)[: args.limit]
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for p in paths:
        try:
            rows.append(study_kernel(p, chip, args))
        except Exception as e:  # a kernel that does not load is reported, the study goes on
            print(f"  {p.stem}: {type(e).__name__}: {e}", flush=True)
            rows.append({"kernel": p.stem, "error": f"{type(e).__name__}: {e}", "strategies": {}})
        write(rows, args, chip, time.perf_counter() - t0)  # after each kernel: an interrupted study keeps its rows
    print(json.dumps(summary([r for r in rows if r["strategies"]]), indent=1))


def write(rows: list[dict[str, Any]], args: argparse.Namespace, chip: Chip, wall_s: float) -> None:
    import sys

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ok = [r for r in rows if r["strategies"]]
    meta = {"command": " ".join(["python bench/search_study.py", *sys.argv[1:]]), **vars(args), "wall_s": wall_s}
    result = {"meta": meta, "summary": summary(ok), "rows": rows}
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    md = [
        f"# Search efficiency study ({chip.name}, model tier; compiler and check are counted stand-ins)",
        "",
        f"Command: `{meta['command']}`; {wall_s:.0f} s wall. Cells: best/exhaustive-best (1.000 = the optimum;"
        " > 1 slower), then compiles and checks paid.",
        "",
        table(ok),
        "",
        "Summary: " + json.dumps(summary(ok)),
    ]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    if ok:
        plot(ok, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
