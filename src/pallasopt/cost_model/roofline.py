"""The roofline cost model: time, bound, traffic and VMEM of each pallas_call on a chip, from the traced facts.

Rules modelled (see docs/cost-model.md):
- HBM traffic follows the Pallas pipeline: a block is fetched only when its block index changes between consecutive
  grid steps (last grid axis fastest); an output block is written back when its index changes and at the end.
- Per-step work from the kernel jaxpr: matmuls on the MXU (dims padded to the MXU / native tile), elementwise and
  reductions on the VPU, transcendentals on the EUP; a fixed per-step pipeline overhead.
- time = steps x max(DMA per step, compute per step + overhead) + prologue (first fetch) + epilogue (last write);
  "parallel" axes split over 2 TensorCores on megacore chips (compute halves, HBM bandwidth is shared).
- VMEM = sum over blocked operands of buffers x block bytes padded to the native tile, plus scratch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir.facts import CallFacts, Dot, Operand, dtype_bytes, plain
from .hardware import Chip
from .per_step import evaluated_compute, evaluated_fetches

MAX_ENUMERATED_STEPS = 50_000  # non-affine index maps are evaluated step by step up to this grid size
VMEM_MARGIN = 0.9  # fraction of the scoped limit the model lets a candidate use (compiler internal scratch)


def _pad(n: int, m: int) -> int:
    return -(-n // m) * m if m > 0 else n


@dataclass(frozen=True)
class Traffic:
    """HBM traffic of one operand over the whole grid."""

    operand: str
    fetches: int  # block transfers (fetches for inputs, write-backs for outputs)
    bytes: int
    method: (
        str  # "closed-form" | "enumerated" | "data" (evaluated on the prefetch tables) | "structural" | "manual-dma"
        # | "simulated" (the DMAs of a hand-pipelined body, counted by running its scalar part: ir/loops.py)
        # | "waited" (the copies the body's top-level `dma_wait`s receive, every step)
    )


@dataclass(frozen=True)
class CallEstimate:
    """The model's view of one pallas_call on one chip."""

    call: int
    chip: str
    time_s: float
    bound: str  # "compute" | "memory" | "step-overhead" | "illegal"
    steps: int
    flops: int
    bytes: int
    mxu_s: float
    vpu_s: float
    eup_s: float
    dma_s: float
    overhead_s: float
    edge_s: float  # prologue + epilogue
    vmem_bytes: int
    vmem_limit_bytes: int
    fits_vmem: bool
    legal: bool
    problems: tuple[str, ...]
    traffic: tuple[Traffic, ...]
    megacore_split: bool
    utilization: float  # achieved FLOP/s over the chip's peak for these dtypes
    notes: tuple[str, ...] = field(default=())
    # Manual DMA: copies in flight per stream (1 = started and waited on at once) and the time the copies' latency
    # bounds the body to (`manual_dma_time`), 0 without manual DMA.
    dma_depth: int = 0
    dma_latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.legal and self.fits_vmem

    def to_dict(self) -> dict[str, Any]:
        out = plain(self)
        assert isinstance(out, dict)
        return out


@dataclass(frozen=True)
class Estimate:
    """The model's view of a whole kernel module: the sum over its pallas_calls."""

    chip: str
    calls: tuple[CallEstimate, ...]

    @property
    def time_s(self) -> float:
        return sum(c.time_s for c in self.calls)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.calls)

    @property
    def problems(self) -> tuple[str, ...]:
        return tuple(f"call {c.call}: {p}" for c in self.calls for p in c.problems)

    def to_dict(self) -> dict[str, Any]:
        return {"chip": self.chip, "time_s": self.time_s, "ok": self.ok, "calls": [c.to_dict() for c in self.calls]}


def block_fetches(
    op: Operand, grid: Sequence[int], order: Sequence[int] | None = None, prefetch: Sequence[Any] | None = None
) -> tuple[int, str]:
    """How many times the pipeline transfers this operand's block over the grid (in `order`, outermost first).
    A non-affine map is evaluated at every step ("enumerated"; "data" when it reads the scalar-prefetch tables
    `prefetch`); without the tables a data-dependent map counts a fetch whenever an axis it depends on moves."""
    axes = list(order) if order is not None else list(range(len(grid)))
    steps = math.prod(grid) if grid else 1
    im = op.index_map
    evaluated = evaluated_fetches(op, grid, order, prefetch)
    if evaluated is not None:
        return evaluated
    if im.affine is None and im.fn is not None and not im.data_dependent and steps <= MAX_ENUMERATED_STEPS:
        return _enumerate_fetches(op, grid, axes), "enumerated"
    moving = {a for a in im.axes if grid[a] > 1}
    if not moving:
        return 1, "closed-form"
    innermost = max(axes.index(a) for a in moving)
    fetches = math.prod(grid[a] for a in axes[: innermost + 1])
    return fetches, "closed-form" if im.affine is not None else "structural"


def _enumerate_fetches(op: Operand, grid: Sequence[int], axes: Sequence[int]) -> int:
    import itertools

    last: tuple[int, ...] | None = None
    count = 0
    for combo in itertools.product(*(range(grid[a]) for a in axes)):
        idx = [0] * len(grid)
        for a, v in zip(axes, combo, strict=True):
            idx[a] = v
        block = op.index_map.block_index(idx)
        if block != last:
            count += 1
            last = block
    return count


def _padded_bytes(shape: Sequence[int], dtype: str, chip: Chip) -> int:
    """Bytes of a VMEM buffer: lanes padded to 128, rows to a multiple of 8 whatever the dtype, and a one-row
    buffer taking a whole 32-bit row (measured with libtpu: see docs/cost-model.md, fidelity findings 3)."""
    dims = list(shape) or [1]
    itemsize = dtype_bytes(dtype)
    if chip.is_gpu:
        return math.prod(dims) * itemsize
    dims[-1] = _pad(dims[-1], 128)
    if len(dims) >= 2:
        if dims[-2] == 1:
            itemsize = max(itemsize, 4)
        else:
            dims[-2] = _pad(dims[-2], 8)
    return math.prod(dims) * itemsize


def padded_block_bytes(op: Operand, chip: Chip) -> int:
    """Block bytes as VMEM holds them (see `_padded_bytes`)."""
    return _padded_bytes([1 if b is None else b for b in op.block_shape], op.dtype, chip)


_LHS_COPY_MIN_BYTES = 512 * 1024  # smaller packed lhs blocks took no extra VMEM (lhs_copy_bytes)


def lhs_copy_bytes(call: CallFacts, chip: Chip) -> int:
    """VMEM the compiler adds for a dot whose lhs is a packed (< 32-bit) input block: the padded bytes of the
    largest such block, counted once however many dots read it.

    Measured with libtpu 0.0.42.1 on v5e (docs/cost-model.md, "Packed dot operands"): a bf16 (tm, tk) lhs block adds
    about its own bytes of scoped VMEM (llm_swiglu_mlp's gate/up call at (1024, 512, 1024): 16.36 MiB against
    14.0 modelled), the same with one dot, two dots sharing the loaded value, or two separate loads; an f32 lhs
    adds nothing measurable, nor does the rhs block. Blocks under 512 KiB added nothing (swiglu at 128^3 and
    (256, 512, 256), fused_06's (128, 1024) lhs), so they are not charged. A lhs computed in the body (attention's
    `p @ v`) is not charged: flash attention's figures fit without it. The lhs is recognised as an input block by
    shape and dtype (the dot's (m, k) equal to the block's two minor dims), which the tile pass's predicted facts
    keep in step (its dots and blocks are retiled together)."""
    if chip.is_gpu:
        return 0
    blocks: dict[tuple[tuple[int, int], str], int] = {}
    for op in call.inputs:
        dims = [b for b in op.block_shape if b is not None]
        if op.is_pipelined and len(dims) >= 2 and dtype_bytes(op.dtype) < 4:
            key = ((dims[-2], dims[-1]), op.dtype)
            blocks[key] = max(blocks.get(key, 0), padded_block_bytes(op, chip))
    charged = (blocks.get(((d.m, d.k), d.lhs_dtype), 0) for d in call.body.dots)
    return max((b for b in charged if b >= _LHS_COPY_MIN_BYTES), default=0)


def vmem_footprint(call: CallFacts, chip: Chip) -> int:
    """Sum of buffers x padded block bytes over pipelined operands, plus VMEM scratch."""
    total = 0
    for op in call.operands:
        if op.is_pipelined:
            # A block fetched once (one-step grid, or an index that never changes) has nothing to prefetch: the
            # compiler keeps a single buffer (measured with libtpu).
            once = call.steps == 1 or block_fetches(op, call.grid, prefetch=call.prefetch)[0] == 1
            buffers = 1 if once else (op.buffer_count or 2)
            total += buffers * padded_block_bytes(op, chip)
    # The compiler allocates one copy of the largest value a reduction consumes (softmax rows, attention scores).
    total += call.body.max_reduced_bytes
    total += lhs_copy_bytes(call, chip)
    for s in (*call.scratch, *call.scoped):  # scoped: buffers the body allocates (an emit_pipeline's blocks)
        if s.memory_space in ("vmem", "default"):
            total += _padded_bytes(s.shape, s.dtype, chip)
    return total


def legality_problems(call: CallFacts, chip: Chip) -> list[str]:
    """Block-shape and buffering rules the Mosaic TPU lowering enforces (jax 0.10.x)."""
    if chip.is_gpu:
        return []
    problems: list[str] = []
    for op in call.operands:
        if not op.is_pipelined:
            continue
        shape, block = op.shape, op.block_shape
        if op.buffer_count is not None and op.buffer_count not in (1, 2):
            problems.append(
                f"{op.name}: pl.Buffered({op.buffer_count}) in a grid BlockSpec (only 1 or 2 are supported; "
                "deeper buffering needs pltpu.emit_pipeline)"
            )
        for d, b in enumerate(block):
            # A tile-aligned block over a smaller minor dim is padded in VMEM and compiles (JAX's paged attention
            # writes 128-lane blocks of a (..., 1) array; libtpu accepts it): only other oversized dims are refused.
            aligned = (d == len(block) - 1 and b is not None and b % 128 == 0) or (
                d == len(block) - 2 and b is not None and b % 8 == 0
            )
            if b is not None and b > shape[d] and not aligned:
                problems.append(f"{op.name}: block dim {d} ({b}) exceeds the array dim ({shape[d]})")
        if not block:
            continue
        last, full_last = block[-1], shape[-1]
        if last is not None and last != full_last and last % 128:
            problems.append(
                f"{op.name}: last block dim {last} is neither a multiple of 128 nor the full dim {full_last}"
            )
        if len(block) >= 2:
            sec, full_sec = block[-2], shape[-2]
            if sec is not None and sec != full_sec and sec % 8:
                problems.append(
                    f"{op.name}: second-to-last block dim {sec} is neither a multiple of 8 nor the full dim {full_sec}"
                )
    return problems


def step_compute(mxu_s: float, vector_s: float, chip: Chip) -> float:
    """A grid step's compute: the larger of MXU and VPU + EUP time, plus the part of the smaller one that does not
    hide under it (`Chip.vector_serial`, fitted per chip where measurements exist: hardware.py)."""
    return max(mxu_s, vector_s) + chip.vector_serial * min(mxu_s, vector_s)


def _mxu_seconds(call: CallFacts, chip: Chip) -> float:
    return dots_seconds(call.body.dots, chip)


def dots_seconds(dots: Sequence[Dot], chip: Chip) -> float:
    """MXU seconds of these matmuls (dims padded to the MXU and the native tile)."""
    total = 0.0
    align = chip.mxu_shape or 1
    for d in dots:
        sub = 8 if chip.is_gpu else chip.native_tile(d.lhs_dtype)[0]
        m, n, k = _pad(d.m, sub), _pad(d.n, align), _pad(d.k, align)
        widest = d.lhs_dtype if dtype_bytes(d.lhs_dtype) >= dtype_bytes(d.rhs_dtype) else d.rhs_dtype
        total += 2 * d.batch * m * n * k * d.count / chip.device_peak_flops(widest)
    return total


def _lane_padding(call: CallFacts) -> float:
    """VPU work runs on whole 8x128 vregs: a block whose last dim is narrow wastes lanes."""
    blocks = [o for o in call.operands if o.is_pipelined and o.block_shape]
    if not blocks:
        return 1.0
    widest = max(blocks, key=lambda o: o.block_elems)
    last = widest.block_shape[-1] or 1
    return _pad(last, 128) / last


def _megacore_split(call: CallFacts, chip: Chip) -> bool:
    if not chip.megacore or not call.dimension_semantics:
        return False
    return any(
        s in ("parallel", "core_parallel") and call.grid[a] >= 2
        for a, s in enumerate(call.dimension_semantics)
        if a < len(call.grid)
    )


def manual_dma_depth(call: CallFacts) -> int:
    """Slots of a manual-DMA ring: 1 when a copy is started and waited on at once; else the length of the DMA
    semaphore array the kernel's scratch or scoped allocations hold (one semaphore per slot, as `multi-buffer` and
    `dma-overlap` write it, and `pltpu.emit_pipeline` allocates a `pl.Buffered(n)` input's); 2 (one copy ahead)
    when the semaphores are scalars but the copies overlap the compute."""
    if call.body.dma_serialized:
        return 1
    slots = [s.shape[0] for s in (*call.scratch, *call.scoped) if s.dtype == "dma_sem" and len(s.shape) == 1]
    return max(slots, default=2)


def manual_dma_rounds(call: CallFacts, manual_bytes: float) -> int:
    """How many rounds of manual copies the grid makes: one per step, or fewer where the copies move less than a
    step's worth each time (a copy under `pl.when` that fetches a whole image once per 14 row steps: 32 rounds over
    448 steps, the manual bytes over the largest copy)."""
    copy = call.body.dma_copy_bytes
    if copy <= 0:
        return call.steps
    return max(1, min(call.steps, math.ceil(manual_bytes / copy)))


def manual_dma_time(steps: int, step_bytes: float, depth: int, chip: Chip) -> float:
    """Time the manual copies bound a grid's steps to: each copy takes `chip.dma_latency_s` + bytes / bandwidth
    from start to arrival. With a ring of `depth` slots, depth - 1 copies are in flight while a step computes, so
    the copies sustain one step per (latency + transfer) / (depth - 1) (Little's law); serialized (depth 1), every
    step waits the whole copy (the caller adds the compute). `steps`: the rounds of copies (`manual_dma_rounds`)."""
    one = chip.dma_latency_s + step_bytes / chip.delivered_hbm_bw_bytes_s
    return steps * one / max(depth - 1, 1)


def estimate_call(call: CallFacts, chip: Chip, order: Sequence[int] | None = None) -> CallEstimate:
    """The roofline estimate of one pallas_call (grid visited in `order`, default as written)."""
    steps = call.steps
    problems = legality_problems(call, chip)
    traffic: list[Traffic] = []
    notes: list[str] = []
    first_bytes = 0
    last_bytes = 0
    simulated = call.body.dma_bytes > 0  # the body's DMAs were counted by simulating it (ir/loops.py)
    if simulated:
        traffic.append(Traffic("manual-dma", 1, call.body.dma_bytes * steps, "simulated"))
        notes.append(call.body.loop_note)
    elif call.body.loop_note:
        notes.append(call.body.loop_note)
    waited = not simulated and call.body.dma_step_bytes > 0  # copies the body waits on every step, counted
    if waited:
        traffic.append(Traffic("manual-dma", 1, call.body.dma_step_bytes * steps, "waited"))
    for op in call.operands:
        if not op.is_pipelined:
            if op.memory_space in ("any", "hbm") and not simulated and not waited:
                traffic.append(Traffic(op.name, 1, op.array_bytes, "manual-dma"))
                notes.append(f"{op.name} is copied by hand (memory_space=ANY): counted as one pass over the array")
            continue
        fetches, method = block_fetches(op, call.grid, order, call.prefetch)
        traffic.append(Traffic(op.name, fetches, fetches * op.block_bytes, method))
        if op.role == "in":
            first_bytes += op.block_bytes
        else:
            last_bytes += op.block_bytes
    total_bytes = sum(t.bytes for t in traffic)
    bw = chip.delivered_hbm_bw_bytes_s
    mxu = _mxu_seconds(call, chip)
    lane = _lane_padding(call)
    vpu_rate, eup_rate = chip.vpu_flops / chip.devices_per_chip, chip.eup_ops / chip.devices_per_chip
    vpu = call.body.vpu_elems * lane / vpu_rate
    eup = call.body.transcendental_elems * lane / eup_rate
    compute_step = step_compute(mxu, vpu + eup, chip)
    split = _megacore_split(call, chip)
    cores = 2 if split else 1
    # A loop inside a step (emit_pipeline's inner steps) pays a fixed cost per iteration too (`Chip.
    # inner_step_overhead_s`: each issues and waits on its DMAs and updates its block indices like a grid step).
    inner_s = chip.inner_step_overhead_s or chip.step_overhead_s
    overhead_total = steps * (chip.step_overhead_s + call.body.inner_steps * inner_s) / cores
    compute_total = steps * compute_step / cores
    mxu_total, vpu_total, eup_total = mxu * steps / cores, vpu * steps / cores, eup * steps / cores
    per_step = evaluated_compute(
        call,
        order,
        (mxu, vpu, eup),
        chip.vector_serial,
        lambda dots: dots_seconds(dots, chip),
        lambda elems: elems * lane / vpu_rate,
        lambda elems: elems * lane / eup_rate,
    )
    if per_step is not None:
        compute_total = per_step.compute_s / cores
        mxu_total, vpu_total, eup_total = per_step.mxu_s / cores, per_step.vpu_s / cores, per_step.eup_s / cores
        taken = ", ".join("/".join(f"{f:.2f}" for f in fr) for fr in per_step.fractions)
        notes.append(f"pl.when branches evaluated per grid step (fraction of steps per branch: {taken})")
    if call.prefetch_note and any(o.index_map.data_dependent for o in call.operands):
        notes.append(call.prefetch_note)
    dma_total = total_bytes / bw
    edge = (first_bytes + last_bytes) / bw
    body_time = max(dma_total, compute_total + overhead_total)
    manual_bytes = sum(t.bytes for t in traffic if "manual-dma" in (t.method, t.operand))
    depth = manual_dma_depth(call) if call.body.has_dma else 0
    rounds = manual_dma_rounds(call, manual_bytes)
    latency_total = manual_dma_time(rounds, manual_bytes / rounds, depth, chip) if depth else 0.0
    if depth == 1:  # each transfer waits before any compute starts: nothing overlaps
        body_time = dma_total - manual_bytes / bw + latency_total + compute_total + overhead_total
        notes.append(
            "manual DMA is started and waited on at once: transfers do not overlap compute (dma-overlap, multi-buffer)"
        )
    elif depth:
        body_time = max(body_time, latency_total)
        notes.append(
            f"manual DMA in a {depth}-slot ring: {depth - 1} copies in flight hide their latency "
            f"({chip.dma_latency_s * 1e6:.1f} us each, assumed) down to {latency_total * 1e3:.3f} ms"
        )
    time_s = body_time + edge
    if max(dma_total, latency_total) >= compute_total + overhead_total:
        bound = "memory"
    elif overhead_total > compute_total:
        bound = "step-overhead"
    else:
        bound = "compute"
    vmem = vmem_footprint(call, chip)
    limit = call.vmem_limit_bytes or chip.default_scoped_vmem_bytes
    fits = vmem <= limit * VMEM_MARGIN if call.vmem_limit_bytes is None else vmem <= limit
    if not fits:
        problems.append(
            f"VMEM footprint {vmem / 2**20:.1f} MiB exceeds the scoped limit {limit / 2**20:.0f} MiB"
            + (" (raise vmem_limit_bytes)" if vmem <= chip.vmem_bytes * VMEM_MARGIN else " and the chip's VMEM")
        )
    if limit > chip.vmem_bytes:
        problems.append(
            f"vmem_limit_bytes {limit / 2**20:.0f} MiB exceeds the chip's VMEM {chip.vmem_bytes / 2**20:.0f} MiB"
        )
        fits = False
    flops = call.flops
    dtypes = [d.lhs_dtype for d in call.body.dots] or ["bfloat16"]
    peak = chip.device_peak_flops(dtypes[0])
    util = flops / (time_s * peak) if time_s > 0 and peak > 0 else 0.0
    return CallEstimate(
        call=call.index,
        chip=chip.name,
        time_s=time_s,
        bound=bound if not problems else ("illegal" if legality_problems(call, chip) else bound),
        steps=steps,
        flops=flops,
        bytes=total_bytes,
        mxu_s=mxu_total,
        vpu_s=vpu_total,
        eup_s=eup_total,
        dma_s=dma_total,
        overhead_s=overhead_total,
        edge_s=edge,
        vmem_bytes=vmem,
        vmem_limit_bytes=limit,
        fits_vmem=fits,
        legal=not legality_problems(call, chip),
        problems=tuple(problems),
        traffic=tuple(traffic),
        megacore_split=split,
        utilization=util,
        notes=tuple(notes),
        dma_depth=depth,
        dma_latency_s=latency_total,
    )


def estimate_calls(calls: Sequence[CallFacts], chip: Chip) -> Estimate:
    return Estimate(chip=chip.name, calls=tuple(estimate_call(c, chip) for c in calls))


def _bandwidth(chip: Chip) -> str:
    """The HBM bandwidth the model charges, in words ("573 GB/s (0.70 of 819)" where the chip's is fitted)."""
    delivered = f"{chip.delivered_hbm_bw_bytes_s / 1e9:.0f} GB/s"
    if chip.hbm_efficiency == 1.0:
        return delivered
    return f"{delivered} ({chip.hbm_efficiency:.2f} of {chip.device_hbm_bw_bytes_s / 1e9:.0f})"


def explain(e: CallEstimate, chip: Chip) -> str:
    """One paragraph an engineer can check: what bounds the call and why."""
    ms = 1e3
    parts = [
        f"{e.steps} grid steps; est. {e.time_s * ms:.3f} ms ({e.bound}-bound) on {chip.name}.",
        f"HBM traffic {e.bytes / 2**20:.1f} MiB -> {e.dma_s * ms:.3f} ms at {_bandwidth(chip)};",
        f"MXU {e.mxu_s * ms:.3f} ms, VPU {e.vpu_s * ms:.3f} ms, EUP {e.eup_s * ms:.3f} ms;",
        f"step overhead {e.overhead_s * ms:.3f} ms ({chip.step_overhead_s * 1e6:.2f} us x {e.steps}).",
        f"VMEM {e.vmem_bytes / 2**20:.2f} of {e.vmem_limit_bytes / 2**20:.0f} MiB.",
    ]
    refetch = [t for t in e.traffic if t.fetches > 1 and t.bytes > 0]
    if refetch:
        worst = max(refetch, key=lambda t: t.bytes)
        parts.append(
            f"Largest traffic: {worst.operand}, {worst.fetches} block transfers ({worst.bytes / 2**20:.1f} MiB)."
        )
    if e.bound == "step-overhead":
        parts.append("Blocks are small: per-step overhead dominates; bigger blocks would amortize it.")
    elif e.bound == "memory" and e.flops:
        parts.append(f"Arithmetic intensity {e.flops / max(e.bytes, 1):.1f} flop/byte is below the chip's ridge point.")
    if e.utilization:
        parts.append(f"MXU utilization {100 * e.utilization:.1f}% of peak.")
    return " ".join(parts + list(e.notes) + list(e.problems))
