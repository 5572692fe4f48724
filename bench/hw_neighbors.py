"""One step around each bench kernel's best recipe, for the chip to time: the variants `hw_measure.py prepare --probe`
takes, so the hardware tier [H] ranks a neighbourhood the CPU tiers cannot decide.

    python bench/hw_neighbors.py bench/results/v5e-....json --kernels 'fused_07*,llm_moe' --out probe.json [--tiles 8]

Per kernel, in this order: the best recipe itself (p0, timed beside the rest in one call), each shorter prefix of it
(the picks the search passed through), then the best kernel plus one choice of every registered rule pass that offers
one (each pass's own `choices`, applied through `Pass.rewrite`, the guard the search uses). The tile pass offers tens
of choices: only the `--tiles` best by the roofline model [M] are kept. Variants with the same source are kept once.
No tier but [M] runs here; correctness is the interpret-mode oracle's, run afterwards on the variants the chip picks.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from hw_measure import source_sha1  # noqa: E402  (what the chip records join on: a variant's exact source)

SKIP = ("llm-rewrite", "cost-estimate")  # an LLM pass (no API here) and a pass that only annotates


def neighbours(path: Path, recipe: Sequence[str], tiles: int, chip_name: str) -> list[tuple[list[str], str]]:
    """(recipe, why) for each variant of `path`'s kernel one step from `recipe`, best first."""
    from pallasopt.cost_model.hardware import get_chip
    from pallasopt.ir.kernel_ir import KernelIR
    from pallasopt.passes.registry import PASSES, parse_pipeline
    from pallasopt.search.tiers import model_tier

    chip = get_chip(chip_name)
    irs = [KernelIR.from_file(path)]
    for p in parse_pipeline(",".join(recipe)) if recipe else ():
        irs.append(p.rewrite(irs[-1]))
    best = irs[-1]
    seen = {source_sha1(best.source)}
    out: list[tuple[list[str], str]] = [(list(recipe), "best")]
    for n in range(len(recipe) - 1, 0, -1):
        sha = source_sha1(irs[n].source)
        if sha not in seen:
            seen.add(sha)
            out.append((list(recipe[:n]), f"prefix {n}"))
    for cls in PASSES:
        if cls.name in SKIP:
            continue
        try:
            options = cls.choices(best, chip)
        except Exception as e:  # a pass that cannot read this kernel offers nothing
            print(f"{path.stem}: {cls.name}.choices: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        found: list[tuple[float, list[str], str]] = []
        for c in options:
            try:
                new = c.rewrite(best)
                t = model_tier(new, chip).time_s
            except Exception:
                continue
            sha = source_sha1(new.source)
            if t is None or sha in seen:
                continue
            seen.add(sha)
            found.append((t, [*recipe, c.spec()], f"{cls.name} [M] {t * 1e3:.3f} ms"))
        found.sort(key=lambda f: f[0])
        keep = found[:tiles] if cls.name == "tile" else found
        out += [(r, why) for _, r, why in keep]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bench", type=Path)
    p.add_argument("--kernels", required=True, help="comma-separated globs on kernel names")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tiles", type=int, default=8)
    a = p.parse_args(argv)
    data = json.loads(a.bench.read_text())
    chip_name = (data.get("meta") or {}).get("target", "v5e")
    probe: dict[str, list[str]] = {}
    notes: dict[str, list[str]] = {}
    for row in data["rows"]:
        k = row["kernel"]
        if not any(fnmatch.fnmatch(k, g) for g in a.kernels.split(",")):
            continue
        found = neighbours(ROOT / row["path"], row.get("recipe") or [], a.tiles, chip_name)
        probe[k] = ["|".join(r) for r, _ in found]
        notes[k] = [why for _, why in found]
        print(f"{k}: {len(found)} variants", flush=True)
    a.out.write_text(json.dumps({"bench": str(a.bench), "kernels": probe, "why": notes}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
