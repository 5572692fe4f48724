"""The compiler's estimates of a kernel module's XLA `reference` and `hand_tuned` functions (no TPU needed)."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from ..cost_model.hardware import Chip
from ..ir.kernel_ir import KernelIR
from .rows import Estimate

# Bump when the estimate method changes: it keys the estimate cache (3: the MXU floor; 4: the HBM floor from the
# compiled program's HBM traffic, not XLA's bytes accessed; 5: that floor at the chip's delivered bandwidth,
# `Chip.hbm_efficiency`, which the key also holds; 6: static and floor joined by `Chip.compiler_time`, the floor at
# `Chip.floor_chip`'s bandwidth; the key holds `overlap_p` and `compiler_hbm_efficiency`; 7: the MXU floor at the
# inputs' own dtypes' rate and the static schedule joined with the HBM floor alone: never published, further from the
# chip; 8: the v6 join, never under the FLOPs at the inputs' own rate, f32's default-precision one, `reference_time`).
ESTIMATE_VERSION = 8


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


def reference_floor(chip: Chip, flops: float, nbytes: float, dtypes: tuple[Any, ...] = ()) -> tuple[float, str]:
    """The least time XLA's reference can take on `chip` (seconds) and what bounds it: `nbytes`, its HBM traffic (the
    compiled program's, `hlo_traffic.hbm_traffic_bytes`, at least its inputs and outputs: `io_bytes`), over the HBM
    bandwidth the chip delivers by the compiler tier's fit (`Chip.floor_chip`: as for our kernels' floor), or its
    FLOPs (XLA's cost analysis: 2 per multiply-add, elementwise ones too) at the fastest matmul rate of its inputs'
    dtypes (`Chip.device_peak_flops`: bf16's, the 8-bit rate where an input is 8-bit, and where every input is f32
    the rate at JAX's default precision that our kernels' f32 dots are charged, bf16's / 1.2: XLA converts f32
    operands as a Pallas body does; fused_18_conv3x3_relu's f32 convolution, 59 GFLOP, ran 0.536 ms on a v5e with
    fresh inputs, against 0.293 ms [C] at bf16's rate and 0.352 ms at f32's; bf16's when no dtype is given). libtpu's
    static profile gives XLA's convolution fusions 0 cycles, so their figure is this floor. libtpu's static profile
    of an XLA convolution can come out under both (fused_21_causal_conv1d_silu, v5e: the profile said 0.215 ms, the
    HBM floor, for 137 GFLOP that take >= 0.70 ms at 197 TFLOP/s), so neither the profile nor the HBM floor alone.

    Not XLA's "bytes accessed": it sums every HLO op's operands and results, fused intermediates too, and on a v5e
    (bench/results/hw-v5e-2026-12-05) XLA ran faster than that floor: fused_26_l2_normalize 0.167 ms measured against
    0.287 ms, fused_05 1.057 against 1.250, fused_08 0.223 against 0.248; the bench then reported those kernels
    2.30x / 1.94x / 1.36x faster than XLA, the chip 0.95x / 1.38x / 0.75x."""
    return floor_of(reference_bounds(chip, flops, nbytes, dtypes))


def floor_of(bounds: tuple[float, float, float]) -> tuple[float, str]:
    """`reference_floor` from `reference_bounds`: the larger of the HBM floor and the MXU floor at the inputs' rate."""
    hbm, _, mxu = bounds
    return (mxu, "MXU floor from XLA's FLOPs") if mxu > hbm else (hbm, "HBM floor from its compiled program's traffic")


def reference_bounds(
    chip: Chip, flops: float, nbytes: float, dtypes: tuple[Any, ...] = ()
) -> tuple[float, float, float]:
    """(HBM floor, MXU floor at bf16's rate or faster, MXU floor at the inputs' own rate) of `reference_floor`."""
    own = max(chip.device_peak_flops(d) for d in dtypes) if dtypes else chip.device_peak_bf16_flops
    fast = max(own, chip.device_peak_bf16_flops)
    bw = chip.floor_chip.delivered_hbm_bw_bytes_s  # the compiler tier's delivered bandwidth (hardware.py), as ours
    return nbytes / bw, flops / fast, flops / own


NO_BOUNDS = (0.0, 0.0, 0.0)  # a Pallas entry (`hand_tuned`): its static schedule alone


def reference_time(chip: Chip, static_s: float, bounds: tuple[float, float, float]) -> float:
    """The XLA reference's compiler-tier time: its static schedule joined (`Chip.compiler_time`, the p-norm fitted on
    our kernels) with the larger of its HBM floor and its FLOPs at bf16's rate, never under its FLOPs at its inputs'
    own rate (an f32 convolution, which libtpu's profile gives 0 cycles).

    Joining the schedule with the HBM floor alone and bounding by the MXU floor (estimate version 7, never
    published) lowered the f32/bf16 matmul references by up to 15% (fused_02 1.681 -> 1.429 ms) and took them away
    from the chip: XLA timed on a v5e with fresh inputs (bench/results/hw-v5e-2026-12-08, 42 kernels) over [C] had a
    median |log| of 0.074 with this join and 0.095 with that one (ours: 0.059); libtpu's profile of an XLA matmul
    fusion undercounts it as it does a convolution's, and the join with the MXU floor makes up for part of that."""
    hbm, fast, own = bounds
    return max(chip.compiler_time(static_s, max(hbm, fast)), own)


def io_bytes(closed_jaxpr: Any) -> int:
    """Bytes of a traced function's array arguments and results (`jax.make_jaxpr(fn)(*structs)`: its avals; nothing
    is allocated or run)."""
    import numpy as np

    avals = [*closed_jaxpr.in_avals, *closed_jaxpr.out_avals]
    return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in avals if hasattr(a, "dtype"))


def xla_work(rep: Any) -> tuple[float, float]:
    """(FLOPs, bytes accessed) of XLA's cost analysis in a compile report; zeros when it failed."""
    cost = dict(rep.cost_analysis) if rep is not None and rep.ok else {}
    return float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))


def versions() -> dict[str, str]:
    import importlib.metadata as md

    import jax
    import jaxlib

    from .. import __version__

    try:
        libtpu = md.version("libtpu")
    except md.PackageNotFoundError:
        libtpu = "absent"
    return {"pallasopt": __version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__, "libtpu": libtpu}


class CompilerEstimator:
    """Deviceless-compiler estimates of `reference` (pure XLA) and `hand_tuned`, cached in a JSON file.

    Reference: compiled at the default dims when XLA's cost analysis predicts <= `direct_limit_s` of work (libtpu's
    profile of a bigger XLA op takes minutes), else at smaller dims from the kernel's `reduce_dims_for_compile`
    (about that much work) scaled by the reference's FLOP ratio default/reduced. Time = `Chip.compiler_time`(static
    estimate, `reference_floor`: its compiled program's HBM traffic / HBM bandwidth or its FLOPs / matmul peak), as for
    the Pallas kernels' compiler tier (max, or the chip's fitted p-norm); the static estimate
    and the FLOPs times the trip count of a `scan` in the reference (the profile and the cost analysis count a loop
    body once). Hand-tuned: the kernel's own compiler tier, run on `hand_tuned` as the entry.
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
        self.versions = versions()

    def __call__(self, ir: KernelIR, fn: str) -> Estimate:
        key_src = [
            ESTIMATE_VERSION,
            ir.digest,
            fn,
            dict(ir.dims),
            self.chip.name,
            self.chip.hbm_efficiency,
            self.chip.overlap_p if self.chip.overlap_p != float("inf") else None,  # JSON has no inf
            self.chip.compiler_hbm_efficiency,
            self.versions,
            self.direct_limit_s,
        ]
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
            from ..optimize import write_atomic

            self.cache[key] = est.to_dict()
            write_atomic(self.cache_path, json.dumps(self.cache, indent=1))
            self.cache_path.chmod(0o644)
        return est

    def _hand_tuned(self, ir: KernelIR) -> Estimate | None:
        """The compiler tier of `hand_tuned` as if it were the entry; None when its pallas_calls cannot be read."""
        from ..ir.trace import trace_calls
        from ..search.tiers import Tiers

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

        from ..cost_model.compiler import compile_module
        from ..ir.trace import arg_structs
        from ..search.tiers import reduce_dims_for_compile

        assert ir.workload is not None
        chip, dims = self.chip, dict(ir.dims)
        structs = arg_structs(ir.workload)
        traced = jax.make_jaxpr(getattr(ir.workload.module, fn))(*structs)
        trips, unknown = loop_trips(traced.jaxpr)
        notes = [f"scan body x {trips} trips (assumes the body dominates)"] if trips > 1 else []
        notes += ["a while loop of unknown trip count is counted once"] if unknown else []

        def compile_at(name: str, d: Mapping[str, int], profile: bool) -> Any:
            return compile_module(
                ir.source, ir.path, name, d, chip.name, timeout_s=self.timeout_s, dump_profile=profile
            )

        probe = compile_at("reference", dims, False)  # XLA's cost analysis of the same work at the default dims
        flops, nbytes = xla_work(probe)
        dtypes = tuple(getattr(a, "dtype", None) for a in jax.tree.leaves(structs))
        dtypes = tuple(d for d in dtypes if d is not None)
        io = io_bytes(traced) if fn == "reference" else 0
        traffic = max(io, probe.hbm_bytes or 0)
        # How much work XLA's cost analysis sees decides how big a compile is affordable; the floor below is the
        # reference's FLOPs (the analysis counts a loop body once: times the trips) or the HBM traffic of its compiled
        # program at the default dims (never under its own inputs and outputs).
        predicted = reference_floor(chip, flops, nbytes, dtypes)[0] if probe.ok else math.inf
        bounds = reference_bounds(chip, flops * trips, traffic, dtypes)
        least, least_note = floor_of(bounds)
        bounds = bounds if fn == "reference" else NO_BOUNDS
        floor_note = least_note if fn == "reference" else "no floor (Pallas call)"
        if predicted <= self.direct_limit_s:
            rep = compile_at(fn, dims, True)
            if rep.ok and rep.estimated_s is not None:
                static = rep.estimated_s * trips
                floor = least if fn == "reference" else 0.0
                bound = "static schedule" if static >= floor else floor_note
                t = reference_time(chip, static, bounds)
                return Estimate(fn, t, method="; ".join(["at the default dims", bound, *notes]))
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
        rflops, rbytes = xla_work(rep if fn == "reference" else compile_at("reference", rdims, False))
        if flops and rflops:
            scale, how = flops / rflops, "the reference's FLOP ratio"
        elif nbytes and rbytes:
            scale, how = nbytes / rbytes, "the reference's byte ratio"
        else:
            scale, how = kscale, "the kernel's grid-step ratio"
        static = rep.estimated_s * scale * trips
        bounds = reference_bounds(chip, (flops or rflops * scale) * trips, traffic, dtypes)
        full = floor_of(bounds)
        floor = full[0] if fn == "reference" else 0.0
        bound = "static schedule" if static >= floor else (full[1] if fn == "reference" else floor_note)
        method = f"at reduced dims {rdims} x {scale:.4g} ({how})" if rdims != dims else "at the default dims"
        method += f"; {bound}"
        t = reference_time(chip, static, bounds if fn == "reference" else NO_BOUNDS)
        return Estimate(fn, t, method="; ".join([method, *notes]))
