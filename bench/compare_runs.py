"""Two bench result files side by side: per kernel, speedup and vs-XLA before and after, the recipe after, and the
passes other than `tile` in it (the structural passes that did it); then the counts issues 14 and 15 ask about.

    python bench/compare_runs.py bench/results/v5e-2026-11-29.json bench/results/v5e-2026-12-02.json [--md OUT.md]

Only kernels present in both files are compared; each figure keeps its tier tag ([C] compiler estimate, [M] model).
A kernel is flagged when its best time got slower at the same tier (speedups are not compared: a corrected tier moves
the naive baselines more than the tuned kernels).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

TAG = {"compiler": "C", "model": "M", "hardware": "H"}


def rows(path: Path) -> dict[str, dict[str, Any]]:
    return {r["kernel"]: r for r in json.loads(path.read_text())["rows"]}


def fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}x"


def ms(r: dict[str, Any], key: str) -> str:
    v = r.get(key)
    return "-" if v is None else f"{v * 1e3:.4g} [{TAG.get(r.get('tier'), '?')}]"


def line(name: str, a: dict[str, Any], b: dict[str, Any]) -> str:
    recipe = b.get("recipe") or []
    structural = sorted({s.split("{")[0] for s in recipe} - {"tile"})
    # Baselines move when a tier is corrected (the naive kernels' many small steps most): a drop is a slower best
    # kernel at the same tier, not a lower speedup.
    drop = a.get("tier") == b.get("tier") and (b.get("best_s") or 0) > 1.01 * (a.get("best_s") or math.inf)
    same = (a.get("recipe") or []) == recipe
    why = (
        " (slower best; same recipe: the tier's estimate moved)" if drop and same else " (slower best)" if drop else ""
    )
    return (
        f"| {name} | {ms(a, 'baseline_s')} -> {ms(a, 'best_s')} | {ms(b, 'baseline_s')} -> {ms(b, 'best_s')} | "
        f"{fmt(a.get('speedup'))} | {fmt(b.get('speedup'))}{why} | {fmt(a.get('vs_xla'))} | {fmt(b.get('vs_xla'))} | "
        f"{', '.join(f'`{s}`' for s in recipe) or '-'} | {', '.join(structural) or '-'} |"
    )


def counts(rs: dict[str, dict[str, Any]], names: list[str]) -> dict[str, Any]:
    with_xla = [n for n in names if rs[n].get("vs_xla") is not None]
    return {
        "kernels": len(names),
        "slower_than_xla": sorted(n for n in with_xla if rs[n]["vs_xla"] < 1.0),
        "with_xla": len(with_xla),
        "at_1x": sorted(n for n in names if rs[n].get("speedup") is not None and rs[n]["speedup"] < 1.005),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    a, b = rows(args.before), rows(args.after)
    names = sorted(set(a) & set(b))
    out = [
        f"Before: `{args.before}`; after: `{args.after}` ({len(names)} kernels in both).",
        "",
        "| kernel | before: baseline -> best (ms) | after: baseline -> best (ms) | speedup before | speedup after "
        "| vs XLA before | vs XLA after | recipe after | passes besides tile |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        *(line(n, a[n], b[n]) for n in names),
        "",
    ]
    ca, cb = counts(a, names), counts(b, names)
    for label, c in (("before", ca), ("after", cb)):
        out.append(
            f"- {label}: slower than XLA on {len(c['slower_than_xla'])}/{c['with_xla']} "
            f"({', '.join(c['slower_than_xla']) or '-'}); at 1.00x: {len(c['at_1x'])} ({', '.join(c['at_1x']) or '-'})"
        )
    text = "\n".join(out) + "\n"
    print(text)
    if args.md:
        args.md.write_text(text)


if __name__ == "__main__":
    main()
