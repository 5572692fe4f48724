"""The chips pallasopt can target, with the source of every number.

Sources, cited by tag in the comments below:
  [jax]     JAX 0.10.2 `jax/_src/pallas/mosaic/tpu_info.py` (`_get_tpu_info_impl`): per-TensorCore VMEM, MXU size
            and count, HBM, bandwidth and peak ops; its `ChipVersion` table gives TensorCores and megacore support.
  [gc-v4]   https://cloud.google.com/tpu/docs/v4     (275 TFLOP/s bf16, 32 GiB HBM, 1200 GB/s per chip)
  [gc-v5e]  https://cloud.google.com/tpu/docs/v5e    (197 TFLOP/s bf16, 393 TOP/s int8, 16 GB, 819 GB/s)
  [gc-v5p]  https://cloud.google.com/tpu/docs/v5p    (459 TFLOP/s bf16, 95 GiB, 2765 GB/s, 2 TensorCores)
  [gc-v6e]  https://cloud.google.com/tpu/docs/v6e    (918 TFLOP/s bf16, 1836 TOP/s int8, 32 GB, 1640 GB/s)
  [gc-7x]   https://cloud.google.com/tpu/docs/tpu7x  (2307 TFLOP/s bf16, 4614 fp8, 192 GiB, 7380 GB/s, 2 TCs)
  [nv-h100] https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM datasheet: 1979 TFLOP/s bf16 *with
            sparsity* = 989 dense, 3958 TOP/s int8 sparse = 1979 dense, 67 TFLOP/s fp32, 80 GB, 3.35 TB/s)
  [nv-h200] https://www.nvidia.com/en-us/data-center/h200/ (same compute as H100 SXM, 141 GB, 4.8 TB/s)
  [nv-hop]  NVIDIA Hopper tuning guide / CUDA C++ guide, compute capability 9.0: 132 SMs (H100 SXM5),
            228 KB shared memory per SM (227 KB usable by one block).
  [facts]   /work/shared/FACTS.md (measured on this kind of machine).
  [libtpu]  measured with libtpu 0.0.42.1 deviceless compiles (`cost_model.compiler`): default scoped VMEM
            limits from the compiler's OOM messages; f32 and VPU/EUP rates from its static cycle estimates.

Peak figures are per *chip*. A JAX device is one chip except on TPU7x, where each of the two TensorCores is a
device (`devices_per_chip`); `device_*` properties give what one device (the unit a kernel runs on) offers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

__all__ = ["CHIPS", "Chip", "UnknownTarget", "get_chip", "native_tile"]

_MiB = 1 << 20
_GiB = 1 << 30

# Bit widths of the dtype names pallasopt meets; anything else goes through numpy (with ml_dtypes' names).
_BITS = {
    "float64": 64,
    "int64": 64,
    "uint64": 64,
    "float32": 32,
    "int32": 32,
    "uint32": 32,
    "bfloat16": 16,
    "float16": 16,
    "int16": 16,
    "uint16": 16,
    "int8": 8,
    "uint8": 8,
    "bool": 8,
    "float8_e4m3fn": 8,
    "float8_e5m2": 8,
    "float8_e4m3b11fnuz": 8,
    "float8_e4m3fnuz": 8,
    "float8_e5m2fnuz": 8,
    "int4": 4,
    "uint4": 4,
}


def _bits(dtype: Any) -> int:
    name = dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or getattr(dtype, "__name__", "")
    if isinstance(name, str) and name in _BITS:
        return _BITS[name]
    import ml_dtypes  # noqa: F401  (registers bfloat16/float8 with numpy)
    import numpy as np

    return int(np.dtype(dtype).itemsize) * 8


def native_tile(dtype: Any) -> tuple[int, int]:
    """The TPU's native (sublanes, lanes) tile of a 2-D array of `dtype` in VMEM.

    (8, 128) for 32-bit, (16, 128) for 16-bit, (32, 128) for 8-bit and (64, 128) for 4-bit types: a vreg holds
    8 x 128 32-bit words and narrower types pack along sublanes. Source: [jax] `TpuInfo.get_sublane_tiling`
    (packing = 32 // bitwidth) and the Pallas TPU docs' block-shape rule. 64-bit types are treated as 32-bit.
    """
    bits = min(_bits(dtype), 32)
    return (8 * (32 // bits), 128)


class UnknownTarget(ValueError):
    """A target name that is not in `CHIPS`."""


@dataclass(frozen=True)
class Chip:
    """One accelerator, as the cost model sees it. Peaks and memory sizes are per chip unless named per core.

    For GPU entries (`is_gpu`), `vmem_bytes` is the shared memory (SMEM) of one SM, `tensorcores_per_chip` is the
    SM count and `mxu_shape`/`native_tile` have no TPU meaning.
    """

    name: str  # pallasopt's target name ("v5e")
    device_kind: str  # `jax.Device.device_kind` ("TPU v5 lite")
    topology: str  # for `jax.experimental.topologies.get_topology_desc` ("" for GPUs)
    generation: int  # TPU generation (4, 5, 6, 7); 0 for GPUs
    peak_bf16_flops: float  # dense bf16 matmul FLOP/s per chip
    peak_int8_ops: float  # dense int8 matmul OP/s per chip (0: not supported natively)
    peak_f32_flops: float  # f32 x f32 matmul FLOP/s per chip at JAX's DEFAULT precision (see `_F32_DEFAULT_COST`)
    hbm_bytes: int  # HBM capacity per chip
    hbm_bw_bytes_s: float  # HBM bandwidth per chip
    vmem_bytes: int  # VMEM per TensorCore (GPU: shared memory per SM)
    default_scoped_vmem_bytes: int  # the compiler's default `vmem_limit_bytes` (GPU: max SMEM per block)
    tensorcores_per_chip: int  # TPU TensorCores per chip (GPU: SMs)
    megacore: bool  # one device spans 2 TensorCores and "parallel" grid axes are split over them
    mxu_shape: int  # systolic array side: 128 (v4/v5) or 256 (v6e, 7x); 0 for GPUs
    mxus_per_core: int  # MXUs per TensorCore
    clock_hz: float  # core clock; converts the compiler's cycle estimates to seconds
    step_overhead_s: float  # fixed cost of one grid step of a Pallas pipeline
    vpu_flops: float  # elementwise f32 ops/s per chip (VPU: 8 x 128 lanes x ALUs x clock x cores)
    eup_ops: float  # transcendental ops/s per chip (EUP: exp, log, tanh, reciprocal, ...)
    is_gpu: bool = False
    devices_per_chip: int = 1  # JAX devices per chip: 2 on TPU7x (each TensorCore is a device)
    smem_bytes: int = 0  # TPU scalar memory (SMEM) per TensorCore; 0 for GPUs
    peak_f32_highest_flops: float = 0.0  # f32 matmul FLOP/s per chip at Precision.HIGHEST (true f32)
    # Fraction of min(MXU, VPU + EUP) time of a grid step that does not hide under the larger of the two (the model's
    # step compute is max + vector_serial x min). 0 (full overlap) where no measurement says otherwise.
    vector_serial: float = 0.0
    # Fixed cost of one iteration of a loop inside a grid step (emit_pipeline's inner steps: `ir/loops.py`); 0 means
    # the same as a grid step.
    inner_step_overhead_s: float = 0.0
    # What libtpu's static estimate charges per grid step above real hardware (the compiler tier subtracts
    # steps x this from the estimate, `search/tiers.py`); 0 where no measurement says otherwise.
    compiler_step_excess_s: float = 0.0
    # Time from a manual DMA's start until its first byte lands (issue, address translation, HBM round trip), paid
    # once per copy on top of bytes / bandwidth; k - 1 copies in flight (a k-slot ring, `multi-buffer`) share it.
    # Assumed (no measurement on this machine): 1 us on every TPU, a round figure of the order of a grid step.
    dma_latency_s: float = 1e-6
    # Share of the datasheet HBM bandwidth a kernel's DMAs get on the chip: the HBM floors of the compiler tier
    # (`search/tiers.py: compile_floor`), of the XLA reference's estimate (`bench/estimate.py`) and the model's DMA
    # time divide bytes by `delivered_hbm_bw_bytes_s`. 1.0 (the datasheet figure) where no measurement says otherwise.
    hbm_efficiency: float = 1.0
    # How the compiler tier joins libtpu's static schedule S (which leaves HBM out) and the HBM floor F (bytes at the
    # delivered bandwidth): (S^p + F^p)^(1/p), `compiler_time`. inf is max(S, F): perfect overlap of the DMAs with
    # the compute the schedule counts; a finite p charges some of the smaller part too, most where they are close.
    # inf where no measurement says otherwise.
    overlap_p: float = math.inf
    # The HBM efficiency of the compiler tier's floor and of the XLA reference's (fitted with `overlap_p`, the two
    # together: a p-norm charges part of the smaller side, so its floor's efficiency comes out higher than the
    # model's max-based one); None: `hbm_efficiency`. `floor_chip` is the chip those floors are computed on.
    compiler_hbm_efficiency: float | None = None

    @property
    def floor_chip(self) -> Chip:
        """This chip with the compiler tier's HBM efficiency as its delivered bandwidth (itself when they agree)."""
        eff = self.compiler_hbm_efficiency
        return self if eff is None or eff == self.hbm_efficiency else replace(self, hbm_efficiency=eff)

    def compiler_time(self, static_s: float, floor_s: float) -> float:
        """The compiler tier's time from its static part and its HBM floor (`overlap_p`); never below either."""
        hi = max(static_s, floor_s)
        if math.isinf(self.overlap_p) or hi <= 0:
            return hi
        p = self.overlap_p
        return float(hi * ((static_s / hi) ** p + (floor_s / hi) ** p) ** (1 / p))

    def native_tile(self, dtype: Any) -> tuple[int, int]:
        """(sublanes, lanes) of the native VMEM tile of `dtype`; (1, 1) on GPUs, which have no layout tile."""
        return (1, 1) if self.is_gpu else native_tile(dtype)

    @property
    def device_peak_bf16_flops(self) -> float:
        """Dense bf16 FLOP/s of one JAX device."""
        return self.peak_bf16_flops / self.devices_per_chip

    @property
    def device_hbm_bw_bytes_s(self) -> float:
        """HBM bytes/s of one JAX device."""
        return self.hbm_bw_bytes_s / self.devices_per_chip

    @property
    def delivered_hbm_bw_bytes_s(self) -> float:
        """HBM bytes/s one JAX device's kernels get: the datasheet figure times `hbm_efficiency`."""
        return self.device_hbm_bw_bytes_s * self.hbm_efficiency

    def device_peak_flops(self, dtype: Any) -> float:
        """Matmul peak of one JAX device for operands of `dtype` (8-bit: int8/fp8 rate where supported)."""
        bits = _bits(dtype)
        if bits >= 32:
            peak = self.peak_f32_flops
        elif bits == 16:
            peak = self.peak_bf16_flops
        else:
            peak = self.peak_int8_ops or self.peak_bf16_flops
        return peak / self.devices_per_chip


# f32 matmuls on the MXU. At JAX's DEFAULT precision a Pallas `jnp.dot` of f32 operands is one bf16 pass: the
# compiler's static estimate is 1.07-1.31x the cycles of the same bf16 matmul (v5e, v6e; 512 and 1024 blocks)
# [libtpu]. inferred: DEFAULT-precision f32 peak ~ bf16 / 1.2.
_F32_DEFAULT_COST = 1.2
# Precision.HIGHEST emulates f32 with six bf16 passes; the compiler charges 3.0x (v6e) to 4.5x (v5e) the bf16
# cycles at 512 blocks, fixed costs included [libtpu]. inferred: true-f32 peak ~ bf16 / 6.
_F32_HIGHEST_PASSES = 6.0

# inferred: per-step pipeline overhead. FACTS measured ~0.35 us per grid step on real v5e (~525 cycles at
# 1.5 GHz); other TPUs are assumed to take the same number of cycles. (The compiler's estimate charges ~745
# cycles per 128^3 bf16 step on v5e and ~476 on v6e [libtpu].)
_STEP_CYCLES = 525.0
# Per iteration of a loop inside a grid step (emit_pipeline's inner steps; `ir/loops.py`): `Chip.
# inner_step_overhead_s` stays 0 on every TPU, i.e. inferred: the same as a grid step. A fit was tried and NOT adopted (issue 13): on the training half of tokamax 0.0.12's v5e
# megablox ragged-dot points (5 points, all steps inner; `bench/fidelity_fit.py`) the argmin of the median |error|
# was 3.25 x 525 cycles (training median 16.8% -> 2.0%, p90 26.6% -> 16.8%), but on the validation half (7 points)
# it made the median worse (7.4% -> 9.0%; p90 15.7% -> 15.2%; model/measured 0.93 -> 1.09), so the data do not
# support it.

# A vreg is 8 sublanes x 128 lanes of 32 bits on every TPU generation (the (8, 128) tiling of VMEM arrays; FACTS.md,
# the Pallas TPU docs): a block's minor dim is padded to LANES, stores of a narrower one are masked.
LANES = 128

# VPU: 8 sublanes x 128 lanes x 4 f32 ALU ops per cycle. [libtpu]: the marginal cost of an elementwise multiply
# chain is 4 vregs (of 8 x 128) per cycle in the compiler's model on both v5e and v6e. inferred: same elsewhere.
_VPU_OPS_PER_CYCLE = 8 * 128 * 4
# EUP: one vreg of transcendentals (exp, tanh, approximate reciprocal) per cycle: [libtpu] marginal cost of an
# `exp` chain is 1.02 cycles per vreg on v5e and 1.00 on v6e. inferred: same elsewhere.
_EUP_OPS_PER_CYCLE = 8 * 128


def _tpu(
    *,
    name: str,
    device_kind: str,
    topology: str,
    generation: int,
    peak_bf16_flops: float,
    peak_int8_ops: float,
    hbm_bytes: int,
    hbm_bw_bytes_s: float,
    vmem_bytes: int,
    default_scoped_vmem_bytes: int,
    tensorcores_per_chip: int,
    megacore: bool,
    mxu_shape: int,
    mxus_per_core: int,
    clock_hz: float,
    devices_per_chip: int = 1,
    vector_serial: float = 0.0,
    step_cycles: float = _STEP_CYCLES,
    compiler_step_excess_cycles: float = 0.0,
    hbm_efficiency: float = 1.0,
    overlap_p: float = math.inf,
    compiler_hbm_efficiency: float | None = None,
) -> Chip:
    return Chip(
        name=name,
        device_kind=device_kind,
        topology=topology,
        generation=generation,
        peak_bf16_flops=peak_bf16_flops,
        peak_int8_ops=peak_int8_ops,
        peak_f32_flops=peak_bf16_flops / _F32_DEFAULT_COST,
        peak_f32_highest_flops=peak_bf16_flops / _F32_HIGHEST_PASSES,
        hbm_bytes=hbm_bytes,
        hbm_bw_bytes_s=hbm_bw_bytes_s,
        vmem_bytes=vmem_bytes,
        default_scoped_vmem_bytes=default_scoped_vmem_bytes,
        tensorcores_per_chip=tensorcores_per_chip,
        megacore=megacore,
        mxu_shape=mxu_shape,
        mxus_per_core=mxus_per_core,
        clock_hz=clock_hz,
        step_overhead_s=step_cycles / clock_hz,
        vpu_flops=_VPU_OPS_PER_CYCLE * clock_hz * tensorcores_per_chip,
        eup_ops=_EUP_OPS_PER_CYCLE * clock_hz * tensorcores_per_chip,
        devices_per_chip=devices_per_chip,
        vector_serial=vector_serial,
        compiler_step_excess_s=compiler_step_excess_cycles / clock_hz,
        hbm_efficiency=hbm_efficiency,
        overlap_p=overlap_p,
        compiler_hbm_efficiency=compiler_hbm_efficiency,
        smem_bytes=1 * _MiB,  # [jax] smem_capacity_bytes = 1 MiB per core (v4 and later)
    )


V4 = _tpu(
    name="v4",
    device_kind="TPU v4",  # [jax] chip_version_from_device_kind; deviceless topology reports "TPU v4"
    # The deviceless v4 topology exposes one device per TensorCore (8 devices for 2x2x1, num_cores=1), so the
    # compiler tier models one core of a v4 chip (measured).
    topology="v4:2x2x1",
    generation=4,
    peak_bf16_flops=275e12,  # [gc-v4], [jax] 2.75e14 per chip
    peak_int8_ops=0.0,  # [jax] int8 "Not Available" (is_matmul_supported: int8 only as rhs of a bf16/f32 lhs)
    hbm_bytes=32 * _GiB,  # [gc-v4] 32 GiB; [jax] 34.4e9 bytes
    hbm_bw_bytes_s=1.2e12,  # [gc-v4] 1200 GB/s; [jax] 1.23e12
    vmem_bytes=16 * _MiB,  # [jax] 16 MiB per core
    default_scoped_vmem_bytes=16 * _MiB,  # measured: OOM message "Used 28.45M of 16.00M vmem" (whole VMEM)
    tensorcores_per_chip=2,  # [jax] ChipVersion table
    megacore=True,  # [jax] supports_megacore
    mxu_shape=128,  # [jax] MXU_COLUMN_SIZE_GEN_LT_6
    mxus_per_core=4,  # [jax] num_mxus=4
    # inferred: 275e12 / (2 cores x 4 MXUs x 128^2 x 2 flops) = 1.05 GHz (the TPU v4 paper gives 1050 MHz).
    clock_hz=1.05e9,
)

V5E = _tpu(
    name="v5e",
    device_kind="TPU v5 lite",  # measured: get_topology_desc("v5e:2x2").devices[0].device_kind
    topology="v5e:2x2",
    generation=5,
    peak_bf16_flops=197e12,  # [gc-v5e], [jax] 1.97e14
    peak_int8_ops=394e12,  # [jax] 3.94e14 ([gc-v5e] says 393 TOP/s)
    hbm_bytes=16 * 10**9,  # [gc-v5e] 16 GB; [jax] 17.2e9
    hbm_bw_bytes_s=819e9,  # [gc-v5e] 819 GB/s; [jax] 8.20e11
    vmem_bytes=128 * _MiB,  # [jax] 128 MiB per core
    default_scoped_vmem_bytes=16 * _MiB,  # [facts] measured: "Scoped allocation ... limit 16.00M"
    tensorcores_per_chip=1,  # [gc-v5e], [jax]
    megacore=False,
    mxu_shape=128,  # [jax]
    mxus_per_core=4,  # [gc-v5e] four MXUs per TensorCore; [jax] num_mxus=4
    # inferred: 197e12 / (4 MXUs x 128^2 x 2 flops) = 1.503 GHz. [libtpu]: a 2048^3 bf16 matmul with 1024 blocks
    # is estimated at 149,784 cycles vs 131,072 at 4 x 128^2 x 2 flops/cycle (87%), consistent.
    clock_hz=1.5e9,
    # fitted (issue 13): libtpu's static estimate charges ~749 cycles per 128^3 bf16 matmul grid step, the real v5e
    # ~525 (the tutorial's 8192^3 table). Fitted on the TRAINING half of the JAX matmul tutorial's v5e wall-clock
    # points (10 points, hash split per problem; `bench/fidelity_fit.py --compiler
    # bench/results/fidelity-tutorials-2026-12-02.json`, argmin of the median |error| over 0..800 by 5): 195 cycles.
    # Compiler tier, training: median |err| 27.1% -> 11.5% (p90 86.4% -> 86.6%, host-dispatch-bound 1024^3 points);
    # validation (9 points: 8 tutorial matmul + the sparse tutorial): 21.9% -> 17.9%, p90 51.4% -> 47.1%, config
    # pairs 4/4 either way. Adopted (it lowers the validation error). One kernel family (dense matmul) behind it:
    # flash attention's per-step excess (~1080 vs 525 cycles, docs/cost-model.md) is larger and not measured.
    compiler_step_excess_cycles=195.0,
    # fitted: a v5e delivers 0.70 of its 819 GB/s to the bench's kernels and to XLA's (bench/hw_bandwidth_fit.py,
    # bench/results/hw-v5e-2026-12-05/hbm-efficiency.json): the compiler tier as max(static schedule less the step
    # excess, HBM floor / eff) against 47 naive and best variants timed on a v5e; split before fitting by kernel name
    # (even positions train, 12 kernels / 24 points; odd validation, 12 / 23); eff = argmin of the training median
    # |log(tier / chip)| over 0.40..1.00. Validation: 0.157 at eff = 1 -> 0.081 at 0.70 (tier / chip median 0.92 ->
    # 0.96). The memory-bound kernels alone read 0.70-0.74 (fused_26/27/28/29, ours and XLA's). Kept for the roofline
    # model (its DMA time): validation 0.076 at 0.70, 0.079 at 0.79; on the 93 variants timed 2026-12-06 0.133 / 0.152.
    hbm_efficiency=0.70,
    # fitted: the compiler tier as (S^4 + (F / 0.79)^4)^(1/4) rather than max(S, F / 0.70) (bench/hw_bandwidth_fit.py,
    # `joint`, bench/results/hw-v5e-2026-12-06/overlap-fit.json): eff and p together on the same 24 training points
    # (the grid 0.40-1.00 x p in 2..16 or inf): training median |log(tier / chip)| 0.064 -> 0.045; validation (23
    # points) 0.081 -> 0.075; held out, 50 variants first timed on 2026-12-06 (the 2026-12-05-ec8273f run's recipes):
    # 0.101 -> 0.080, and of the 16 close pairs with a new variant in them (one kernel's, chip times 2-50% apart) it
    # orders 15 as the chip does, max 11 (fused_06/26/27/28: floor-bound near-ties at max that the static part breaks
    # the chip's way).
    overlap_p=4.0,
    compiler_hbm_efficiency=0.79,
)

V5P = _tpu(
    name="v5p",
    device_kind="TPU v5",  # measured: get_topology_desc("v5p:2x2x1") reports "TPU v5" with num_cores=2
    topology="v5p:2x2x1",
    generation=5,
    peak_bf16_flops=459e12,  # [gc-v5p], [jax] 4.59e14
    peak_int8_ops=918e12,  # [jax] 9.18e14
    hbm_bytes=95 * _GiB,  # [gc-v5p] 95 GiB; [jax] 103e9 bytes
    hbm_bw_bytes_s=2765e9,  # [gc-v5p] 2765 GB/s ([jax] says 2.46e12)
    vmem_bytes=64 * _MiB,  # [jax] 64 MiB per core; measured OOM: "Used 64.00M of 63.94M vmem"
    default_scoped_vmem_bytes=16 * _MiB,  # measured: "Scoped allocation with size 28.00M and limit 16.00M"
    tensorcores_per_chip=2,  # [gc-v5p], [jax]
    megacore=True,  # [jax] supports_megacore; the deviceless device has num_cores=2 (measured)
    mxu_shape=128,  # [jax]
    mxus_per_core=4,  # [gc-v5p] four MXUs per TensorCore
    # inferred: 459e12 / (2 cores x 4 MXUs x 128^2 x 2 flops) = 1.75 GHz. [libtpu]: the same 2048^3 bf16 matmul
    # comes out at 1.14x the whole chip's peak time at this clock, so the estimate models both cores (megacore).
    clock_hz=1.75e9,
)

V6E = _tpu(
    name="v6e",
    device_kind="TPU v6 lite",  # measured: get_topology_desc("v6e:2x2").devices[0].device_kind
    topology="v6e:2x2",
    generation=6,
    peak_bf16_flops=918e12,  # [gc-v6e], [jax] 9.20e14
    peak_int8_ops=1836e12,  # [gc-v6e], [jax] 1.84e15
    hbm_bytes=32 * 10**9,  # [gc-v6e] 32 GB; [jax] 34.4e9
    hbm_bw_bytes_s=1640e9,  # [gc-v6e] 1640 GB/s; [jax] 1.64e12
    vmem_bytes=128 * _MiB,  # [jax] 128 MiB per core
    default_scoped_vmem_bytes=32 * _MiB,  # measured: "Scoped allocation with size 64.00M and limit 32.00M"
    tensorcores_per_chip=1,  # [gc-v6e], [jax]
    megacore=False,
    mxu_shape=256,  # [jax] MXU_COLUMN_SIZE_GEN_GE_6
    mxus_per_core=2,  # [jax] num_mxus=2, [gc-v6e] "2 MXUs" (one revision of that page said 4)
    # inferred: 918e12 / (4 x 256^2 x 2 flops) = 1.75 GHz, i.e. the rate of 4 such MXUs. [libtpu]: a 2048^3 bf16
    # matmul with 1024 blocks is estimated at 45,967 cycles, below the 65,536 that 2 MXUs would need, and 71% of
    # the 4-MXU rate, so the compiler models >= 4 MXU-equivalents and 1.75 GHz matches the datasheet peak.
    clock_hz=1.75e9,
)

TPU7X = _tpu(
    name="tpu7x",
    device_kind="TPU7x",  # measured: get_topology_desc("tpu7x:2x2x1").devices[0].device_kind
    topology="tpu7x:2x2x1",
    generation=7,
    peak_bf16_flops=2307e12,  # [gc-7x], [jax] 2.31e15
    peak_int8_ops=4614e12,  # [gc-7x] fp8 4614 TFLOP/s; [jax] int8 "Not Available": this is the fp8 rate
    hbm_bytes=192 * _GiB,  # [gc-7x] 192 GiB; [jax] 206e9 bytes
    hbm_bw_bytes_s=7380e9,  # [gc-7x] 7380 GB/s; [jax] 7.40e12
    vmem_bytes=64 * _MiB,  # [jax] 64 MiB per core
    default_scoped_vmem_bytes=32 * _MiB,  # measured: "Scoped allocation with size 64.00M and limit 32.00M"
    tensorcores_per_chip=2,  # [gc-7x], [jax]
    megacore=False,  # [jax] no megacore: each TensorCore is its own JAX device
    mxu_shape=256,  # [jax]
    mxus_per_core=2,  # [jax] num_mxus=2
    # inferred: 2307e12 / (2 cores x 4 x 256^2 x 2 flops) = 2.2 GHz (same 4-MXU-rate assumption as v6e).
    clock_hz=2.2e9,
    devices_per_chip=2,  # measured: "tpu7x:2x2x1" has 8 devices for 4 chips
    # fitted (issue 13), both at once, on the TRAINING half of tokamax 0.0.12's tpu7x splash flash-attention points
    # (38 points; `python bench/fidelity_fit.py bench/results/fidelity-tokamax-train-2026-12-02.json`, a grid search
    # keeping the argmin of the median |error|): 2.5 x the assumed 525 cycles per grid step (0.60 us at 2.2 GHz)
    # and 0.1 of the smaller of MXU / VPU + EUP time not hidden under the larger. Training residual: median |error|
    # 12.3% -> 7.8%, p90 27.7% -> 30.4%; validation (38 other problems): see docs/cost-model.md.
    step_cycles=2.5 * _STEP_CYCLES,
    vector_serial=0.1,
)


def _gpu(*, name: str, device_kind: str, hbm_bytes: int, hbm_bw_bytes_s: float) -> Chip:
    sms = 132  # [nv-hop] H100/H200 SXM5
    clock = 1.98e9  # [nv-h100] max boost clock of H100 SXM (the fp32 peak 67 TF = 132 x 128 x 2 x 1.98 GHz)
    return Chip(
        name=name,
        device_kind=device_kind,
        topology="",
        generation=0,
        peak_bf16_flops=989e12,  # [nv-h100] 1979 TFLOP/s with 2:4 sparsity -> 989 dense
        peak_int8_ops=1979e12,  # [nv-h100] 3958 TOP/s with sparsity -> 1979 dense
        # [nv-h100] tf32 tensor cores: 989 TFLOP/s with sparsity -> 494 dense. XLA:GPU runs f32 dots at DEFAULT
        # precision as tf32; HIGHEST runs them on the CUDA cores at the fp32 peak, 67 TFLOP/s.
        peak_f32_flops=494e12,
        peak_f32_highest_flops=67e12,
        hbm_bytes=hbm_bytes,
        hbm_bw_bytes_s=hbm_bw_bytes_s,
        vmem_bytes=228 * 1024,  # [nv-hop] shared memory per SM
        default_scoped_vmem_bytes=227 * 1024,  # [nv-hop] max shared memory per thread block
        tensorcores_per_chip=sms,
        megacore=False,
        mxu_shape=0,
        mxus_per_core=4,  # [nv-hop] 4 tensor cores per SM
        clock_hz=clock,
        # inferred: grid blocks run concurrently over the SMs, so there is no sequential per-step pipeline cost.
        step_overhead_s=0.0,
        vpu_flops=67e12,  # [nv-h100] fp32 non-tensor peak (FMA counted as 2)
        # inferred: 16 SFU results per SM per clock (Hopper SM: 4 partitions x 4 SFUs) x 132 SMs x 1.98 GHz.
        eup_ops=16 * sms * clock,
        is_gpu=True,
    )


H100 = _gpu(name="h100", device_kind="NVIDIA H100 80GB HBM3", hbm_bytes=80 * 10**9, hbm_bw_bytes_s=3.35e12)
H200 = _gpu(name="h200", device_kind="NVIDIA H200", hbm_bytes=141 * 10**9, hbm_bw_bytes_s=4.8e12)

CHIPS: Mapping[str, Chip] = MappingProxyType({c.name: c for c in (V4, V5E, V5P, V6E, TPU7X, H100, H200)})


def get_chip(name: str) -> Chip:
    """The chip called `name` (case-insensitive; "v7x"/"ironwood" mean "tpu7x"); `UnknownTarget` otherwise."""
    key = name.strip().lower()
    key = {"v7x": "tpu7x", "7x": "tpu7x", "ironwood": "tpu7x", "trillium": "v6e"}.get(key, key)
    try:
        return CHIPS[key]
    except KeyError:
        raise UnknownTarget(f"unknown target {name!r} (known: {', '.join(CHIPS)})") from None
