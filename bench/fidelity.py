"""Fidelity of the roofline model against the deviceless TPU compiler, over a sweep of tile configurations.

    python bench/fidelity.py [--targets v5e,v6e] [--quick] [--out bench/results]

For every configuration (a kernel module and its block sizes, made with the `tile` pass, VMEM overflows included)
and every target, it records the model's estimate (time, bound, VMEM footprint, fits_vmem, legality) and the
compiler tier's verdict (`Tiers(chip).compiler`: ok, vmem_oom or another error; its time = max(static schedule,
HBM bytes / bandwidth); the static schedule alone; the scoped VMEM the compiler allocated). Per target it reports:
Spearman rank correlation of model vs compiler time on the configurations both accept (pooled and within each
kernel), the median and IQR of the ratio model / compiler, agreement of VMEM and legality verdicts, and the worst
outliers. Writes `<out>/fidelity-<target>-<date>.json` and prints Markdown. Compiles run 2 at a time (each is a
subprocess). Needs libtpu (the `tpu` extra); no TPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

# (kernel module, list of tile-knob settings). The first entry of a kernel is its default (no rewrite) when the
# sizes equal the module's own. Chosen to span step-overhead-, memory- and compute-bound regimes and to straddle
# the scoped VMEM limits (16 MiB on v5e, 32 MiB on v6e), with a few blocks that break the (8, 128) rule.
SWEEP: dict[str, list[dict[str, int]]] = {
    "examples/matmul.py": [
        {"bm": 128, "bn": 128, "bk": 128},
        {"bm": 128, "bn": 128, "bk": 512},
        {"bm": 256, "bn": 256, "bk": 256},
        {"bm": 256, "bn": 256, "bk": 512},
        {"bm": 256, "bn": 512, "bk": 512},
        {"bm": 512, "bn": 512, "bk": 512},
        {"bm": 512, "bn": 512, "bk": 1024},
        {"bm": 512, "bn": 512, "bk": 2048},
        {"bm": 512, "bn": 1024, "bk": 1024},
        {"bm": 512, "bn": 2048, "bk": 512},
        {"bm": 1024, "bn": 512, "bk": 1024},
        {"bm": 1024, "bn": 1024, "bk": 256},
        {"bm": 1024, "bn": 1024, "bk": 512},
        {"bm": 1024, "bn": 1024, "bk": 1024},
        {"bm": 128, "bn": 2048, "bk": 2048},
        {"bm": 2048, "bn": 2048, "bk": 256},
        {"bm": 2048, "bn": 2048, "bk": 2048},
    ],
    "examples/softmax.py": [{"ROWS_PER_BLOCK": r} for r in (8, 16, 32, 64, 128, 256, 512, 1024)],
    "examples/rmsnorm.py": [{"block_rows": r} for r in (8, 16, 32, 64, 128, 256, 512, 1024)],
    "examples/elementwise.py": [
        {"axis0": 8, "axis1": 128},
        {"axis0": 8, "axis1": 1024},
        {"axis0": 32, "axis1": 512},
        {"axis0": 128, "axis1": 1024},
        {"axis0": 256, "axis1": 1024},
        {"axis0": 256, "axis1": 2048},
        {"axis0": 512, "axis1": 2048},
        {"axis0": 1024, "axis1": 2048},
        {"axis0": 4, "axis1": 128},  # second-minor 4: breaks the (8, 128) rule
        {"axis0": 8, "axis1": 64},  # minor 64: breaks the (8, 128) rule
    ],
    "bench/kernels/fused_23_softmax_vocab.py": [{"ROWS": r} for r in (8, 16, 32, 64)],
    "bench/kernels/llm_flash_attention.py": [
        {"BLOCK_Q": 128, "BLOCK_K": 128},
        {"BLOCK_Q": 256, "BLOCK_K": 256},
        {"BLOCK_Q": 512, "BLOCK_K": 512},
        {"BLOCK_Q": 1024, "BLOCK_K": 512},
        {"BLOCK_Q": 1024, "BLOCK_K": 1024},
        {"BLOCK_Q": 2048, "BLOCK_K": 2048},
    ],
}

SLOW_FIRST = ("bench/kernels/llm_flash_attention.py", "bench/kernels/fused_23_softmax_vocab.py")

# --quick: a few configurations per example kernel (about a minute per target).
QUICK: dict[str, list[dict[str, int]]] = {
    "examples/matmul.py": [
        {"bm": 128, "bn": 128, "bk": 128},
        {"bm": 512, "bn": 512, "bk": 512},
        {"bm": 1024, "bn": 1024, "bk": 1024},
    ],
    "examples/softmax.py": [{"ROWS_PER_BLOCK": r} for r in (8, 128, 1024)],
    "examples/rmsnorm.py": [{"block_rows": r} for r in (16, 256)],
    "examples/elementwise.py": [{"axis0": 8, "axis1": 128}, {"axis0": 256, "axis1": 1024}],
}


@dataclass(frozen=True)
class Config:
    kernel: str  # module path relative to the repo root
    sizes: tuple[tuple[str, int], ...]

    @property
    def label(self) -> str:
        return f"{Path(self.kernel).stem}[{','.join(f'{k}={v}' for k, v in self.sizes)}]"

    @property
    def spec(self) -> str:
        return "tile{call=0," + ",".join(f"{k}={v}" for k, v in self.sizes) + "}"


def build_variants(sweep: dict[str, list[dict[str, int]]]) -> list[tuple[Config, Any, str | None]]:
    """(config, KernelIR or None, error) for each configuration; the tile pass makes the variants."""
    from pallasopt.ir.kernel_ir import KernelIR
    from pallasopt.passes.registry import parse_pipeline
    from pallasopt.passes.tile import knobs_of

    out: list[tuple[Config, Any, str | None]] = []
    for kernel, settings in sweep.items():
        base = KernelIR.from_file(ROOT / kernel)
        current = {k.name: k.value for k in knobs_of(base) if k.call == 0}
        for s in settings:
            cfg = Config(kernel, tuple(s.items()))
            if all(current.get(k) == v for k, v in s.items()):
                out.append((cfg, base, None))
                continue
            try:
                out.append((cfg, parse_pipeline(cfg.spec)[0].apply(base), None))
            except Exception as e:  # a setting the pass declines is recorded, not fatal
                out.append((cfg, None, f"{type(e).__name__}: {e}"))
    return out


def model_record(ir: Any, chip: Any) -> dict[str, Any]:
    from pallasopt.cost_model.roofline import estimate_calls

    est = estimate_calls(ir.calls, chip)
    c = est.calls[0]  # every swept kernel has one pallas_call
    return {
        "chip": chip.name,
        "time_s": est.time_s,
        "ok": est.ok,
        "legal": c.legal,
        "fits_vmem": c.fits_vmem,
        "bound": c.bound,
        "vmem_bytes": c.vmem_bytes,
        "vmem_limit_bytes": c.vmem_limit_bytes,
        "dma_s": c.dma_s,
        "edge_s": c.edge_s,
        "mxu_s": c.mxu_s,
        "vpu_s": c.vpu_s,
        "eup_s": c.eup_s,
        "overhead_s": c.overhead_s,
        # the model's on-core part (what the compiler's static schedule models): compute + step overhead
        "on_core_s": max(c.mxu_s, c.vpu_s + c.eup_s) + c.overhead_s,
        "bytes": c.bytes,
        "problems": list(c.problems),
        "grid": list(ir.calls[0].grid),
        "steps": c.steps,
    }


def compiler_record(ir: Any, chip: Any, timeout_s: float) -> dict[str, Any]:
    from pallasopt.search.tiers import Tiers

    t0 = time.perf_counter()
    r = Tiers(chip, compile_timeout_s=timeout_s).compiler(ir)
    if r is None:
        return {"status": "unavailable", "wall_s": time.perf_counter() - t0}
    rep = r.data.get("report", {})
    status = "ok" if r.ok else ("vmem_oom" if rep.get("error_kind") == "vmem_oom" else "error")
    return {
        "status": status,
        "error_kind": rep.get("error_kind"),
        "time_s": r.time_s,
        "static_s": rep.get("estimated_s"),
        "vmem_bytes": rep.get("vmem_bytes"),
        "dims": r.data.get("dims"),
        "steps_scale": r.data.get("steps_scale"),
        "message": r.message[:400],
        "compile_s": rep.get("compile_s"),
        "wall_s": time.perf_counter() - t0,
    }


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rho: Pearson correlation of the ranks (ties get their average rank)."""
    if len(a) < 3:
        return math.nan
    ra, rb = _ranks(np.asarray(a, float)), _ranks(np.asarray(b, float))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / den) if den > 0 else math.nan


def _ranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), float)
    ranks[order] = np.arange(1, len(x) + 1)
    for v in np.unique(x):  # average rank over ties
        tie = x == v
        if tie.sum() > 1:
            ranks[tie] = ranks[tie].mean()
    return ranks


def _compare(model: Sequence[float], compiler: Sequence[float]) -> dict[str, Any]:
    """n, Spearman, and the median and IQR of model / compiler."""
    ratio = np.array([x / y for x, y in zip(model, compiler, strict=True) if y])
    return {
        "n": len(model),
        "spearman": spearman(model, compiler),
        "median_ratio": float(np.median(ratio)) if len(ratio) else math.nan,
        "iqr_ratio": [float(np.percentile(ratio, 25)), float(np.percentile(ratio, 75))] if len(ratio) else [],
    }


def _tier(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return _compare([r["model"]["time_s"] for r in rows], [r["compiler"]["time_s"] for r in rows])


def _on_core(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return _compare([r["model"]["on_core_s"] for r in rows], [r["compiler"]["static_s"] for r in rows])


def _mean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return float(np.mean(kept)) if kept else math.nan


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-target figures from the per-configuration rows."""
    both = [
        r
        for r in rows
        if r["model"] and r["model"]["ok"] and r["compiler"]["status"] == "ok" and r["compiler"]["time_s"]
    ]
    # The tier time takes the model's own HBM floor, so on memory-bound configs model and tier agree by
    # construction. The independent check: where the model is not memory-bound, its on-core time (compute + step
    # overhead) against the static schedule alone.
    core = [r for r in both if r["model"]["bound"] != "memory" and r["compiler"]["static_s"]]
    per_kernel: dict[str, dict[str, Any]] = {}
    for k in sorted({r["kernel"] for r in both}):
        per_kernel[k] = {
            "tier": _tier([r for r in both if r["kernel"] == k]),
            "on_core": _on_core([r for r in core if r["kernel"] == k]),
        }
    # Bound verdicts: the model calls a config memory-bound iff the static schedule is under the HBM floor.
    floor_wins = [r for r in both if (r["compiler"]["static_s"] or 0) < r["compiler"]["time_s"]]
    bound_agree = sum(1 for r in both if (r["model"]["bound"] == "memory") == (r in floor_wins))
    # VMEM verdicts: configurations the model finds legal and the compiler answered (ok or vmem_oom).
    vm = [r for r in rows if r["model"] and r["model"]["legal"] and r["compiler"]["status"] in ("ok", "vmem_oom")]
    vmem_dis = [r for r in vm if r["model"]["fits_vmem"] != (r["compiler"]["status"] == "ok")]
    # Legality: model `legal` vs the compiler not failing in lowering.
    lg = [r for r in rows if r["model"] and r["compiler"]["status"] not in ("unavailable", "not built")]
    legal_dis = [r for r in lg if r["model"]["legal"] != (r["compiler"]["error_kind"] != "lowering")]
    # VMEM bytes: only successful compiles (an OOM message gives the failing allocation, not always the total).
    vmem_ratio = np.array(
        [r["compiler"]["vmem_bytes"] / r["model"]["vmem_bytes"] for r in both if r["compiler"]["vmem_bytes"]]
    )
    worst = sorted(both, key=lambda r: -abs(math.log(r["model"]["time_s"] / r["compiler"]["time_s"])))[:6]
    return {
        "n_configs": len(rows),
        "n_both_accept": len(both),
        "tier": _tier(both),
        "tier_within_kernel_spearman": _mean([v["tier"]["spearman"] for v in per_kernel.values()]),
        "on_core": _on_core(core),
        "on_core_within_kernel_spearman": _mean([v["on_core"]["spearman"] for v in per_kernel.values()]),
        "bound_agree": bound_agree,
        "hbm_floor_wins": len(floor_wins),
        "vmem_agree": len(vm) - len(vmem_dis),
        "vmem_compared": len(vm),
        "vmem_disagreements": [_brief(r) for r in vmem_dis],
        "legal_agree": len(lg) - len(legal_dis),
        "legal_compared": len(lg),
        "legal_disagreements": [_brief(r) for r in legal_dis],
        "compiler_over_model_vmem": {
            "n": len(vmem_ratio),
            "median": float(np.median(vmem_ratio)) if len(vmem_ratio) else math.nan,
            "min": float(vmem_ratio.min()) if len(vmem_ratio) else math.nan,
            "max": float(vmem_ratio.max()) if len(vmem_ratio) else math.nan,
            "within_10pct": float(np.mean(np.abs(vmem_ratio - 1) <= 0.1)) if len(vmem_ratio) else math.nan,
        },
        "per_kernel": per_kernel,
        "worst": [_brief(r) for r in worst],
    }


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    m, c = r["model"], r["compiler"]
    return {
        "config": r["label"],
        "model_ms": m["time_s"] * 1e3,
        "model_bound": m["bound"],
        "model_on_core_ms": m["on_core_s"] * 1e3,
        "compiler_ms": None if c.get("time_s") is None else c["time_s"] * 1e3,
        "static_ms": None if c.get("static_s") is None else c["static_s"] * 1e3,
        "ratio": None if not c.get("time_s") else m["time_s"] / c["time_s"],
        "model_vmem_mib": m["vmem_bytes"] / 2**20,
        "model_fits": m["fits_vmem"],
        "compiler": c["status"] if c["status"] != "error" else f"error:{c.get('error_kind')}",
        "compiler_vmem_mib": None if not c.get("vmem_bytes") else c["vmem_bytes"] / 2**20,
    }


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def markdown(target: str, rows: list[dict[str, Any]], summ: dict[str, Any]) -> str:
    n, t, oc, vr = summ["n_both_accept"], summ["tier"], summ["on_core"], summ["compiler_over_model_vmem"]
    lines = [
        f"### {target}: {summ['n_configs']} configurations, {n} accepted by both",
        "",
        f"| figure | model vs compiler tier, max(static, HBM floor) (n={t['n']}) "
        f"| model on-core vs static schedule, configs not memory-bound (n={oc['n']}) |",
        "| --- | --- | --- |",
        f"| Spearman, pooled | {_fmt(t['spearman'])} | {_fmt(oc['spearman'])} |",
        f"| Spearman, mean within kernel | {_fmt(summ['tier_within_kernel_spearman'])} "
        f"| {_fmt(summ['on_core_within_kernel_spearman'])} |",
        f"| median ratio model/compiler | {_fmt(t['median_ratio'], '.2f')} | {_fmt(oc['median_ratio'], '.2f')} |",
        f"| IQR of the ratio | {_fmt_iqr(t['iqr_ratio'])} | {_fmt_iqr(oc['iqr_ratio'])} |",
        "",
        f"VMEM verdicts agree {summ['vmem_agree']}/{summ['vmem_compared']}; legality verdicts agree "
        f"{summ['legal_agree']}/{summ['legal_compared']}; memory-bound verdicts agree {summ['bound_agree']}/{n} "
        f"(the HBM floor set the tier's time in {summ['hbm_floor_wins']}/{n}). Compiler/model VMEM bytes over "
        f"{vr['n']} compiles: median {_fmt(vr['median'], '.2f')}, range {_fmt(vr['min'], '.2f')}-"
        f"{_fmt(vr['max'], '.2f')}, within 10%: {_fmt(100 * vr['within_10pct'], '.0f')}%.",
    ]
    for key in ("vmem_disagreements", "legal_disagreements"):
        for d in summ[key]:
            lines.append(
                f"- {key.split('_')[0]} disagreement: {d['config']}: model {d['model_vmem_mib']:.2f} MiB "
                f"({'fits' if d['model_fits'] else 'does not fit'}), compiler {d['compiler']}"
                + (f" ({d['compiler_vmem_mib']:.2f} MiB)" if d["compiler_vmem_mib"] else "")
            )
    lines += [
        "",
        "| kernel | n | Spearman (tier) | median ratio (tier) | n not memory-bound | Spearman (on-core) "
        "| median ratio (on-core) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for k, v in summ["per_kernel"].items():
        a, b = v["tier"], v["on_core"]
        lines.append(
            f"| {Path(k).stem} | {a['n']} | {_fmt(a['spearman'])} | {_fmt(a['median_ratio'], '.2f')} | {b['n']} "
            f"| {_fmt(b['spearman'])} | {_fmt(b['median_ratio'], '.2f')} |"
        )
    lines += [
        "",
        "| config | model ms | bound | model on-core ms | compiler ms | static ms | ratio | model VMEM MiB | fits "
        "| compiler | compiler VMEM MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["model"] is None:
            lines.append(f"| {r['label']} | not built: {r['error']} |")
            continue
        b = _brief(r)
        lines.append(
            f"| {b['config']} | {_fmt(b['model_ms'], '.4f')} | {b['model_bound']} | {_fmt(b['model_on_core_ms'], '.4f')} "
            f"| {_fmt(b['compiler_ms'], '.4f')} "
            f"| {_fmt(b['static_ms'], '.4f')} | {_fmt(b['ratio'], '.2f')} | {b['model_vmem_mib']:.2f} "
            f"| {'yes' if b['model_fits'] else 'no'} | {b['compiler']} | {_fmt(b['compiler_vmem_mib'], '.2f')} |"
        )
    return "\n".join(lines)


def _fmt_iqr(iqr: list[float]) -> str:
    return f"{iqr[0]:.2f}-{iqr[1]:.2f}" if iqr else "-"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("jax", "jaxlib", "libtpu"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return "?"

    # The model's figures depend on the working tree, not only on HEAD: say whether src/ had changes.
    out["git"] = git("rev-parse", "--short", "HEAD") + (
        " (src/ modified)" if git("status", "--porcelain", "src") else ""
    )
    return out


def run(targets: Sequence[str], quick: bool, out_dir: Path, workers: int = 2, timeout_s: float = 120) -> int:
    from pallasopt.cost_model.compiler import libtpu_available
    from pallasopt.cost_model.hardware import get_chip

    if not libtpu_available():
        print(
            "libtpu is not installed (pip install 'pallasopt[tpu]'): the compiler tier is unavailable", file=sys.stderr
        )
        return 2
    t_start = time.perf_counter()
    versions = _versions()  # before tracing: the model columns are computed from this tree
    variants = build_variants(QUICK if quick else SWEEP)
    t_built = time.perf_counter()
    chips = [get_chip(t) for t in targets]
    rows: dict[str, list[dict[str, Any]]] = {ch.name: [] for ch in chips}
    pending: list[tuple[dict[str, Any], Any, Any]] = []
    for ch in chips:
        for cfg, ir, err in variants:
            row: dict[str, Any] = {
                "kernel": cfg.kernel,
                "label": cfg.label,
                "sizes": dict(cfg.sizes),
                "error": err,
                "model": None,
                "compiler": {"status": "not built", "error_kind": None},
            }
            rows[ch.name].append(row)
            if ir is not None:
                row["model"] = model_record(ir, ch)
                pending.append((row, ir, ch))
    # Slow compiles (big attention bodies) first, so the two workers finish together.
    pending.sort(key=lambda job: job[0]["kernel"] not in SLOW_FIRST)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        jobs = [(row, pool.submit(compiler_record, ir, ch, timeout_s)) for row, ir, ch in pending]
        for i, (row, fut) in enumerate(jobs, 1):
            row["compiler"] = fut.result()
            print(
                f"[{i}/{len(jobs)}] {row['model']['chip']} {row['label']}: "
                f"model {row['model']['time_s'] * 1e3:.4f} ms, compiler {row['compiler']['status']} "
                f"({row['compiler']['wall_s']:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
    wall = time.perf_counter() - t_start
    out_dir.mkdir(parents=True, exist_ok=True)
    date = dt.date.today().isoformat()
    command = "python bench/fidelity.py " + " ".join(sys.argv[1:])
    for ch in chips:
        summ = summarize(rows[ch.name])
        doc = {
            "target": ch.name,
            "date": date,
            "command": command.strip(),
            "quick": quick,
            "wall_s": wall,
            "build_s": t_built - t_start,
            "versions": versions,
            "summary": summ,
            "rows": rows[ch.name],
        }
        path = out_dir / f"fidelity-{ch.name}-{date}.json"
        path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
        print(markdown(ch.name, rows[ch.name], summ))
        print(f"\nwrote {path}\n")
    print(f"wall time {wall:.0f} s (building variants {t_built - t_start:.0f} s)")
    return 0


def rescore(paths: Sequence[Path]) -> int:
    """Re-score stored results with the current model (no compiles): for checking a change to the model."""
    docs = [json.loads(Path(p).read_text()) for p in paths]
    variants = {cfg.label: ir for cfg, ir, _ in build_variants(SWEEP) if ir is not None}
    from pallasopt.cost_model.hardware import get_chip

    for doc in docs:
        chip = get_chip(doc["target"])
        rows = []
        for r in doc["rows"]:
            ir = variants.get(r["label"])
            if ir is None or r["model"] is None:
                rows.append(r)
                continue
            m = model_record(ir, chip)
            c = dict(r["compiler"])
            if c["status"] == "ok" and c.get("static_s") is not None:  # the tier's HBM floor follows the model
                c["time_s"] = max(c["static_s"], m["dma_s"] + m["edge_s"])
            rows.append({**r, "model": m, "compiler": c})
        print(f"re-scored {doc['target']} results of {doc['date']} ({doc['command']}) with the current model\n")
        print(markdown(doc["target"], rows, summarize(rows)) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--targets", default="v5e,v6e", help="comma-separated TPU targets (default v5e,v6e)")
    p.add_argument("--quick", action="store_true", help="a few configurations per example kernel")
    p.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder for the JSON results")
    p.add_argument("--workers", type=int, default=2, help="compiles at once (default 2)")
    p.add_argument("--timeout", type=float, default=120, help="seconds per compile (default 120)")
    p.add_argument("--rescore", nargs="+", metavar="JSON", help="re-score stored results with the current model")
    a = p.parse_args(argv)
    if a.rescore:
        return rescore([Path(x) for x in a.rescore])
    targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    return run(targets, a.quick, Path(a.out), a.workers, a.timeout)


if __name__ == "__main__":
    sys.exit(main())
