"""The menu of rewrite strategies the LLM pass may be asked to carry out, written by us.

Each strategy says what to try, when it helps, and `applies(ir)`: a predicate over the traced facts (and, for the
wrapper, the source) that decides whether it is worth a request. Predicates may over-approximate: the model, the
validator and the oracle have the last word.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from ..cost_model.hardware import LANES
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..pyparse import parse_module

REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin"})
VMEM_PRESSURE_BYTES = 8 * 2**20  # half of v5e's 16 MiB default scoped VMEM
WHOLE_AXIS_MIN = 1024  # a block holding a whole axis at least this long is worth blocking (attention's KV length)
_EPILOGUE_OPS = frozenset(
    {
        "maximum",
        "minimum",
        "tanh",
        "exp",
        "log",
        "where",
        "clip",
        "relu",
        "gelu",
        "silu",
        "swish",
        "sigmoid",
        "softmax",
        "log_softmax",
        "logsumexp",
        "mean",
        "sum",
        "max",
        "min",
        "var",
        "rsqrt",
        "sqrt",
        "astype",
        "add",
        "multiply",
        "transpose",
    }
)


@dataclass(frozen=True)
class Strategy:
    """One entry of the menu: `what` to try, `when` it helps, and what `requires` says `applies` checks."""

    name: str
    what: str
    when: str
    requires: str
    applies: Callable[[KernelIR], bool]


def _prims(c: CallFacts) -> frozenset[str]:
    return frozenset(c.body.primitives)


def _whole_row_block(c: CallFacts) -> bool:
    """Some blocked input holds its array's entire last (or a whole) axis: a reduction can see a full row."""
    for o in c.inputs:
        if not o.is_pipelined or not o.shape:
            continue
        if any(b is not None and b == s and s > 1 for b, s in zip(o.block_shape, o.shape, strict=False)):
            return True
    return False


def _online_softmax(ir: KernelIR) -> bool:
    return any("exp" in _prims(c) and _prims(c) & REDUCTIONS and _whole_row_block(c) for c in ir.calls)


def _wrapper_ops(ir: KernelIR) -> int:
    """How many jnp / jax.nn / lax calls or `.astype` the entry itself makes outside its pallas_call arguments."""
    try:
        tree = parse_module(ir.source)
    except SyntaxError:
        return 0
    entry = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == ir.entry), None)
    if entry is None:
        return 0
    count = 0
    for node in ast.walk(entry):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _EPILOGUE_OPS:
            base = ast.unparse(node.func.value)
            if base.split(".")[0] in ("jnp", "jax", "lax", "np") or node.func.attr == "astype":
                count += 1
    return count


def _fuse_epilogue(ir: KernelIR) -> bool:
    return len(ir.calls) >= 2 or _wrapper_ops(ir) > 0


def _mxu_reduction(ir: KernelIR) -> bool:
    return any("reduce_sum" in _prims(c) and not c.body.dots and c.body.vpu_elems > 0 for c in ir.calls)


def _hoist_invariant(ir: KernelIR) -> bool:
    """A blocked input whose block never changes over a grid of several steps (weights, scales, biases)."""
    return any(
        c.steps > 1 and any(o.is_pipelined and not o.index_map.axes for o in c.inputs) and c.body.vpu_elems > 0
        for c in ir.calls
    )


def _block_vmem(c: CallFacts) -> int:
    pipelined = sum(o.block_bytes * (o.buffer_count or 2) for o in c.operands if o.is_pipelined)
    return pipelined + sum(s.bytes for s in c.scratch)


def _split_kernel(ir: KernelIR) -> bool:
    return any((c.body.dots and _prims(c) & REDUCTIONS) or _block_vmem(c) > VMEM_PRESSURE_BYTES for c in ir.calls)


def _merge_kernels(ir: KernelIR) -> bool:
    return len(ir.calls) >= 2


def _attention_blocking(ir: KernelIR) -> bool:
    for c in ir.calls:
        if len(c.body.dots) >= 2 and "exp" in _prims(c):
            for o in c.inputs:
                if any(
                    b is not None and b == s and s >= WHOLE_AXIS_MIN
                    for b, s in zip(o.block_shape, o.shape, strict=False)
                ):
                    return True
    return False


def _accumulate_f32_scratch(ir: KernelIR) -> bool:
    return any(
        c.revisited_axes() and c.body.dots and not any(s.dtype == "float32" for s in c.scratch) for c in ir.calls
    )


def _lane_dense(ir: KernelIR) -> bool:
    for c in ir.calls:
        for o in c.operands:
            if not o.is_pipelined or not o.block_shape:
                continue
            last = o.block_shape[-1]
            if last is None or (last % LANES and not (last == o.shape[-1] and o.shape[-1] >= LANES)):
                return True
    return False


STRATEGIES: tuple[Strategy, ...] = (
    Strategy(
        name="online-softmax",
        what=(
            "Compute the normalizer of exp(x - max) in one streaming pass: keep a running max m and a running sum "
            "s per row, and for each chunk of columns (a multiple of 128 lanes) update m_new = max(m, max(chunk)), "
            "s = s * exp(m - m_new) + sum(exp(chunk - m_new)). Then normalize (or, for attention, rescale the output "
            "accumulator by exp(m - m_new) and divide by s at the end). Keep m and s in f32."
        ),
        when=(
            "The kernel holds a full row in VMEM and makes separate passes for max, exp-sum and normalize, or "
            "materializes exp(x - max) for the whole row. Streaming the row in lane-aligned chunks cuts VMEM and "
            "vreg pressure and lets the row (or KV) axis be tiled later."
        ),
        requires="an exp and a reduction in the body over a block that spans a whole axis",
        applies=_online_softmax,
    ),
    Strategy(
        name="fuse-epilogue",
        what=(
            "Move the elementwise work done after the pallas_call (bias, activation, scale, residual add, cast, "
            "a following small pallas_call) into the kernel, applied to the output block just before it is stored "
            "(for a reduction grid: only on the last reduction step, from the f32 accumulator)."
        ),
        when=(
            "The entry post-processes the kernel's output with jnp/jax.nn ops or a second kernel: each of those "
            "reads and writes the whole output from HBM again. Fusing removes that round trip (memory-bound ops "
            "become free inside a compute-bound kernel)."
        ),
        requires="jnp/jax.nn/lax ops in the entry outside the pallas_call, or two or more pallas_calls",
        applies=_fuse_epilogue,
    ),
    Strategy(
        name="mxu-reduction",
        what=(
            "Do large sums on the MXU: replace jnp.sum(x, axis=-1) over a (rows, cols) block by "
            "jnp.dot(x, ones((cols, 128)), preferred_element_type=f32)[:, :1] (or a row of ones on the left for "
            "a column sum). Keep bf16 inputs in bf16 for the dot; accumulate in f32."
        ),
        when=(
            "The kernel is VPU-bound on cross-lane reductions (sum of squares in a norm, a mean, a softmax "
            "denominator) and the MXU is idle. Not worth it for tiny blocks or when the body already uses the MXU."
        ),
        requires="a reduce_sum in a body with no matmul",
        applies=_mxu_reduction,
    ),
    Strategy(
        name="hoist-invariant",
        what=(
            "Move work that does not change across grid steps out of the per-step body: casts or scaling of a "
            "weight/bias block whose index map is constant, constants built with jnp.full/iota, reciprocals of "
            "fixed sizes. Do it once in the wrapper (before pallas_call) or once under pl.when(program_id == 0) "
            "into a VMEM scratch buffer (only on axes marked 'arbitrary')."
        ),
        when=(
            "An input block never changes over the grid (e.g. a (1, D) weight) yet the body converts or "
            "transforms it every step; or per-step constants are rebuilt each step."
        ),
        requires="a blocked input whose index map is constant over a grid of several steps",
        applies=_hoist_invariant,
    ),
    Strategy(
        name="split-kernel",
        what=(
            "Split the pallas_call into two: e.g. a matmul kernel that writes an f32 (or bf16) intermediate and a "
            "second kernel for the row-wise reduction/normalization, each with its own block shapes; or two passes "
            "(statistics, then apply) when one pass needs more VMEM than fits."
        ),
        when=(
            "One kernel does two phases that want different tiling (a matmul wants square tiles, a row norm wants "
            "full rows) or its blocks overflow VMEM. Costs an extra HBM round trip of the intermediate."
        ),
        requires="a matmul and a reduction in one body, or blocks over 8 MiB of VMEM",
        applies=_split_kernel,
    ),
    Strategy(
        name="merge-kernels",
        what=(
            "Merge consecutive pallas_calls into one kernel that keeps the intermediate in VMEM (e.g. produce a "
            "block and consume it in the same grid step), so the intermediate never goes to HBM."
        ),
        when=(
            "The module runs two or more pallas_calls where one's output feeds the next with compatible tiling. "
            "Saves the write and re-read of the intermediate and one launch."
        ),
        requires="two or more pallas_calls",
        applies=_merge_kernels,
    ),
    Strategy(
        name="attention-blocking",
        what=(
            "Flash-attention blocking: add a grid axis over the key/value sequence (last, 'arbitrary'), load K and "
            "V in blocks of 128-512 rows, and keep per-row running max m, sum l and an f32 output accumulator in "
            "VMEM scratch (pltpu.VMEM), rescaled by exp(m_old - m_new) each step; write acc / l on the last step. "
            "Use jax.lax.dot_general with contracting dims to avoid explicit transposes."
        ),
        when=(
            "Scores for a query block are computed against the whole K/V sequence at once: VMEM and the "
            "(q_block, seq) score matrix grow with the sequence length, and K/V are not pipelined."
        ),
        requires="two matmuls and an exp in the body with a K/V block spanning a whole axis of length >= 1024",
        applies=_attention_blocking,
    ),
    Strategy(
        name="accumulate-f32-scratch",
        what=(
            "Accumulate over the reduction grid axis in an f32 VMEM scratch (scratch_shapes=[pltpu.VMEM((bm, bn), "
            "jnp.float32)]): zero it under pl.when(program_id(k) == 0), add each step's dot with "
            "preferred_element_type=jnp.float32, and cast/store to the output block only under "
            "pl.when(program_id(k) == num_programs(k) - 1). Mark the reduction axis 'arbitrary' and the others "
            "'parallel' in pltpu.CompilerParams(dimension_semantics=...)."
        ),
        when=(
            "The kernel accumulates straight into its output block across a reduction axis: with a bf16 output it "
            "loses precision and re-casts every step; with an f32 output it still reads and writes the output "
            "block each step. Also enables a fused epilogue on the last step."
        ),
        requires="a matmul accumulated over a reduction grid axis without an f32 scratch",
        applies=_accumulate_f32_scratch,
    ),
    Strategy(
        name="lane-dense-layout",
        what=(
            "Make the last dimension of every block a multiple of 128 lanes: reshape/transposes in the wrapper so "
            "that narrow outputs (e.g. (rows, 1) or (rows, 64)) become lane-dense (e.g. (rows // 128, 128) or a "
            "padded 128-wide block), storing full vregs instead of masked partial stores."
        ),
        when=(
            "Some block's last dimension is not a multiple of 128 (or is narrower than 128): loads and stores use "
            "masked partial vregs and the writeback DMA moves tiny rows."
        ),
        requires="a block whose last dimension is not a multiple of 128",
        applies=_lane_dense,
    ),
)


def by_name() -> dict[str, Strategy]:
    return {s.name: s for s in STRATEGIES}


def get_strategy(name: str) -> Strategy:
    """The strategy called `name`; `ValueError` listing the menu otherwise."""
    menu = by_name()
    if name not in menu:
        raise ValueError(f"unknown strategy {name!r}; strategies: {', '.join(menu)}")
    return menu[name]


def applicable(ir: KernelIR) -> tuple[Strategy, ...]:
    """The strategies whose predicate holds for `ir`, in menu order."""
    return tuple(s for s in STRATEGIES if s.applies(ir))
