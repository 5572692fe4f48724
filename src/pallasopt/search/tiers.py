"""The fidelity tiers, cheapest first: roofline model, deviceless TPU compiler, interpret-mode oracle, hardware.

Each tier returns a `TierResult` value and never raises for a candidate's fault. `Evaluator` is the protocol the
beam search uses, so tests can drive the search with a fixed cost table instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..cost_model.hardware import Chip
from ..cost_model.roofline import Estimate, estimate_calls
from ..cost_model.wrapper import wrapper_cost, xla_rest
from ..executors import Executor
from ..ir.kernel_ir import KernelIR

TIER_LABEL = {
    "model": "model (roofline)",
    "compiler": "compiler estimate (libtpu static schedule, no TPU)",
    "hardware": "measured",
}


@dataclass(frozen=True)
class TierResult:
    """One tier's verdict on one candidate: ok, the time it implies (if any), and why."""

    tier: str
    ok: bool
    time_s: float | None = None
    message: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "ok": self.ok,
            "time_s": self.time_s,
            "message": self.message,
            "data": dict(self.data),
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> TierResult:
        return TierResult(
            tier=str(d["tier"]),
            ok=bool(d["ok"]),
            time_s=d.get("time_s"),
            message=str(d.get("message", "")),
            data=dict(d.get("data") or {}),
        )


class Evaluator(Protocol):
    """What the search needs from the tiers (a fake in tests, `Tiers` for real)."""

    def model(self, ir: KernelIR) -> TierResult: ...

    # None: tier unavailable. `deadline` (optional for an evaluator to take; passed only when the search has a budget):
    # stop the compile there (then marked `budget_cut`, not a verdict on the kernel).
    def compiler(self, ir: KernelIR) -> TierResult | None: ...

    # `deadline` (a `time.perf_counter()` value, passed only when the search has a budget): stop the check there.
    def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult: ...

    def hardware(self, ir: KernelIR) -> TierResult | None: ...  # None: no accelerator

    # Optional (the search asks with `getattr`): ``unavailable(tier) -> str | None``, why `compiler` or `hardware`
    # answers None here (None: it is available). The run prints the reason; without it, "the evaluator has no ...".
    # ``compile_floor(ir) -> float | None``: a time `compiler(ir)` never answers below; the funnel skips a compile
    # whose floor already keeps it out of the result.


# libtpu's static profile counts a loop whose trip count is known only at run time once: on a GQA kernel whose
# key loop stops at the diagonal (32.5 of 64 chunks per grid step on average) it estimated 2.86 ms for 5.7 ms of
# MXU work at peak (bench/kernels/llm_gqa_attention.py after skip-masked-chunks, v5e, 2026-12-02).
UNCOUNTED_LOOP = (
    "no time: a loop's trip count changes from grid step to grid step and libtpu's static profile counts it once"
)
# libtpu's static profile gave a Pallas kernel 0 cycles: no estimate, not a free kernel. Joined with the HBM floor
# such a kernel looked exactly bandwidth-bound and won its search: fused_33's `coarsen{call=0,axis=0,by=2}` (0 cycles,
# so 1.660 ms [C], its floor, against 1.682 for its tiles) ran 2.916 ms on a v5e against ~1.78 (2026-12-06,
# bench/results/hw-v5e-2026-12-06d).
ZERO_CYCLES = "no time: libtpu's static profile gives the kernel 0 cycles (no estimate)"


def zero_cycle_kernels(per_op_cycles: Sequence[tuple[str, int]]) -> list[str]:
    """The Pallas kernels the static profile gives 0 cycles (`CompileReport.per_op_cycles` names them "pallas:...")."""
    return [name for name, cycles in per_op_cycles if name.startswith("pallas:") and cycles == 0]


def deadline_kw(fn: Any, deadline: float | None) -> dict[str, float]:
    """`{"deadline": deadline}` when there is one and `fn` (an evaluator's tier method) takes it, else `{}`: an
    evaluator may leave the parameter out (test fakes, the study's stand-ins) and then runs without one."""
    if deadline is None:
        return {}
    import inspect

    try:
        takes = "deadline" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes = False
    return {"deadline": deadline} if takes else {}


def model_tier(ir: KernelIR, chip: Chip) -> TierResult:
    est = estimate_calls(ir.calls, chip)
    wrapper_s = wrapper_cost(ir).seconds(chip)  # the wrapper's transposes, pads, elementwise fusions
    data = {**est.to_dict(), "wrapper_s": wrapper_s}
    if not est.ok:
        return TierResult("model", False, est.time_s + wrapper_s, "; ".join(est.problems), data)
    bound = f"{est.calls[0].bound}-bound" if est.calls else ""
    return TierResult("model", True, est.time_s + wrapper_s, bound, data)


# The profile dump's compile time grows with grid steps x per-step work: ~2.3 ms per 128^3 matmul step (FACTS.md),
# and ~0.13 s per step of a 128x8192 @ 8192x128 step (64 such units; v6e, measured on the loaded 2-core machine).
STEP_WORK_UNIT_FLOPS = 2 * 128**3
STEP_WORK_CAP = 256  # 128^3-matmul step units: the compile stays at the cost of 256 plain 128^3 steps ...
MIN_COMPILE_STEPS = 64  # ... but never below this many steps (a few % over-estimate; see `compile_steps_cap`)
# Each call of a module keeps at least this many grid steps (or all it has) when the dims are reduced: a call's
# fixed cost (the first blocks' fetch, the last block's write-back, a block fetched once) is multiplied by the step
# ratio with the rest. Measured (v5e static schedule, 2026-12-05, fused_06 `tile{call=0,axis1=4096}`, whose call 0
# fetches its whole 8 MiB weight once): call 0 kept at 2 / 4 / 8 / 16 / 32 steps by the reduction extrapolates to
# 1.087 / 0.887 / 0.788 / 0.738 / 0.713 ms, against 0.705 / 0.702 ms at 48 / 56 steps (docs/cost-model.md).
MIN_CALL_STEPS = 16
FLOOR_MIN_SHARE = 0.1  # ... for a call with at least this share of the module's model time (a router's 2 steps
# beside 57k expert steps, llm_moe, would otherwise keep 896 heavy expert steps: a 100 s compile for < 1% of the time)
FLOOR_GIVES_WAY_STEPS = 1024  # ... unless the module would then keep more steps than this (the compile's cost)


def compile_steps_cap(ir: KernelIR, max_steps: int = 256) -> int:
    """How many grid steps the compiler tier compiles: `max_steps`, fewer when each step is heavy MXU work.

    A full-K matmul block (128x8192 @ 8192x128: 64 units of 128^3 per step) took 50-80 s to profile at 256 steps
    and ~30 s at 32 on the loaded 2-core machine (~20 s of it start-up). Scaling by the step ratio also scales the
    fixed prologue (the first block's DMA), so fewer steps over-estimate: v6e static estimates at 32 steps came out
    1.5% (bm=128) and 5.8% (bm=256, 8x scale) over the 256-step ones; at 64 steps that excess is about halved. So the
    step count is capped at STEP_WORK_CAP work units, never below MIN_COMPILE_STEPS."""
    steps = sum(c.steps for c in ir.calls)
    per_step = sum(c.flops for c in ir.calls) / max(steps, 1) / STEP_WORK_UNIT_FLOPS
    if per_step <= 1:
        return max_steps
    return max(min(MIN_COMPILE_STEPS, max_steps), min(max_steps, int(STEP_WORK_CAP / per_step)))


@dataclass(frozen=True)
class CompileDims:
    """The dims the compiler tier compiles at, and how to scale the estimate back to the real dims: `scale` is the
    module's step ratio; `call_scales` each call's own, when the reduction cut the calls by different ratios (a
    dim that only one call's grid walks), else empty."""

    dims: dict[str, int]
    scale: float
    call_scales: tuple[float, ...] = ()


def reduce_dims_for_compile(ir: KernelIR, max_steps: int = 256) -> tuple[dict[str, int], float]:
    """`compile_dims` as (dims, the module's step ratio)."""
    d = compile_dims(ir, max_steps)
    return d.dims, d.scale


def compile_dims(ir: KernelIR, max_steps: int = 256, call_times: Sequence[float] = ()) -> CompileDims:
    """Smaller dims with the same blocks so the compiler's profile dump stays fast, with the step ratios.

    The static estimate is linear in grid steps beyond ~100 steps (FACTS.md), so the estimate at the reduced dims is
    scaled by (steps at the real dims) / (steps at the reduced dims), each call by its own ratio where they differ
    (`CompileDims.call_scales`: in a matmul then a row reduction, halving N cuts the matmul's grid, not the
    reduction's, whose blocks span N). A dim is halved while the module has more than
    `max_steps` steps, and never so far that a call is left with fewer than `MIN_CALL_STEPS` (or the steps it had):
    in a module of two calls the small one would otherwise be cut to 2 steps, and its fixed cost scaled up with the
    rest. With `call_times` (the model's time of each call) the floor holds only for calls with at least
    `FLOOR_MIN_SHARE` of the total. That floor gives way only while the module has more than
    `FLOOR_GIVES_WAY_STEPS` steps (it keeps a call at no more steps than the `MIN_COMPILE_STEPS` a single-call
    module keeps, however heavy its steps).
    """
    from ..ir.trace import trace_calls

    dims = dict(ir.dims)
    if ir.workload is None:  # untrusted (LLM-written) source: never traced in this process
        return CompileDims(dims, 1.0)
    full = sum(c.steps for c in ir.calls)
    blocks = [[o.block_shape for o in c.operands] for c in ir.calls]
    total_time = sum(call_times)
    known = total_time > 0 and len(call_times) == len(ir.calls)
    shares = [t / total_time for t in call_times] if known else [1.0] * len(ir.calls)
    floors = [
        min(c.steps, MIN_CALL_STEPS) if w >= FLOOR_MIN_SHARE else 1 for c, w in zip(ir.calls, shares, strict=True)
    ]

    def steps_of(d: Mapping[str, int]) -> list[int] | None:
        try:
            calls = trace_calls(ir.workload, d)  # type: ignore[arg-type]
        except Exception:
            return None
        if [[o.block_shape for o in c.operands] for c in calls] != blocks:
            return None
        if any(
            g < min(2, g0)
            for c, c0 in zip(calls, ir.calls, strict=False)
            for g, g0 in zip(c.grid, c0.grid, strict=False)
        ):
            return None
        return [c.steps for c in calls]

    current, reduced = full, [c.steps for c in ir.calls]
    frozen: set[str] = set()
    while current > max_steps and len(frozen) < len(dims):
        for name in list(dims):
            if name in frozen or current <= max_steps:
                continue
            if dims[name] % 2 or dims[name] < 2:
                frozen.add(name)
                continue
            trial = {**dims, name: dims[name] // 2}
            per_call = steps_of(trial)
            if per_call is None or sum(per_call) >= current:
                frozen.add(name)
                continue
            under = any(s < f for s, f in zip(per_call, floors, strict=True))
            if under and current <= FLOOR_GIVES_WAY_STEPS:
                frozen.add(name)
                continue
            dims, current, reduced = trial, sum(per_call), per_call
    scale = full / max(current, 1)
    ratios = tuple(c.steps / max(r, 1) for c, r in zip(ir.calls, reduced, strict=True))
    return CompileDims(dims, scale, ratios if len(set(ratios)) > 1 else ())


def corrected_static(static_s: float, steps: int, chip: Chip) -> float:
    """libtpu's static estimate less the per-grid-step cost it charges above the chip (`Chip.compiler_step_excess_s`,
    fitted per chip on measured times; 0 leaves it as is). Never below half the raw estimate: the excess is a
    per-step constant, and a kernel whose estimate it would nearly cancel is outside what it was fitted on."""
    return max(static_s - steps * chip.compiler_step_excess_s, 0.5 * static_s)


CHECK_TIMEOUT_S = 300.0  # an interpret-mode check that runs longer is a hang
MIN_CHECK_S = 5.0  # a check started just before the budget ends still gets this long
MIN_COMPILE_S = 5.0  # likewise for a compile
# A timing started just before the budget ends still gets this long: a run's first timing took 17-52 s on the
# v5e host (JAX's TPU start-up, the entry's and the reference's compiles; bench/results/hw-v5e-2026-12-07d).
MIN_TIMING_S = 60.0


def budget_timeout(limit_s: float, floor_s: float, deadline: float | None) -> float:
    """A child's time limit: its own `limit_s`, cut to what the search's budget leaves (`deadline`), never under
    `floor_s` (a job started just before the budget ends still gets that long)."""
    if deadline is None:
        return limit_s
    return min(limit_s, max(floor_s, deadline - time.perf_counter()))


def budget_cut(tier: str, timeout_s: float, data: Mapping[str, Any]) -> TierResult:
    """The record of a `tier` job stopped at the search's budget: no verdict on the kernel (the DB does not keep it)."""
    msg = f"stopped at the search budget after {timeout_s:.0f} s (not a verdict on the kernel)"
    return TierResult(tier, False, None, msg, {**data, "budget_cut": True})


SUSPICIOUS = 0.5  # a time under half the roofline floor is flagged and the candidate re-checked on fresh seeds


def roofline_floor(ir: KernelIR, chip: Chip) -> float:
    """No kernel beats max(its FLOPs at peak, its compulsory HBM bytes at full bandwidth)."""
    flops = sum(c.flops for c in ir.calls)
    dtypes = [d.lhs_dtype for c in ir.calls for d in c.body.dots] or ["bfloat16"]
    compulsory = sum(o.array_bytes for c in ir.calls for o in c.operands)
    return max(flops / chip.device_peak_flops(dtypes[0]), compulsory / chip.device_hbm_bw_bytes_s)


def kernels_alone_reason(ir: KernelIR, rep: Any, timeout_s: float) -> str | None:
    """Why the compiler tier should profile `ir`'s pallas_calls without the wrapper's XLA ops, given the whole
    entry's compile report `rep` (None: it should not). libtpu's static profile crashes on some XLA ops (a JAXBench
    kernel's `reduce_window` max-pool: "Unsupported llo instruction") and takes minutes on big ones (a 137 GFLOP XLA
    matmul the kernel only adds a norm to); either way the kernels would get no compiler tier at all."""
    from ..cost_model.compiler import PROFILE_CRASHED

    if rep.ok and rep.estimated_s is None and (rep.note or "").startswith(PROFILE_CRASHED):
        return "the whole entry's profile crashed libtpu"
    if not rep.ok and rep.error_kind == "timeout":
        kinds = xla_rest(ir).kinds
        if kinds:
            return (
                f"the whole entry's compile with the profile ran past {timeout_s:.0f} s; its wrapper runs XLA "
                + ", ".join(kinds)
            )
    return None


def compile_floor(ir: KernelIR, chip: Chip, model: Estimate | None = None) -> float:
    """The compiler tier's floor: its DMA and edge HBM traffic at the bandwidth the tier's fit says the chip delivers
    (`Chip.floor_chip`) plus the wrapper's. The static schedule does not model HBM bandwidth (FACTS.md), so the tier
    answers `Chip.compiler_time(static, this)`: never less.
    `model`: `estimate_calls(ir.calls, chip)` when the caller has it (used when the floor's bandwidth is the model's)."""
    fchip = chip.floor_chip
    model = model if model is not None and fchip is chip else estimate_calls(ir.calls, fchip)
    return sum(c.dma_s + c.edge_s for c in model.calls) + wrapper_cost(ir).seconds(fchip)


class Tiers:
    """The real tiers for one target chip; their compiles, checks and timings run on `executor` (default: local
    child processes)."""

    def __init__(
        self,
        chip: Chip,
        *,
        use_compiler: bool = True,
        compile_timeout_s: float = 180.0,
        executor: Executor | None = None,
    ) -> None:
        from ..executors.local import LocalExecutor

        self.chip = chip
        # Without one given (a one-off compile), fresh children: nobody would close a warm pool.
        self.executor: Executor = executor or LocalExecutor(warm=False)
        self.compile_timeout_s = compile_timeout_s
        self.compiler_off = _compiler_off(use_compiler, chip)
        self.use_compiler = self.compiler_off is None
        # (module path, the wrapper's other XLA ops) -> why its whole entry could not be profiled (`compiler`)
        self._kernels_alone: dict[tuple[str, tuple[str, ...]], str] = {}

    def unavailable(self, tier: str) -> str | None:
        """Why `tier` is not available here (None: it is)."""
        if tier == "compiler":
            return self.compiler_off
        if tier == "hardware" and self.executor.name != "local":  # timed on a cluster host with the chip
            from ..executors.jobs import hardware_needs

            return self.executor.unavailable(hardware_needs(self.chip))
        if tier == "hardware":
            device = self.device_kind()
            if device is None:
                return "no TPU or GPU visible to JAX on this machine"
            if device != self.chip.device_kind:
                return f"the visible accelerator is {device}, not the target {self.chip.name} ({self.chip.device_kind})"
        return None

    def device_kind(self) -> str | None:
        """The `device_kind` of the accelerator JAX sees here ("TPU v5 lite"), None without one (probed once)."""
        if not hasattr(self, "_device"):
            from ..harness.timing import accelerator_kind

            kind = accelerator_kind()
            self._device = kind.partition(": ")[2] if kind else None
        return self._device

    def model(self, ir: KernelIR) -> TierResult:
        return model_tier(ir, self.chip)

    def compile_floor(self, ir: KernelIR) -> float | None:
        """What `compiler(ir)` answers is never below this (None: no compiler tier)."""
        return compile_floor(ir, self.chip) if self.use_compiler else None

    def check_work(self, ir: KernelIR, seeds: tuple[int, ...] = ()) -> int | None:
        """The interpret-mode work of `check(ir, seeds)` in element-steps (`harness.check_dims.check_work`; the
        seeds do not change it), for the search to foresee checks that cannot finish in its budget; None when it
        cannot be told (the dims do not trace)."""
        from ..harness.check_dims import check_work

        if ir.workload is None:
            return None
        try:
            return check_work(ir.workload, ir.calls)
        except Exception:
            return None

    def compiler(self, ir: KernelIR, deadline: float | None = None) -> TierResult | None:
        """The deviceless compile's verdict and static estimate; with a `deadline` (where the search's budget leaves
        no more time to wait for a compile) the compile is stopped there and marked ``budget_cut`` (the DB does not
        keep it), so a budget spent on one slow compile still leaves time to check what was ranked."""
        if not self.use_compiler:
            return None
        from ..executors.jobs import compile_job

        timeout = budget_timeout(self.compile_timeout_s, MIN_COMPILE_S, deadline)

        def compile_at(
            dims: Mapping[str, int], scale: float, call_scales: tuple[float, ...], kernels_only: bool = False
        ) -> Any:
            job = compile_job(
                ir.source,
                ir.path,
                ir.entry,
                dims,
                self.chip.name,
                steps_scale=scale,
                call_scales=call_scales,
                timeout_s=timeout,
                kernels_only=kernels_only,
            )
            return self.executor.run(job)

        model = estimate_calls(ir.calls, self.chip)
        reduced = compile_dims(ir, compile_steps_cap(ir), [c.time_s for c in model.calls])
        dims, scale = reduced.dims, reduced.scale
        # A wrapper whose profile failed for an earlier candidate of this module fails again: go to its kernels.
        known = self._kernels_alone.get((ir.path, xla_rest(ir).ops)) if self._kernels_alone else None
        rep = compile_at(dims, scale, reduced.call_scales, kernels_only=known is not None)
        if not rep.ok and rep.error_kind == "timeout" and timeout < self.compile_timeout_s:
            msg = f"stopped at the search budget after {timeout:.0f} s (not a verdict on the kernel)"
            return TierResult("compiler", False, None, msg, {"dims": dims, "budget_cut": True})
        if not rep.ok and rep.error_kind not in ("vmem_oom", "timeout") and scale != 1.0:
            # The reduced dims can break a module's own invariants (e.g. query heads < KV heads): compile the real
            # size instead (slower with the profile, but the answer is for the size the user asked about).
            dims, scale = dict(ir.dims), 1.0
            rep = compile_at(dims, scale, (), kernels_only=known is not None)
        alone = None if known is None else f"{known}, for an earlier candidate of this module"
        if known is None and (alone := kernels_alone_reason(ir, rep, timeout)) is not None:
            # libtpu's profile failed on the wrapper's XLA ops: profile the pallas_calls alone, price the rest below
            rep_k = compile_at(dims, scale, reduced.call_scales if scale == reduced.scale else (), kernels_only=True)
            if rep_k.ok:
                self._kernels_alone[(ir.path, xla_rest(ir).ops)] = alone
            if rep_k.ok or not rep.ok:  # a failure of the kernels alone is a verdict only where the entry had none
                rep = rep_k
            else:
                alone = None
        data = {"dims": dims, "steps_scale": scale, "report": _report_dict(rep), "error_kind": rep.error_kind or ""}
        if alone is not None:
            data = {**data, "kernels_alone": alone}
        if not rep.ok:
            return TierResult("compiler", False, None, f"{rep.error_kind}: {rep.error}", data)
        hbm_floor = compile_floor(ir, self.chip, model)
        static = rep.estimated_s if rep.estimated_s is not None else math.nan
        if not math.isnan(static) and any(c.body.loop_trips_vary for c in ir.calls):
            static = math.nan
            rep = replace(rep, note=UNCOUNTED_LOOP)
        zero = zero_cycle_kernels(rep.per_op_cycles)
        if not math.isnan(static) and zero:
            static = math.nan
            rep = replace(rep, note=f"{ZERO_CYCLES}: {', '.join(zero)}")
        if math.isnan(static):
            why = rep.note or "no static estimate for this kernel"
            return TierResult("compiler", True, None, f"compiled (fits); {why}", data)
        # The static schedule charges more per grid step than the chip spends (FACTS.md): remove the measured excess.
        steps = sum(c.steps for c in ir.calls)
        data = {**data, "static_raw_s": static, "hbm_floor_s": hbm_floor, "grid_steps": steps}
        static = corrected_static(static, steps, self.chip)
        # The static schedule does not model HBM bandwidth (FACTS.md): time >= bytes / bandwidth, joined with the
        # schedule as the chip's fit says (`Chip.compiler_time`: max, or a p-norm where the chip was measured).
        t = self.chip.compiler_time(static, hbm_floor)
        # the max join too: what the trust rules' thresholds were measured on (`search/trust.py`, `ranking`)
        data = {**data, "max_join_s": max(static, hbm_floor)}
        bound = "static schedule" if static >= hbm_floor else "HBM floor"
        message = f"{bound}: static {static * 1e3:.3f} ms, HBM floor {hbm_floor * 1e3:.3f} ms"
        if alone is not None:
            # libtpu did not schedule the wrapper's contractions, reductions and windows: each priced by its work
            rest = xla_rest(ir)
            rest_s = rest.seconds(self.chip.floor_chip)
            t += rest_s
            data = {**data, "xla_rest_s": rest_s, "xla_rest_ops": list(rest.kinds)}
            message += (
                f"; the pallas_calls' static schedule alone ({alone}), plus the wrapper's other XLA ops "
                f"({', '.join(rest.kinds) or 'none'}) at "
                f"max(FLOPs / peak, bytes / bandwidth) per op, {rest_s * 1e3:.3f} ms"
            )
        floor = roofline_floor(ir, self.chip)
        if t < SUSPICIOUS * floor:
            data = {**data, "below_floor": True, "floor_s": floor}
        return TierResult("compiler", True, t, message, data)

    def target_compile(self, ir: KernelIR) -> TierResult | None:
        """Whether the module compiles for the target at its default dims (lowering and VMEM, no cycle profile): the
        gate the result passes whatever tier ranked it (`optimize._target_gate`). The compiler tier compiles at
        reduced dims and a model-ranked search not at all; a buffer that grows with the dims (a scratch sized by the
        sequence, XLA's own temporaries around the call) overflows only at the full size (llm_ragged_paged_attention's
        best of 2026-12-05 needed 97.6 MiB of scoped VMEM at its default dims, on a v5e and deviceless alike). None:
        no compiler here."""
        if not self.use_compiler:
            return None
        from ..executors.jobs import compile_job

        job = compile_job(
            ir.source, ir.path, ir.entry, ir.dims, self.chip.name, steps_scale=1.0,
            timeout_s=self.compile_timeout_s, profile=False,
        )  # fmt: skip
        rep = self.executor.run(job)
        data = {"dims": dict(ir.dims), "error_kind": rep.error_kind or "", "vmem_bytes": rep.vmem_bytes}
        if rep.ok:
            return TierResult("compiler", True, None, f"compiles for {self.chip.name} at the default dims", data)
        if rep.error_kind == "timeout":  # no verdict on the kernel: the gate lets it through and says so
            data["no_verdict"] = True
        return TierResult("compiler", False, None, f"{rep.error_kind}: {' '.join(str(rep.error).split())[:300]}", data)

    def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
        """The interpret-mode oracle; with a `deadline` (the search's budget) the child is stopped there, and a check
        cut short that way is marked ``budget_cut`` (no verdict on the kernel: the DB does not keep it)."""
        from ..executors.jobs import check_job

        timeout = budget_timeout(CHECK_TIMEOUT_S, MIN_CHECK_S, deadline)
        r = self.executor.run(check_job(ir.source, ir.path, seeds, timeout_s=timeout))
        data = r.to_dict()
        if not r.ok and r.status == "timeout" and timeout < CHECK_TIMEOUT_S:
            return budget_cut("check", timeout, data)
        return TierResult("check", r.ok, None, r.message or f"max rel err {r.max_rel_err:.2e}", data)

    def hardware(self, ir: KernelIR, deadline: float | None = None) -> TierResult | None:
        """The chip's time; with a `deadline` (the search's budget) the timing is stopped there (never before
        `MIN_TIMING_S`), and one cut short that way is marked ``budget_cut`` (no verdict: the DB does not keep it).
        A kernel that hangs the chip held a 100 s search for `TIMING_TIMEOUT_S` (600 s) before."""
        from ..executors.jobs import TIMING_TIMEOUT_S, time_job

        if self.unavailable("hardware") is not None:  # no accelerator, or not the target's kind
            return None
        timeout = budget_timeout(TIMING_TIMEOUT_S, MIN_TIMING_S, deadline)
        r = self.executor.run(time_job(ir.source, ir.path, self.chip, timeout_s=timeout))
        if not r.get("ok") and r.get("status") == "timeout" and timeout < TIMING_TIMEOUT_S:
            return budget_cut("hardware", timeout, r)
        timed_on = str(r.get("device") or "").partition(": ")[2]
        if r.get("ok") and timed_on != self.chip.device_kind:  # the child saw another chip than the probe
            why = (
                f"timed on {timed_on or 'an unknown device'}, not the target {self.chip.name} ({self.chip.device_kind})"
            )
            return TierResult("hardware", False, None, why, r)
        t = r.get("median_s")
        if t is not None and t < SUSPICIOUS * roofline_floor(ir, self.chip):
            r = {**r, "below_floor": True, "floor_s": roofline_floor(ir, self.chip)}
        return TierResult("hardware", r.get("ok", False), t, r.get("message", ""), r)


def _compiler_off(use_compiler: bool, chip: Chip) -> str | None:
    """Why the compiler tier is not available for `chip` (None: it is)."""
    if not use_compiler:
        return "turned off (--no-compile)"
    if chip.is_gpu:
        return f"{chip.name} is a GPU: the deviceless compiler tier is TPU-only"
    return None if _libtpu() else "libtpu not installed (pip install 'pallasopt[tpu]')"


def _libtpu() -> bool:
    try:
        from ..cost_model.compiler import libtpu_available

        return libtpu_available()
    except Exception:
        return False


def _report_dict(rep: Any) -> dict[str, Any]:
    import dataclasses

    d = dataclasses.asdict(rep) if dataclasses.is_dataclass(rep) and not isinstance(rep, type) else dict(rep)
    return {k: v for k, v in d.items() if k != "per_op_cycles"} | {
        "per_op_cycles": [list(x) for x in d.get("per_op_cycles", ())]
    }
