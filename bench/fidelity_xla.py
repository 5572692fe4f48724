"""The bench's XLA reference estimate against tokamax's measured XLA points (every "vs XLA" claim rests on it).

    python bench/fidelity_xla.py [--split validation] [--per-group 14] [--out bench/results]

What the tokamax 0.0.12 files are (tokamax's cache file is the snake case of the op's class name,
`tokamax/_src/autotuning/cache.py: _load_cache`): `ragged_dot.json` is `ops/ragged_dot/base.RaggedDot`, the
`IMPLEMENTATIONS["xla"]` entry of `ragged_dot/api.py` (`jax.lax.ragged_dot_general`, f32 accumulation, cast back), NOT
tokamax's default implementation (the default puts "mosaic" first when the Pallas TPU kernel imports);
`dot_product_attention.json` is `attention/base.DotProductAttention`, the "xla" implementation (einsum, softmax,
einsum); `xla_chunked_dot_product_attention.json` is `attention/xla_chunked.XlaChunkedDotProductAttention` (chunk 128).
tpu7x/ragged_dot.json is not valid JSON in this release (group sizes written unquoted) and is skipped with a note.

For each sampled point (the first `--per-group` reproducible points per device and op of the chosen split, in the
file's order) it writes a kernel module whose `reference` calls tokamax's own XLA op at the point's shapes, dtypes
and (ragged dot) recorded group sizes, and whose entry is the matching Pallas kernel (the kernel whose "vs XLA" the
bench would report: its blocks steer the estimator's reduced dims). Then:
- v5e: the estimate is `CompilerEstimator(chip, None)(ir, "reference")`, exactly what `pallasopt bench` calls
  (bench/runner.py): the deviceless libtpu compile, static LLO profile, XLA's bytes-accessed HBM floor.
- tpu7x: the bench calls the same estimator, and libtpu 0.0.42.1 gives no static profile for tpu7x, so it returns
  no estimate (an error): `estimate_ms` is None and `estimate_error` says why (run on the first `--estimator-tpu7x`
  points only, it costs ~3 compiles each).
- Both chips, a labelled side figure: `xla_floor_ms` = max(XLA cost-analysis FLOPs / peak, bytes accessed / HBM
  bandwidth) from one compile without the profile (`--no-floor` skips it). It is NOT what the bench reports.
Writes `<out>/fidelity-xla-<date>.json`: per point estimate / measured, per op family and chip median and p90
|error|, median ratio, Spearman (`fidelity_data.summary`). Measured = tokamax's XProf device time (median of 5).
Needs the `fidelity` extra (tokamax) and libtpu; no TPU.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "src"))

from fidelity_data import Point, load_points, summary, write_results  # noqa: E402
from fidelity_modules import Unsupported, flash_attention_module, parse_array, ragged_dot_module  # noqa: E402

CHIPS = {"tpu7x": "tpu7x", "tpu_v5_lite": "v5e"}
# op file -> (family, tokamax class of the measured XLA implementation)
XLA_OPS = {
    "ragged_dot": ("xla_ragged_dot", "tokamax._src.ops.ragged_dot.base.RaggedDot"),
    "dot_product_attention": ("xla_attention", "tokamax._src.ops.attention.base.DotProductAttention"),
    "xla_chunked_dot_product_attention": (
        "xla_chunked_attention",
        "tokamax._src.ops.attention.xla_chunked.XlaChunkedDotProductAttention",
    ),
}
# the Pallas twin whose recorded config (same problem key) the entry takes
KERNEL_OP = {
    "ragged_dot": "pallas_mosaic_tpu_ragged_dot",
    "dot_product_attention": "pallas_mosaic_tpu_flash_attention",
    "xla_chunked_dot_product_attention": "pallas_mosaic_tpu_flash_attention",
}

_RAGGED_REF = "def reference(lhs, rhs, group_sizes):\n    return jax.lax.ragged_dot(lhs, rhs, group_sizes)\n"
_RAGGED_XLA = """def reference(lhs, rhs, group_sizes):
    # tokamax's "xla" implementation, the op its ragged_dot.json measured
    from tokamax._src.ops.ragged_dot import base as xla_rd

    out, _ = xla_rd.RaggedDot()._fwd(
        lhs, rhs, group_sizes=group_sizes, ragged_dot_dimension_numbers=xla_rd.DEFAULT_RAGGED_DOT_DIM_NUMS,
        precision=(jax.lax.Precision.DEFAULT, jax.lax.Precision.DEFAULT), preferred_element_type=None,
        return_residuals=False, config=None,
    )
    return out
"""


def _splash_config(problem: dict[str, Any]) -> dict[str, Any]:
    """512-blocks (or the whole sequence) when no splash point of the same problem was recorded."""
    t, s = parse_array(problem["q"])[1][1], parse_array(problem["k"])[1][1]
    return {"block_q": min(512, t), "block_kv": min(512, s), "block_kv_compute": min(512, s)}


def xla_module(point: Point, kernel_configs: dict[str, str]) -> str:
    """Module source: `reference` = tokamax's measured XLA op at the point's problem; entry = the Pallas kernel."""
    if point.op == "ragged_dot":
        config = json.loads(kernel_configs.get(point.key) or "{}")
        src = ragged_dot_module(point.problem, config, point.device)
        if _RAGGED_REF not in src:
            raise Unsupported("fidelity_modules.ragged_dot_module changed its reference; update fidelity_xla.py")
        return src.replace(_RAGGED_REF, _RAGGED_XLA)
    if point.op in ("dot_product_attention", "xla_chunked_dot_product_attention"):
        config = json.loads(kernel_configs.get(point.key) or "{}") or _splash_config(point.problem)
        src = flash_attention_module(point.problem, config)  # the splash kernel is the entry
        head, sep, rest = src.partition("def reference(q, k, v):\n")
        if not sep:
            raise Unsupported("fidelity_modules.flash_attention_module changed its reference")
        _, _, tail = rest.partition("\n\n\n")
        call = src.split("def attention(q, k, v):\n", 1)[1].split("\n\n\n", 1)[0]
        cls = XLA_OPS[point.op][1].rsplit(".", 1)[1]
        mod = "base" if cls == "DotProductAttention" else "xla_chunked"
        body = call.replace("fa.PallasMosaicTpuFlashAttention()", f"_xla.{cls}()").replace(
            "config=CONFIG", "config=_op.NullConfig()"
        )
        imp = (
            f"    from tokamax._src.ops import op as _op\n    from tokamax._src.ops.attention import {mod} as _xla\n\n"
        )
        return f"{head}{sep}    # tokamax's XLA implementation, the op its {point.op}.json measured\n{imp}{body}\n\n\n{tail}"
    raise Unsupported(f"no XLA reproduction for {point.op}")


def sample(points: list[Point], split: str, per_group: int) -> tuple[list[tuple[Point, str]], dict[str, int]]:
    """(point, module source) for the first `per_group` reproducible points per (device, op); skipped counts."""
    kernel_configs = {p.key: p.config for p in points if p.op in KERNEL_OP.values()}
    groups: dict[tuple[str, str], list[Point]] = defaultdict(list)
    for p in points:
        if p.device in CHIPS and p.op in XLA_OPS and (split == "all" or p.split == split):
            groups[(p.device, p.op)].append(p)
    out: list[tuple[Point, str]] = []
    skipped: dict[str, int] = {}
    for (device, op), ps in sorted(groups.items()):
        taken = 0
        for p in ps:
            if taken >= per_group:
                break
            try:
                out.append((p, xla_module(p, kernel_configs)))
                taken += 1
            except Unsupported as e:
                skipped[f"{device}/{op}: {e}"] = skipped.get(f"{device}/{op}: {e}", 0) + 1
    return out, skipped


def default_dims(source: str) -> dict[str, int]:
    """`make_inputs`' keyword defaults (the problem's dims), read from the module text."""
    fn = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "make_inputs")
    args = fn.args.args[len(fn.args.args) - len(fn.args.defaults) :]
    return {a.arg: int(ast.literal_eval(d)) for a, d in zip(args, fn.args.defaults, strict=True)}


def floor_ms(source: str, path: str, chip_name: str) -> tuple[float | None, str]:
    """max(XLA FLOPs / peak, bytes accessed / HBM bw) of `reference` at the default dims, one compile, no profile."""
    from pallasopt.cost_model.compiler import compile_module
    from pallasopt.cost_model.hardware import get_chip

    chip = get_chip(chip_name)
    rep = compile_module(source, path, "reference", default_dims(source), chip.name, dump_profile=False, timeout_s=300)
    if not rep.ok:
        return None, f"{rep.error_kind}: {rep.error}"[:300]
    cost = dict(rep.cost_analysis)
    flops, nbytes = cost.get("flops", 0.0), cost.get("bytes accessed", 0.0)
    t = max(flops / chip.device_peak_bf16_flops, nbytes / chip.device_hbm_bw_bytes_s)
    return t * 1e3, f"flops {flops:.4g}, bytes {nbytes:.4g}, compile {rep.compile_s:.1f} s"


def run_point(source: str, path: str, chip_name: str, estimator: bool, floor: bool) -> dict[str, Any]:
    from pallasopt.bench.estimate import CompilerEstimator
    from pallasopt.cost_model.hardware import get_chip
    from pallasopt.ir.kernel_ir import KernelIR

    row: dict[str, Any] = {}
    t0 = time.time()
    if estimator:
        ir = KernelIR.from_source(source, path)
        est = CompilerEstimator(get_chip(chip_name), None, timeout_s=300)(ir, "reference")
        row.update(
            estimate_ms=None if est.time_s is None else est.time_s * 1e3,
            estimate_method=est.method,
            estimate_error=est.error,
            dims=dict(ir.dims),
        )
    if floor:
        row["xla_floor_ms"], row["xla_floor_note"] = floor_ms(source, path, chip_name)
    row["wall_s"] = round(time.time() - t0, 1)
    return row


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[f"{r['family']}/{r['device']}/{r['split']}"].append(r)
    out: dict[str, Any] = {}
    for key, rs in sorted(by.items()):
        est = [r for r in rs if r.get("estimate_ms")]
        flo = [r for r in rs if r.get("xla_floor_ms")]
        out[key] = {
            "points": len(rs),
            "bench_estimate": summary([r["estimate_ms"] for r in est], [r["measured_ms"] for r in est]),
            "bench_estimate_errors": sum(1 for r in rs if "estimate_ms" in r and r["estimate_ms"] is None),
        }
        if flo:
            out[key]["xla_floor_not_bench"] = summary([r["xla_floor_ms"] for r in flo], [r["measured_ms"] for r in flo])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", default="validation", choices=("validation", "train", "all"))
    ap.add_argument("--per-group", type=int, default=14, help="points per (device, op)")
    ap.add_argument("--estimator-tpu7x", type=int, default=1, help="tpu7x points given the bench's estimator too")
    ap.add_argument("--no-floor", dest="floor", action="store_false", help="skip the side figure (one compile)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)
    points, notes = load_points()
    chosen, skipped = sample(points, args.split, args.per_group)
    rows: list[dict[str, Any]] = []
    tpu7x_estimated: dict[str, int] = defaultdict(int)
    for p, source in chosen:
        chip = CHIPS[p.device]
        use_estimator = chip != "tpu7x" or tpu7x_estimated[p.op] < args.estimator_tpu7x
        tpu7x_estimated[p.op] += chip == "tpu7x"
        digest = hashlib.sha256(p.key.encode()).hexdigest()[:10]
        base = {
            "family": XLA_OPS[p.op][0],
            "implementation": XLA_OPS[p.op][1],
            "device": p.device,
            "op": p.op,
            "split": p.split,
            "key": p.key,
            "measured_ms": p.measured_ms,
            "measured": "tokamax XProf device time",
            "tier": "compiler (libtpu deviceless, CompilerEstimator)" if use_estimator else "none",
        }
        try:
            row = run_point(source, f"/tmp/pallasopt_fidelity_xla/{p.op}_{digest}.py", chip, use_estimator, args.floor)
        except Exception as e:  # one bad point never stops the bench
            row = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        rows.append({**base, **row})
        print(
            f"{p.device} {p.op} measured {p.measured_ms:.3f} ms estimate {row.get('estimate_ms')} "
            f"floor {row.get('xla_floor_ms')} {(row.get('estimate_error') or row.get('error') or '')[:150]}",
            flush=True,
        )
    write_results(
        args.out,
        "fidelity-xla",
        argv if argv is not None else sys.argv[1:],
        notes=notes,
        skipped_unreproducible=skipped,
        summary=aggregate(rows),
        points=rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
