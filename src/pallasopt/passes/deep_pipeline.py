"""pipeline: a call's grid runs as a `pltpu.emit_pipeline` inside the kernel, its moving inputs fetched `depth` ahead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from ..cost_model.hardware import Chip
from ..errors import check
from ..ir.cst_edit import ensure_pltpu, replace_many, set_compiler_param
from ..ir.facts import CallFacts, Operand
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    Located,
    code,
    enclosing_function,
    find_call_node,
    grid_spec_keyword,
    keyword,
    module_names,
    pl_alias,
)
from .base import Pass

DEPTHS = (3, 4)  # buffers per moving input offered: grid BlockSpecs lower only 1 or 2 in jax 0.10.2 (FACTS.md)

# The module-level helpers the rewrite calls (added once per module). `{pl}` / `{pltpu}` are the module's aliases.
# The outer call has no grid; its blocked operands stay in HBM (`memory_space=ANY`) and the kernel runs the old grid
# as an emit_pipeline over them. Inside the pipeline's body `pl.program_id` / `pl.num_programs` read the pipeline's
# indices and grid (emit_pipeline binds its own grid environment), so the kernel body runs unchanged.
HELPERS = '''

def _pipeline_blocked(spec):
    """Whether `spec` is a blocked VMEM operand the grid pipelined (the inner pipeline fetches it now)."""
    return spec is not None and spec.block_shape is not None and spec.memory_space in (None, {pltpu}.VMEM)


def _pipeline_hbm(specs):
    """The outer call's specs: blocked operands stay in HBM for the inner pipeline; the others as they were."""
    one = lambda s: {pl}.BlockSpec(memory_space={pl}.ANY) if _pipeline_blocked(s) else s
    return [one(s) for s in specs] if isinstance(specs, (list, tuple)) else one(specs)


def _pipeline_kernel(kernel, grid, in_specs, out_specs, depth, deep, n_prefetch):
    """A kernel for a call with no grid: runs `kernel` over `grid` as a {pltpu}.emit_pipeline whose inputs at
    positions `deep` hold `depth` buffers (fetched depth - 1 steps ahead), the other blocked operands two."""
    import dataclasses

    ins = list(in_specs) if isinstance(in_specs, (list, tuple)) else [in_specs]
    outs = list(out_specs) if isinstance(out_specs, (list, tuple)) else [out_specs]

    def run(*refs):
        head = refs[:n_prefetch]
        io = list(refs[n_prefetch : n_prefetch + len(ins) + len(outs)])
        scratch = refs[n_prefetch + len(ins) + len(outs) :]
        specs = ins + outs
        blocked = [i for i, s in enumerate(specs) if _pipeline_blocked(s)]

        def inner(spec, pos):
            index_map = spec.index_map
            changes = {{"index_map": lambda *idx: index_map(*idx, *head)}} if head else {{}}
            if pos in deep:
                changes["pipeline_mode"] = {pl}.Buffered(depth)
            return dataclasses.replace(spec, **changes)

        def body(*blocks):
            full = list(io)
            for pos, block in zip(blocked, blocks):
                full[pos] = block
            kernel(*head, *full, *scratch)

        {pltpu}.emit_pipeline(
            body,
            grid=tuple(grid),
            in_specs=[inner(specs[i], i) for i in blocked if i < len(ins)],
            out_specs=[inner(specs[i], i) for i in blocked if i >= len(ins)],
        )(*[io[i] for i in blocked])

    return run
'''


def _tile_aligned(o: Operand) -> bool:
    """The block's last two dims are multiples of (8, 128) or the array's extents (emit_pipeline refuses others:
    "Block size must divide tiling")."""
    for k, tile in ((-1, 128), (-2, 8)):
        if len(o.shape) < -k:
            continue
        b = o.block_shape[k]
        if b is not None and b != o.shape[k] and b % tile:
            return False
    return True


def decline_reason(call: CallFacts) -> str:
    """Why the call's grid cannot run as an inner pipeline ("" when it can)."""
    if call.library_site is not None:
        return "a library's kernel: only the values this file passes to it can change"
    if any(g < 1 for g in call.grid):
        return "a grid axis with no steps (the call runs nothing; emit_pipeline refuses an empty grid)"
    if not any(g > 1 for g in call.grid):
        return "no grid axis with more than one step"
    if any(not _tile_aligned(o) for o in call.operands if o.is_pipelined):
        return "a block's minor two dims are not multiples of (8, 128) or whole: emit_pipeline's HBM blocks must be"
    if any(o.is_pipelined and _ragged(o.shape, o.block_shape) for o in call.operands):
        # the inner pipeline then DMAs blocks of a size known only at run time, which the TPU interpreter rejects
        # (a cdiv grid's last block, or a block wider than its array): the rewrite could never be verified
        return "a block that does not divide its array (a partial last block): emit_pipeline's DMAs then take a run-time size"
    if call.dynamic_axes:
        return "a grid extent known only at run time"
    if call.body.has_dma:
        return "the kernel does manual DMA or already pipelines by hand (dma-overlap / multi-buffer)"
    if call.input_output_aliases:
        return "the call aliases inputs to outputs"
    if any(o.memory_space == "smem" for o in call.operands):
        return "an SMEM-blocked operand (emit_pipeline fetches VMEM blocks only)"
    if not deep_inputs(call):
        return "no blocked input whose block changes between steps"
    return ""


def _ragged(shape: tuple[int, ...], block: tuple[int | None, ...]) -> bool:
    return any(b is not None and d % b != 0 for d, b in zip(shape, block, strict=False))


def deep_inputs(call: CallFacts) -> tuple[int, ...]:
    """Positions of the blocked inputs whose block index moves with the grid: those get the deeper buffers."""
    return tuple(o.position for o in call.inputs if o.is_pipelined and o.index_map.axes)


@dataclass(frozen=True)
class PipelinePass(Pass):
    """Run a call's grid as a `pltpu.emit_pipeline` inside a kernel with no grid, the inputs whose block moves
    held in `depth` buffers (`pl.Buffered(depth)`: fetched depth - 1 steps ahead), which grid BlockSpecs cannot
    (jax 0.10.2 lowers only Buffered(1) or (2) there). The outer call keeps its out_shape, scratch and compiler
    params; its blocked operands stay in HBM (`memory_space=ANY`) and the kernel body runs unchanged on the inner
    pipeline's blocks (`pl.program_id` / `pl.num_programs` read the inner grid). Scalar-prefetch tables are passed
    to the index maps as before. `dimension_semantics` is dropped: the inner pipeline runs its steps in order on one
    core (on megacore chips the model sees the lost split).

    Helps where a block's fetch takes longer than a step's compute and two buffers leave the DMA exposed (small
    blocks, gathers, latency-bound streams); costs depth - 2 more input blocks of VMEM. Whether it pays is a
    question for the hardware tier: the roofline charges both forms the same per-step overhead, and libtpu's static
    estimate charges the deeper ring more (see the README's pass table). Parameters: `call`, `depth` (3 or 4).
    """

    name: ClassVar[str] = "pipeline"
    # Neither the roofline nor libtpu's static estimate can show the gain (see above): the search offers it when it
    # times candidates on the target chip, or when named (`--passes pipeline,...`); `apply` always can.
    search_needs_hardware: ClassVar[bool] = True
    call: int = 0
    depth: int = 3

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        if chip.is_gpu:
            return ()
        return tuple(cls(call=c.index, depth=d) for c in ir.calls if not decline_reason(c) for d in DEPTHS)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        check(self.depth >= 2, "depth must be at least 2")
        facts = ir.calls[self.call]
        why = decline_reason(facts)
        check(not why, why)
        module = ir.module
        if facts.dimension_semantics is not None:  # a call with no grid takes none
            module = set_compiler_param(module, facts, "dimension_semantics", cst.Name("None"))
        module, pl, pltpu = _aliased(module)
        loc = Located.of(module)
        node = find_call_node(loc, facts)
        edits = _edits(loc, node, facts, self.depth)
        out = replace_many(module, edits)
        if "_pipeline_kernel" not in module_names(out):
            helpers = list(cst.parse_module(HELPERS.format(pl=pl, pltpu=pltpu)).body)
            helpers[0] = helpers[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
            out = out.with_changes(body=[*out.body, *helpers])  # at the end: the user's lines keep their numbers
        return ir.with_module(out, self.spec())


def _aliased(module: cst.Module) -> tuple[cst.Module, str, str]:
    """`module` importing pallas.tpu, and its names for pallas and pallas.tpu."""
    out, pltpu = ensure_pltpu(module)
    return out, pl_alias(out), pltpu


def _edits(loc: Located, node: cst.Call, facts: CallFacts, depth: int) -> dict[cst.CSTNode, cst.CSTNode]:
    """Kernel -> `_pipeline_kernel(kernel, grid, in_specs, out_specs, ...)`, grid -> (), specs -> `_pipeline_hbm`."""
    kernel = node.args[0] if node.args and node.args[0].keyword is None else keyword(node, "kernel")
    check(kernel is not None, "cannot find the pallas_call's kernel argument")
    assert kernel is not None
    parts = {key: grid_spec_keyword(loc, node, key) for key in ("grid", "in_specs", "out_specs")}
    for key, (holder, arg) in parts.items():
        check(arg is not None, f"the call's {key} is not written at the call or its grid spec")
        check(
            holder is node or enclosing_function(loc, holder) is enclosing_function(loc, node),
            "the grid spec is built in another function",
        )
    grid, ins, outs = (parts[k][1].value for k in ("grid", "in_specs", "out_specs"))  # type: ignore[union-attr]
    deep = str(deep_inputs(facts))  # "(0, 1)"
    text = (
        f"_pipeline_kernel({code(kernel.value)}, {code(grid)}, {code(ins)}, {code(outs)}, {depth}, {deep}, "
        f"{facts.num_scalar_prefetch})"
    )
    return {
        kernel.value: cst.parse_expression(text),
        grid: cst.parse_expression("()"),
        ins: cst.parse_expression(f"_pipeline_hbm({code(ins)})"),
        outs: cst.parse_expression(f"_pipeline_hbm({code(outs)})"),
    }
