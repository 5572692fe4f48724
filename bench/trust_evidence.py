"""Both tiers' times beside the chip's for timed variants: the evidence a per-family tier-trust rule
(`pallasopt.search.trust.TRUST`) is judged on.

    python bench/trust_evidence.py .hw/run4 .hw/run4/baselines.jsonl .hw/run4/hw-1.jsonl .hw/run4/hw-2.jsonl \
        --ids fused_11_matmul_groupnorm__baseline,fused_22_conv_bn_relu__baseline --target v5e --out evidence.json

For each variant of a `hw_measure.py prepare` folder: its family (`trust.family_of`), the compiler tier's time
(`Tiers.compiler`, deviceless libtpu, with its max join, the figure the rules compare), the roofline model's time
the bench run recorded in the manifest, the chip's median [H], the compiler/model ratio and which tier is nearer the
chip (|log(tier / chip)|).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def evidence(run_dir: Path, records: Sequence[Path], ids: Sequence[str], target: str) -> list[dict[str, Any]]:
    from pallasopt.cost_model.hardware import get_chip
    from pallasopt.ir.kernel_ir import KernelIR
    from pallasopt.search.tiers import Tiers
    from pallasopt.search.trust import family_of

    tiers = Tiers(get_chip(target))
    chip: dict[str, Any] = {}
    for f in records:
        for line in f.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                chip[r["id"]] = r
    entries = {e["id"]: e for e in json.loads((run_dir / "manifest.json").read_text())["entries"]}
    out = []
    for i in ids:
        e = entries[i]
        ir = KernelIR.from_source((run_dir / e["file"]).read_text(), e["kernel_path"])
        c = tiers.compiler(ir)
        comp = c.time_s if c is not None and c.ok else None
        join = (c.data.get("max_join_s") if c is not None else None) or comp
        model, h = e["tiers"].get("model"), chip.get(i, {}).get("median_s")
        row: dict[str, Any] = {
            "id": i,
            "family": family_of(ir.calls),
            "compiler_s": comp,
            "compiler_max_join_s": join,
            "compiler_message": c.message[:160] if c is not None else None,
            "model_s": model,
            "chip_s": h,
            "compiler_over_model": join / model if join and model else None,
        }
        if comp and model and h:
            row["err_compiler"] = abs(math.log(comp / h))
            row["err_model"] = abs(math.log(model / h))
            row["nearer"] = "compiler" if row["err_compiler"] < row["err_model"] else "model"
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("records", type=Path, nargs="+")
    ap.add_argument("--ids", required=True, help="comma-separated variant ids of the manifest")
    ap.add_argument("--target", default="v5e")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    rows = evidence(a.run_dir, a.records, a.ids.split(","), a.target)
    if a.out is not None:
        a.out.write_text(json.dumps({"target": a.target, "run_dir": str(a.run_dir), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
