"""`pallasopt bench`: optimize every kernel of a suite (bench/kernels) and summarize what the optimizer achieved.

Per kernel: `optimize(...)` (no output file; one kernel database per suite, so an interrupted bench resumes), plus
the compiler's estimate of the module's XLA `reference` and, where the module defines one, of its `hand_tuned`
kernel. Writes `<out>/<target>-<date>[-quick].json`, a Markdown table (`.md`) and a bar plot (`.png`) after every
kernel. Each time carries its tier: "model" (roofline), "compiler" (libtpu's static schedule with an HBM floor, no
TPU) or "hardware" (measured on the target chip). Ratios are only formed between times of the same tier.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import hashlib
import json
import math
import os
import platform
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from .cost_model.hardware import Chip
from .errors import ExitCode, UsageError
from .ir.kernel_ir import KernelIR

# --quick: one kernel of each kind (GEMM, attention, norm, softmax, conv, data movement); three have `hand_tuned`
# or a looped reference, so every column of the table is exercised.
QUICK_KERNELS = (
    "llm_large_gemm",
    "llm_flash_attention",
    "llm_rmsnorm",
    "fused_23_softmax_vocab",
    "fused_20_depthwise3x3_bias",
    "fused_31_transpose_scale",
)
QUICK_SEARCH = (2, 1)  # beam, depth
SUITE_SEARCH = (4, 2)
FAST_P = (1.0, 1.5, 2.0)
ESTIMATE_VERSION = 1  # bump when the estimate method changes: it keys the estimate cache
TIER_TAG = {"model": "M", "compiler": "C", "hardware": "H"}

Progress = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class Estimate:
    """The compiler's time for one function of a kernel module other than its entry (`reference`, `hand_tuned`)."""

    fn: str
    time_s: float | None
    tier: str = "compiler"
    method: str = ""  # dims compiled at, scaling, loop trip counts, which bound won
    error: str | None = None
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Estimate:
        return Estimate(**{k: d[k] for k in Estimate.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class Row:
    """One kernel's bench result. `error` set: the search crashed (the other fields are defaults)."""

    kernel: str
    path: str
    correct: bool = False
    tier: str = ""
    baseline_s: float | None = None
    best_s: float | None = None
    speedup: float = 1.0
    recipe: tuple[str, ...] = ()
    wall_s: float = 0.0
    candidates: int = 0
    stop_reason: str = ""
    from_cache: bool = False
    model_baseline_s: float | None = None
    model_best_s: float | None = None
    xla: Estimate | None = None
    hand_tuned: Estimate | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.correct

    def _ratio(self, est: Estimate | None) -> float | None:
        if est is None or est.time_s is None or not self.best_s or est.tier != self.tier or self.error:
            return None
        return est.time_s / self.best_s

    @property
    def vs_xla(self) -> float | None:
        """XLA reference time / best time (same tier only)."""
        return self._ratio(self.xla)

    @property
    def frac_hand_tuned(self) -> float | None:
        """Hand-tuned time / best time: above 1 the optimized kernel beats the hand-tuned one."""
        return self._ratio(self.hand_tuned)

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("xla", "hand_tuned", "recipe")}
        return d | {
            "recipe": list(self.recipe),
            "xla": self.xla.to_dict() if self.xla else None,
            "hand_tuned": self.hand_tuned.to_dict() if self.hand_tuned else None,
            "vs_xla": self.vs_xla,
            "frac_hand_tuned": self.frac_hand_tuned,
        }


# ------------------------------------------------------------------------------------------------------ summary


def geomean(values: Iterable[float]) -> float | None:
    xs = list(values)
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def effective_speedup(row: Row) -> float:
    """What the user gets: the speedup of a verified kernel; 1.0 (the baseline is kept) otherwise."""
    return row.speedup if row.ok else 1.0


def fast_p(rows: Sequence[Row], p: float) -> float:
    """Share of all kernels that are correct and faster than `p` x (KernelBench's fast_p)."""
    return sum(1 for r in rows if r.ok and r.speedup > p) / len(rows) if rows else 0.0


def summarize(rows: Sequence[Row]) -> dict[str, Any]:
    eff = [effective_speedup(r) for r in rows]
    vs_xla = [v for r in rows if (v := r.vs_xla) is not None]
    frac_ht = [v for r in rows if (v := r.frac_hand_tuned) is not None]
    done = [r for r in rows if r.error is None]
    tiers = Counter(r.tier for r in done)
    one_tier = len(tiers) == 1 and all(r.baseline_s and r.best_s for r in done)
    return {
        "kernels": len(rows),
        "correct": sum(r.ok for r in rows),
        "errors": sum(r.error is not None for r in rows),
        "geomean_speedup": geomean(eff),
        "geomean_speedup_clipped": geomean(max(1.0, s) for s in eff),
        "fast_p": {f"{p:g}": fast_p(rows, p) for p in FAST_P},
        "vs_xla_geomean": geomean(vs_xla),
        "vs_xla_kernels": len(vs_xla),
        "beats_xla": sum(v > 1.0 for v in vs_xla),
        "frac_hand_tuned_geomean": geomean(frac_ht),
        "hand_tuned_kernels": len(frac_ht),
        "tiers": dict(tiers),
        "search_wall_s": sum(r.wall_s for r in rows),
        "estimate_wall_s": sum(e.wall_s for r in rows for e in (r.xla, r.hand_tuned) if e),
        "candidates": sum(r.candidates for r in rows),
        "baseline_total_s": sum(r.baseline_s or 0.0 for r in done) if one_tier else None,
        "best_total_s": sum(r.best_s or 0.0 for r in done) if one_tier else None,
    }


# ---------------------------------------------------------------------------------------------------- estimates


class Estimator(Protocol):
    def __call__(self, ir: KernelIR, fn: str) -> Estimate: ...


def loop_trips(jaxpr: Any) -> tuple[int, bool]:
    """(trip-count product of the heaviest nest of `scan`s, whether a `while` of unknown count was seen).

    libtpu's static profile and XLA's cost analysis count a loop body once, whatever its trip count.
    """
    best, unknown = 1, False
    for eqn in jaxpr.eqns:
        inner = 1
        for value in eqn.params.values():
            for item in value if isinstance(value, tuple | list) else (value,):
                sub = item if hasattr(item, "eqns") else getattr(item, "jaxpr", None)
                if sub is not None and hasattr(sub, "eqns") and eqn.primitive.name != "pallas_call":
                    n, u = loop_trips(sub)
                    inner, unknown = max(inner, n), unknown or u
        if eqn.primitive.name == "scan":
            inner *= int(eqn.params["length"])
        unknown = unknown or eqn.primitive.name == "while"
        best = max(best, inner)
    return best, unknown


def _work(rep: Any) -> tuple[float, float]:
    cost = dict(rep.cost_analysis) if rep is not None and rep.ok else {}
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    import jax
    import jaxlib

    from . import __version__

    try:
        libtpu = md.version("libtpu")
    except md.PackageNotFoundError:
        libtpu = "absent"
    return {"pallasopt": __version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__, "libtpu": libtpu}


class CompilerEstimator:
    """Deviceless-compiler estimates of `reference` (pure XLA) and `hand_tuned`, cached in a JSON file.

    Reference: compiled at the default dims when XLA's cost analysis predicts <= `direct_limit_s` of work (libtpu's
    profile of a bigger XLA op takes minutes), else at smaller dims from the kernel's `reduce_dims_for_compile`
    (about that much work) scaled by the reference's FLOP ratio default/reduced. Time = max(static estimate, XLA's
    bytes accessed / HBM bandwidth), both times the trip count of a `scan` in the reference (the profile counts a
    loop body once). Hand-tuned: the kernel's own compiler tier, run on `hand_tuned` as the entry.
    """

    def __init__(
        self, chip: Chip, cache_path: Path | None, *, timeout_s: float = 240.0, direct_limit_s: float = 1e-3
    ) -> None:
        self.chip = chip
        self.cache_path = cache_path
        self.timeout_s = timeout_s
        self.direct_limit_s = direct_limit_s
        self.cache: dict[str, Any] = {}
        if cache_path is not None and cache_path.exists():
            try:
                self.cache = json.loads(cache_path.read_text())
            except (OSError, json.JSONDecodeError):
                self.cache = {}
        self.versions = _versions()

    def __call__(self, ir: KernelIR, fn: str) -> Estimate:
        key_src = [ESTIMATE_VERSION, ir.digest, fn, dict(ir.dims), self.chip.name, self.versions, self.direct_limit_s]
        key = hashlib.sha256(json.dumps(key_src, sort_keys=True).encode()).hexdigest()[:24]
        if key in self.cache:
            return Estimate.from_dict(self.cache[key])
        t0 = time.perf_counter()
        try:
            est = self._hand_tuned(ir) if fn == "hand_tuned" else None
            est = est or self._generic(ir, fn)
        except Exception as e:  # an estimate is a side figure: its failure is data, never the end of the bench
            est = Estimate(fn, None, error=f"{type(e).__name__}: {e}"[:300])
        est = replace(est, wall_s=time.perf_counter() - t0)
        if est.error is None and self.cache_path is not None:
            from .optimize import write_atomic

            self.cache[key] = est.to_dict()
            write_atomic(self.cache_path, json.dumps(self.cache, indent=1))
            self.cache_path.chmod(0o644)
        return est

    def _hand_tuned(self, ir: KernelIR) -> Estimate | None:
        """The compiler tier of `hand_tuned` as if it were the entry; None when its pallas_calls cannot be read."""
        from .ir.trace import trace_calls
        from .search.tiers import Tiers

        assert ir.workload is not None
        w = replace(ir.workload, spec=replace(ir.workload.spec, entry="hand_tuned"))
        try:
            calls = trace_calls(w)
        except Exception:
            return None  # e.g. a dynamic grid: fall back to the generic path
        r = Tiers(self.chip, compile_timeout_s=self.timeout_s).compiler(
            replace(ir, calls=calls, entry="hand_tuned", workload=w)
        )
        if r is None:
            return Estimate("hand_tuned", None, error="compiler tier unavailable (libtpu missing?)")
        how = f"compiled at {r.data.get('dims')} x {r.data.get('steps_scale', 1.0):g} grid-step ratio"
        if not r.ok or r.time_s is None:
            return Estimate("hand_tuned", None, method=how, error=r.message[:300] or "no static estimate")
        return Estimate("hand_tuned", r.time_s, method=f"{how}; {r.message}")

    def _generic(self, ir: KernelIR, fn: str) -> Estimate:
        import jax

        from .cost_model.compiler import compile_module
        from .ir.trace import arg_structs
        from .search.tiers import reduce_dims_for_compile

        assert ir.workload is not None
        chip, dims = self.chip, dict(ir.dims)
        trips, unknown = loop_trips(jax.make_jaxpr(getattr(ir.workload.module, fn))(*arg_structs(ir.workload)).jaxpr)
        notes = [f"scan body x {trips} trips (assumes the body dominates)"] if trips > 1 else []
        notes += ["a while loop of unknown trip count is counted once"] if unknown else []

        def compile_at(name: str, d: Mapping[str, int], profile: bool) -> Any:
            return compile_module(
                ir.source, ir.path, name, d, chip.name, timeout_s=self.timeout_s, dump_profile=profile
            )

        probe = compile_at("reference", dims, False)  # XLA's cost analysis of the same work at the default dims
        flops, nbytes = _work(probe)
        bw = chip.device_hbm_bw_bytes_s
        predicted = max(flops / chip.device_peak_bf16_flops, nbytes / bw) if probe.ok else math.inf
        floor_note = "HBM floor from XLA's bytes accessed" if fn == "reference" else "no HBM floor (Pallas call)"
        if predicted <= self.direct_limit_s:
            rep = compile_at(fn, dims, True)
            if rep.ok and rep.estimated_s is not None:
                static = rep.estimated_s * trips
                floor = nbytes * trips / bw if fn == "reference" else 0.0
                bound = "static schedule" if static >= floor else floor_note
                return Estimate(fn, max(static, floor), method="; ".join(["at the default dims", bound, *notes]))
            notes.append(f"default dims failed ({rep.error_kind or rep.note})")
        # Smaller dims with the kernel's blocks: about `direct_limit_s` of XLA work for the reference (a big op
        # is estimated more faithfully than a tiny one scaled up), the compiler tier's 256 grid steps otherwise.
        steps = sum(c.steps for c in ir.calls)
        wanted = steps * self.direct_limit_s / predicted if fn == "reference" and math.isfinite(predicted) else 0
        rdims, kscale = reduce_dims_for_compile(ir, max_steps=max(256, int(wanted)))
        rep = compile_at(fn, rdims, True)
        if not rep.ok or rep.estimated_s is None:
            why = f"{rep.error_kind}: {rep.error}" if not rep.ok else (rep.note or "no static estimate")
            return Estimate(fn, None, method=f"at reduced dims {rdims}", error=why[:300])
        rflops, rbytes = _work(rep if fn == "reference" else compile_at("reference", rdims, False))
        if flops and rflops:
            scale, how = flops / rflops, "the reference's FLOP ratio"
        elif nbytes and rbytes:
            scale, how = nbytes / rbytes, "the reference's byte ratio"
        else:
            scale, how = kscale, "the kernel's grid-step ratio"
        static = rep.estimated_s * scale * trips
        floor = (nbytes or rbytes * scale) * trips / bw if fn == "reference" else 0.0
        bound = "static schedule" if static >= floor else floor_note
        method = f"at reduced dims {rdims} x {scale:.4g} ({how})" if rdims != dims else "at the default dims"
        method += f"; {bound}"
        return Estimate(fn, max(static, floor), method="; ".join([method, *notes]))


# ------------------------------------------------------------------------------------------------------- runner


def find_kernels(suite: Path, patterns: Sequence[str] = (), quick: bool = False) -> list[Path]:
    """Kernel modules of `suite` (sorted), filtered by glob `patterns` on the file name or stem."""
    files = sorted(p for p in suite.glob("*.py") if not p.name.endswith(".opt.py") and not p.name.startswith("_"))
    if quick:
        files = [p for p in files if p.stem in QUICK_KERNELS]
    if patterns:
        files = [p for p in files if any(fnmatch.fnmatch(p.name, g) or fnmatch.fnmatch(p.stem, g) for g in patterns)]
    return files


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 400 else text[:397] + "..."


def bench_kernel(
    path: Path, *, estimator: Estimator | None = None, progress: Progress | None = None, **opts: Any
) -> Row:
    """Optimize one kernel (write_output=False) and estimate its XLA reference and hand-tuned kernel.

    `opts` go to `optimize()` (target, beam, depth, db_path, jobs, budget_seconds, use_compiler, fresh, evaluator).
    A search that raises becomes a row with `error`; the estimates are still attempted.
    """
    from .optimize import optimize

    say = progress or (lambda e, i: None)
    t0 = time.perf_counter()
    try:
        res = optimize(str(path), write_output=False, progress=progress, **opts)
        row = Row(
            kernel=path.stem,
            path=str(path),
            correct=res.correct,
            tier=res.best.tier,
            baseline_s=res.baseline.time_s,
            best_s=res.best.time_s,
            speedup=res.speedup,
            recipe=tuple(res.recipe),
            wall_s=res.wall_s,
            candidates=res.candidates_evaluated,
            stop_reason=res.stop_reason,
            from_cache=res.from_cache,
            model_baseline_s=res.model_baseline_s,
            model_best_s=res.model_best_s,
        )
    except KeyboardInterrupt:
        raise
    except Exception as e:
        row = Row(kernel=path.stem, path=str(path), wall_s=time.perf_counter() - t0, error=_one_line(e))
    if estimator is None:
        return row
    try:
        ir = KernelIR.from_file(path)
    except Exception:
        return row  # the search already recorded why the module cannot be used
    say("estimate", {"fn": "reference"})
    xla = estimator(ir, "reference")
    hand = None
    if ir.workload is not None and ir.workload.spec.has_hand_tuned:
        say("estimate", {"fn": "hand_tuned"})
        hand = estimator(ir, "hand_tuned")
    return replace(row, xla=xla, hand_tuned=hand)


# ------------------------------------------------------------------------------------------------------ outputs


def _t(t: float | None, tier: str = "") -> str:
    if t is None:
        return "-"
    text = f"{t * 1e3:.3f} ms" if t >= 1e-4 else f"{t * 1e6:.1f} us"
    return f"{text} [{TIER_TAG.get(tier, tier)}]" if tier else text


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def summary_lines(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    fp = ", ".join(f"fast_{p} {_pct(v)}" for p, v in s["fast_p"].items())
    return [
        ("correct (final oracle verdict)", f"{s['correct']}/{s['kernels']}"),
        ("geomean speedup over the naive kernel (unclipped)", _x(s["geomean_speedup"])),
        ("geomean speedup, each clipped at >= 1x (MaxKernel)", _x(s["geomean_speedup_clipped"])),
        ("fast_p (correct and faster than p x)", fp),
        (
            f"geomean vs XLA reference ({s['vs_xla_kernels']} kernels)",
            f"{_x(s['vs_xla_geomean'])}; faster than XLA on {s['beats_xla']}/{s['vs_xla_kernels']}",
        ),
        (f"geomean hand-tuned time / best time ({s['hand_tuned_kernels']} kernels)", _x(s["frac_hand_tuned_geomean"])),
        ("search crashes", str(s["errors"])),
        ("tiers of the speedups", ", ".join(f"{k or '-'}: {v}" for k, v in s["tiers"].items()) or "-"),
        ("search wall / estimate wall", f"{s['search_wall_s']:.0f} s / {s['estimate_wall_s']:.0f} s"),
        ("candidates evaluated", str(s["candidates"])),
        ("suite time baseline -> best", f"{_t(s['baseline_total_s'])} -> {_t(s['best_total_s'])}"),
    ]


def render_markdown(rows: Sequence[Row], summary: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    chip = meta["target"]
    lines = [
        f"# pallasopt bench: {chip}, {meta['date']}",
        "",
        f"Command: `{meta['command']}` (beam {meta['beam']}, depth {meta['depth']}, jobs {meta['jobs']}, "
        f"budget {meta['budget_seconds'] or 'none'} s per kernel). Machine: {meta['machine']}. "
        f"Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}. Wall: {meta['wall_s']:.0f} s.",
        "",
        f"Tiers: [C] compiler estimate (libtpu static schedule for {chip}, no TPU; max with the HBM bytes/bandwidth "
        f"floor), [M] roofline model, [H] measured on {chip}. Ratios only between times of the same tier.",
        "",
        "| summary | |",
        "| --- | --- |",
        *(f"| {k} | {v} |" for k, v in summary_lines(summary)),
        "",
        "| kernel | correct | baseline | best | speedup | XLA reference | vs XLA | hand-tuned | HT/best | recipe "
        "| search s | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ht = r.hand_tuned
        notes = [r.error or r.stop_reason]
        notes += [f"{e.fn}: {e.error}" for e in (r.xla, ht) if e is not None and e.error]
        verdict = "ERROR" if r.error else ("yes" if r.correct else "NO")
        cells = [
            f"`{r.kernel}`",
            verdict,
            _t(r.baseline_s, r.tier),
            _t(r.best_s, r.tier),
            _x(r.speedup if not r.error else None),
            _t(r.xla.time_s, r.xla.tier) if r.xla else "-",
            _x(r.vs_xla),
            _t(ht.time_s, ht.tier) if ht else "n/a",
            _x(r.frac_hand_tuned),
            f"`{','.join(r.recipe)}`" if r.recipe else "-",
            f"{r.wall_s:.0f}",
            "; ".join(n for n in notes if n)[:200],
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    lines += ["", "How each XLA / hand-tuned estimate was made:", ""]
    for r in rows:
        for e in (r.xla, r.hand_tuned):
            if e is not None and e.method:
                lines.append(f"- `{r.kernel}` {e.fn}: {e.method}")
    return "\n".join(lines) + "\n"


def plot_speedups(path: Path, rows: Sequence[Row], meta: Mapping[str, Any]) -> None:
    """Horizontal bars per kernel, log scale: speedup over the naive kernel and best vs the XLA reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ys = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.3 * len(rows)))
    series: list[tuple[list[float | None], float, str]] = [
        ([effective_speedup(r) for r in rows], 0.2, "speedup over the naive kernel (red: not verified / crashed)"),
        ([r.vs_xla for r in rows], -0.2, "XLA reference time / best time"),
    ]
    for (values, dy, label), color in zip(series, ("tab:blue", "tab:orange"), strict=True):
        colors = [color if r.ok or dy < 0 else "tab:red" for r in rows]
        width = [(v or 1.0) - 1.0 for v in values]  # bars grow from 1x: right is faster, left slower
        ax.barh([y + dy for y in ys], width, left=1.0, height=0.4, color=colors, label=label)
        for y, v in zip(ys, values, strict=True):
            if v is not None:
                ax.annotate(
                    f"{v:.2f}",
                    (v, y + dy),
                    xytext=(2 if v >= 1 else -2, 0),
                    textcoords="offset points",
                    ha="left" if v >= 1 else "right",
                    va="center",
                    fontsize=6,
                )
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(ys, [r.kernel for r in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.margins(x=0.15)
    tiers = "/".join(sorted({r.tier for r in rows if r.tier})) or "-"
    ax.set_title(f"pallasopt bench, {meta['target']}, {meta['date']}: {tiers} tier times", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.04 - 0.5 / max(len(rows), 1)), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(
    out: Path, stem: str, rows: Sequence[Row], meta: Mapping[str, Any], *, plot: bool = True
) -> dict[str, Path]:
    from .optimize import write_atomic

    summary = summarize(rows)
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md"}
    doc = {"meta": dict(meta), "summary": summary, "rows": [r.to_dict() for r in rows]}
    write_atomic(paths["json"], json.dumps(doc, indent=1, default=str))
    write_atomic(paths["md"], render_markdown(rows, summary, meta))
    if plot and rows:
        paths["png"] = out / f"{stem}.png"
        plot_speedups(paths["png"], rows, meta)
    for p in paths.values():
        p.chmod(0o644)  # results are for everyone to read (write_atomic's temp file is private)
    return paths


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()}-core {cpu}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


# ---------------------------------------------------------------------------------------------------------- CLI


def _add_bench(sub: Any) -> None:
    p = sub.add_parser("bench", help="optimize every kernel of the benchmark suite and summarize")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{len(QUICK_KERNELS)} representative kernels, beam "
        f"{QUICK_SEARCH[0]}, depth {QUICK_SEARCH[1]} (a few minutes)",
    )
    p.add_argument("--target", default="v5e")
    p.add_argument("--beam", type=int, default=None, help=f"default {SUITE_SEARCH[0]} ({QUICK_SEARCH[0]} with --quick)")
    p.add_argument(
        "--depth", type=int, default=None, help=f"default {SUITE_SEARCH[1]} ({QUICK_SEARCH[1]} with --quick)"
    )
    p.add_argument("--kernels", default="", help="comma-separated globs on kernel file names, e.g. 'llm_*'")
    p.add_argument("--suite", default="bench/kernels", help="folder of kernel modules")
    p.add_argument("--out", default="bench/results", help="folder for the JSON / Markdown / PNG results")
    p.add_argument("--db", default=None, help="kernel database (default OUT/bench.db): a rerun resumes from it")
    p.add_argument("--budget-seconds", type=float, default=None, help="search budget per kernel")
    p.add_argument("--jobs", type=int, default=2, help="evaluations run in parallel per search")
    p.add_argument("--fresh", action="store_true", help="search again even where the database has a finished run")
    p.add_argument("--no-compile", action="store_true", help="model tier only; no XLA / hand-tuned estimates")
    p.set_defaults(handler=cmd_bench)


ADD_BENCH = _add_bench


def _resolve_suite(suite: str) -> Path:
    p = Path(suite)
    if not p.is_dir() and not p.is_absolute():
        alt = Path(__file__).resolve().parents[2] / suite  # the repository's bench/kernels from any cwd
        p = alt if alt.is_dir() else p
    if not p.is_dir():
        raise UsageError(f"no kernel suite folder {suite}", hint="pass --suite DIR")
    return p


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    from .optimize import resolve_target

    chip = resolve_target(args.target)
    beam, depth = QUICK_SEARCH if args.quick else SUITE_SEARCH
    beam, depth = args.beam or beam, depth if args.depth is None else args.depth
    patterns = tuple(g.strip() for g in args.kernels.split(",") if g.strip())
    kernels = find_kernels(_resolve_suite(args.suite), patterns, args.quick)
    if not kernels:
        raise UsageError("no kernel matches", hint=f"check --suite {args.suite} and --kernels {args.kernels!r}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db = Path(args.db) if args.db else out / "bench.db"
    estimator = None if args.no_compile else CompilerEstimator(chip, db.with_name(db.stem + ".estimates.json"))
    date = datetime.date.today().isoformat()
    stem = f"{chip.name}-{date}" + ("-quick" if args.quick else "")
    meta: dict[str, Any] = {
        "command": _command_line(args),
        "target": chip.name,
        "date": date,
        "quick": args.quick,
        "beam": beam,
        "depth": depth,
        "jobs": args.jobs,
        "budget_seconds": args.budget_seconds,
        "kernels": [k.stem for k in kernels],
        "db": str(db),
        "machine": machine(),
        "versions": _versions(),
        "wall_s": 0.0,
    }
    console.print(
        f"[bold]pallasopt bench[/] {len(kernels)} kernels, target {chip.name}, beam {beam}, depth {depth}, db {db}"
    )
    rows, paths = run_suite(
        kernels,
        out,
        stem,
        meta,
        console=console,
        estimator=estimator,
        target=chip.name,
        beam=beam,
        depth=depth,
        db_path=db,
        jobs=args.jobs,
        budget_seconds=args.budget_seconds,
        use_compiler=not args.no_compile,
        fresh=args.fresh,
    )
    for k, v in summary_lines(summarize(rows)):
        console.print(f"  {k}: [bold]{v}[/]")
    console.print("wrote " + ", ".join(str(p) for p in paths.values()))
    return ExitCode.OK


def run_suite(
    kernels: Sequence[Path],
    out: Path,
    stem: str,
    meta: dict[str, Any],
    *,
    console: Console,
    estimator: Estimator | None,
    **opts: Any,
) -> tuple[list[Row], dict[str, Path]]:
    """Bench `kernels` one by one (a line per kernel, a rich status while it runs), rewriting the results after
    each so an interrupted suite leaves what it finished. `opts` go to `optimize()`."""
    rows: list[Row] = []
    paths: dict[str, Path] = {}
    start = time.perf_counter()
    try:
        for i, path in enumerate(kernels, 1):
            head = f"[{i}/{len(kernels)}] {path.stem}"
            with console.status(f"{head}: baseline...") as status:
                row = bench_kernel(path, estimator=estimator, progress=_StatusLine(status, head), **opts)
            rows.append(row)
            console.print(_row_line(i, len(kernels), row))
            meta["wall_s"] = time.perf_counter() - start
            paths = write_results(out, stem, rows, meta, plot=False)
    finally:
        meta["wall_s"] = time.perf_counter() - start
        if rows:
            paths = write_results(out, stem, rows, meta)
    return rows, paths


def _command_line(args: argparse.Namespace) -> str:
    """The command as parsed (canonical option order), for the results' header."""
    words = ["pallasopt bench"] + ["--quick"] * args.quick + [f"--target {args.target}"]
    for name in ("beam", "depth", "budget_seconds"):
        if getattr(args, name) is not None:
            words.append(f"--{name.replace('_', '-')} {getattr(args, name)}")
    words += [f"--kernels '{args.kernels}'"] * bool(args.kernels) + [f"--jobs {args.jobs}"]
    words += [f"--out {args.out}"] + [f"--db {args.db}"] * bool(args.db) + ["--no-compile"] * args.no_compile
    return " ".join(words)


class _StatusLine:
    """Turns the search's progress events into the one-line rich status of the kernel being benched."""

    def __init__(self, status: Any, head: str) -> None:
        self.status, self.head = status, head

    def __call__(self, kind: str, info: dict[str, Any]) -> None:
        what = {
            "baseline": "searching",
            "expanded": f"depth {info.get('depth')}: ranking {info.get('children')} candidates",
            "depth": f"depth {info.get('depth')} done",
            "estimate": f"compiler estimate of {info.get('fn')}",
        }.get(kind)
        if what is not None:
            self.status.update(f"{self.head}: {what}")


def _row_line(i: int, n: int, r: Row) -> str:
    head = f"[{i}/{n}] {r.kernel:<36}"
    if r.error:
        return f"{head} [red]ERROR[/] {r.error[:160]}"
    verdict = "[green]correct[/]" if r.correct else "[red]NOT verified[/]"
    xla = f"vs XLA {_x(r.vs_xla)}" if r.xla else ""
    ht = f"HT/best {_x(r.frac_hand_tuned)}" if r.hand_tuned else ""
    cache = " (from db)" if r.from_cache else ""
    return (
        f"{head} {verdict} {_x(r.speedup):>7} {_t(r.baseline_s, r.tier)} -> {_t(r.best_s, r.tier)}  {xla}  "
        f"{ht}  {r.wall_s:.0f} s{cache}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pallasopt.bench ...`: the bench command on its own (same options as `pallasopt bench`)."""
    parser = argparse.ArgumentParser(prog="pallasopt bench")
    _add_bench(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=140)
    try:
        return int(args.handler(args, console))
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # same one-line user errors as the CLI
        from .errors import PallasoptError

        if isinstance(e, PallasoptError):
            Console(stderr=True).print(f"pallasopt: error: {e}", markup=False)
            return int(e.exit_code)
        raise


if __name__ == "__main__":
    sys.exit(main())
