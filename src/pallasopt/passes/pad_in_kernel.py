"""pad-in-kernel: an input the wrapper zero-pads with `jnp.pad` is padded in VMEM by the kernel instead."""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from typing import ClassVar

import libcst as cst

from ..cost_model.hardware import Chip, native_tile
from ..errors import KernelError, PassNotApplicable, check
from ..ir.builders import affine_results, fresh_name
from ..ir.cst_edit import add_scratch, ensure_pltpu, forward_new_ref, nested_into, ref_via_scratch, replace_many
from ..ir.facts import CallFacts, Operand
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    PALLAS,
    Located,
    blockspec_parts,
    call_site,
    code,
    dead_assignment,
    enclosing_function,
    input_site,
    jnp_alias,
    keyword,
    module_alias,
    only_read,
    resolve_local,
    shared_kernel,
    spec_site,
    used_names,
)
from .base import Pass, per_input_choices

Width = int | str  # a literal pad width, or the wrapper's expression for it
Pads = tuple[tuple[Width, Width], ...]


def _side(node: cst.BaseExpression) -> Width | None:
    """One pad width: a literal int (None when negative or not an int), or the expression's text."""
    try:
        value = ast.literal_eval(code(node))
    except (ValueError, SyntaxError):
        return code(node)
    return value if isinstance(value, int) and value >= 0 else None


def _pad_widths(raw: cst.BaseExpression, ndim: int) -> Pads | None:
    """`jnp.pad`'s pad_width as one (before, after) per dim: a literal (an int, a pair, or a pair per dim: numpy's
    broadcasting), or a literal tuple of one pair per dim whose sides may be expressions (`(K - 1, 0)`); None
    otherwise."""
    try:
        value = ast.literal_eval(code(raw))
    except (ValueError, SyntaxError):
        value = None
    if isinstance(value, int):
        return ((value, value),) * ndim if value >= 0 else None
    if isinstance(value, tuple | list) and len(value) == 2 and all(isinstance(v, int) and v >= 0 for v in value):
        return ((value[0], value[1]),) * ndim
    if not isinstance(raw, cst.Tuple | cst.List) or len(raw.elements) != ndim:
        return None
    out: list[tuple[Width, Width]] = []
    for e in raw.elements:
        pair = e.value
        if isinstance(pair, cst.Integer):
            side = _side(pair)
            if side is None:
                return None
            out.append((side, side))
            continue
        if not isinstance(pair, cst.Tuple | cst.List) or len(pair.elements) != 2:
            return None
        lo, hi = _side(pair.elements[0].value), _side(pair.elements[1].value)
        if lo is None or hi is None:
            return None
        out.append((lo, hi))
    return tuple(out)


def _padded(width: tuple[Width, Width]) -> bool:
    return width != (0, 0)


def _shrunk(block: str, width: tuple[Width, Width]) -> str:
    """The block dim `block` less the pad: `(T + 2) - 2`, `(T + K - 1) - (K - 1 + 0)`."""
    lo, hi = width
    if isinstance(lo, int) and isinstance(hi, int):
        return f"({block}) - {lo + hi}"
    return f"({block}) - ({lo} + {hi})"


def _locatable(width: tuple[Width, Width]) -> bool:
    """The kernel can find where the unpadded block starts: one side of the pad is literal (`_offset`)."""
    return any(isinstance(side, int) for side in width)


def _offset(width: tuple[Width, Width], ref: str, inner: str, k: int) -> str:
    """Where the unpadded block starts in kernel dim `k` of the padded scratch, in the kernel's own terms: the literal
    `before`, or the scratch's extent less the block's less the literal `after` (`_locatable` widths only)."""
    lo, hi = width
    if isinstance(lo, int):
        return str(lo)
    assert isinstance(hi, int)
    return f"{ref}.shape[{k}] - {inner}.shape[{k}] - {hi}"


def _is_zero_pad(call: cst.Call, jnp: str) -> bool:
    """`jnp.pad(x, widths)` padding with zeros: mode absent or "constant", constant_values absent or 0."""
    if code(call.func) not in (f"{jnp}.pad", "jax.numpy.pad"):
        return False
    known = {"pad_width", "mode", "constant_values"}
    if any(a.keyword is not None and a.keyword.value not in known for a in call.args) or any(a.star for a in call.args):
        return False
    mode = keyword(call, "mode")
    if mode is not None and code(mode.value).strip("'\"") != "constant":
        return False
    values = keyword(call, "constant_values")
    positional = [a for a in call.args if a.keyword is None]
    if len(positional) > 2:
        return False
    return values is None or code(values.value) in ("0", "0.0", "0.")


@dataclass(frozen=True)
class _Site:
    """One padded input: the pad call, the unpadded array's text and the widths."""

    pad: cst.Call
    source: str
    widths: Pads


def _padded_input(loc: Located, node: cst.Call, operand: cst.BaseExpression, op: Operand) -> _Site | None:
    """The `jnp.pad` that made `operand` (written in place or assigned to a local name before the call) when it pads
    with zeros by widths `_pad_widths` reads, and its array is a plain name; else None."""
    jnp = jnp_alias(loc.wrapper.module)
    if jnp is None:
        return None
    pad = resolve_local(loc, node, operand.value) if isinstance(operand, cst.Name) else operand
    if not isinstance(pad, cst.Call) or not _is_zero_pad(pad, jnp):
        return None
    positional = [a.value for a in pad.args if a.keyword is None]
    width_arg = keyword(pad, "pad_width")
    widths_node = width_arg.value if width_arg is not None else (positional[1] if len(positional) > 1 else None)
    if not positional or widths_node is None or not isinstance(positional[0], cst.Name):
        return None
    widths = _pad_widths(widths_node, len(op.shape))
    if widths is None or not any(_padded(w) for w in widths):
        return None
    return _Site(pad, positional[0].value, widths)


def _whole_padded_dims(op: Operand, widths: Pads) -> bool:
    """Every padded dim is taken whole by one block (block = the padded extent, index map 0 there), unsqueezed."""
    affine = op.index_map.affine
    if affine is None or not op.is_pipelined or len(affine) != len(op.shape):
        return False
    for d, width in enumerate(widths):
        if not _padded(width):
            continue
        if op.block_shape[d] is None or op.block_shape[d] != op.shape[d] or any(affine[d]):
            return False
    return True


def reuse_axes(call: CallFacts, op: Operand) -> tuple[int, ...]:
    """The innermost grid axes along which `op`'s block stays the same (every axis after the last one its index map
    reads): the padded block need only be built when they are all 0, i.e. when a new block has just arrived. Empty
    (build it every step) when there is none longer than 1, when the map is data-dependent (its axes are sampled),
    or when one of them may be split over cores (not "arbitrary": a core would start past index 0)."""
    if op.index_map.data_dependent:
        return ()
    last = max(op.index_map.axes, default=-1)
    trailing = tuple(range(last + 1, len(call.grid)))
    sem = call.dimension_semantics
    if all(call.grid[a] == 1 for a in trailing) or (sem and any(sem[a] != "arbitrary" for a in trailing)):
        return ()
    return trailing


class _Unindented(cst.CSTTransformer):
    """Blank lines without the block's indentation (libcst indents the blank lines of a parsed block)."""

    def leave_EmptyLine(self, original_node: cst.EmptyLine, updated_node: cst.EmptyLine) -> cst.EmptyLine:
        return updated_node.with_changes(indent=False, whitespace=cst.SimpleWhitespace(""))


def fetched_axis(call: CallFacts, op: Operand) -> int:
    """The one grid axis `op`'s block follows, for a prefetch that carries a copy from one block to the next across
    grid steps; PassNotApplicable when there is none or several, when the map is not affine, or when an axis may be
    split over cores (a core would start past index 0 and wait on a copy nobody started)."""
    axes = op.index_map.axes
    check(op.index_map.affine is not None and not op.index_map.data_dependent, "the block's index map is not affine")
    check(len(axes) <= 1, f"the block follows several grid axes {list(axes)}")
    check(bool(axes), "the block never changes (the plain pad-in-kernel builds it once)")
    sem = call.dimension_semantics or ()
    check(
        not any(x in ("parallel", "core_parallel") for x in sem),
        "a grid axis is marked parallel: the prefetch needs the grid to run in order on one core",
    )
    return axes[0]


def check_dma_offsets(op: Operand, widths: Pads) -> None:
    """PassNotApplicable where a DMA could not write the block at its pad offset in the scratch: Mosaic wants
    offsets along the tiled dims aligned to the tile (fused_21's bf16 rows padded by 3: "Offsets along tiled
    dimensions must be aligned to tiles"), lanes by 128 and, below 32 bits, rows by the packed tile (16 for bf16);
    32-bit rows at any offset compile (fused_22's f32 image padded by 1 row and column: libtpu 0.0.42.1, v5e)."""
    visible = [(w, d) for d, (b, w) in enumerate(zip(op.block_shape, widths, strict=True)) if b is not None]
    rows, lane_tile = native_tile(op.dtype)
    for pos, ((lo, _), d) in enumerate(visible[-2:]):
        if not _padded(widths[d]):
            continue
        lanes = pos == len(visible[-2:]) - 1
        align = lane_tile if lanes else (1 if rows <= 8 else rows)
        check(
            isinstance(lo, int) and lo % align == 0,
            f"dim {d} is padded by {lo} before: a DMA cannot write {'lanes' if lanes else 'rows'} of {op.dtype} at "
            f"that offset (it must be a multiple of {align})",
        )


@dataclass(frozen=True)
class PadInKernelPass(Pass):
    """Move an input's zero padding from the wrapper into the kernel: an operand made by `jnp.pad(x, widths)` whose
    padded dims each fit one block whole (the halo of a convolution or a stencil over a whole image per step) is
    passed as `x`, its BlockSpec's padded dims shrink by the widths, and the kernel builds the padded block in a
    VMEM scratch of the old block shape (zeroed, then `x`'s block written at the pad offsets) that the body reads
    under the old ref name. The padded copy of `x` no longer goes through HBM (a write and a read of the whole
    array, which the cost model charges to the wrapper); the kernel pays two VMEM stores of the block each time a
    new block arrives: under `pl.when` the innermost grid axes along which the block stays (`reuse_axes`) are 0.
    (Building it every step cost fused_22's row-per-step conv, whose whole image is one block for 56 steps, 3x on a
    TPU v5e: 0.533 -> 1.584 ms, bench/results/hw-v5e-2026-12-06.)

    Widths are a literal (an int, a pair, a pair per dim) or a pair per dim whose sides may be the wrapper's
    expressions (`(K - 1, 0)`: the block shrinks by `(K - 1 + 0)`, and the kernel finds the offset from the
    scratch's and the block's extents), one side of each padded dim literal.

    `dma=true`: no VMEM copy at all. The input stays in HBM (`memory_space=pl.ANY`) and a manual DMA writes each
    block straight into the interior of a zeroed two-slot padded scratch; the copy of the next block starts when
    this one arrives, so it overlaps this block's steps (fused_22's conv, one 56 x 56 image per 14 steps: 0.220 ->
    0.180 ms [C], where the VMEM build cost more than the wrapper's pad saved). Needs the block to follow one grid
    axis (affine) and no axis marked parallel (the copy in flight is carried from step to step).

    Parameters: `call`, `operand` (input index), `dma`. Declines for padding other than zeros, other widths, a
    padded dim split over several blocks, a body that stores to the ref, a kernel shared with another call, or a
    BlockSpec whose shape is not a literal tuple written in the wrapper that makes the call.
    """

    name: ClassVar[str] = "pad-in-kernel"
    call: int = 0
    operand: int = 0
    dma: bool = False

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        plain = per_input_choices(ir, lambda c, i: cls(call=c, operand=i), lambda p: p._plan(ir, ir.module))
        return (*plain, *(p for p in (replace(q, dma=True) for q in plain) if p._dma_viable(ir)))

    def _dma_viable(self, ir: KernelIR) -> bool:
        try:
            self._plan(ir, ir.module)
        except PassNotApplicable:
            return False
        return True

    def _plan(
        self, ir: KernelIR, module: cst.Module
    ) -> tuple[Located, cst.Call, cst.FunctionDef, str, _Site, cst.CSTNode, cst.Call, cst.Lambda | None]:
        """What the rewrite of `module` (`ir`'s, or it with an import added) needs, or PassNotApplicable saying why
        not."""
        at = input_site(module, ir.calls, self.call, self.operand)
        loc, node, kernel, refs, site = at.loc, at.node, at.kernel, at.refs, at.site
        facts = ir.calls[self.call]
        op = facts.inputs[self.operand]
        padded = _padded_input(loc, node, site.operands[self.operand], op)
        check(padded is not None, f"input {self.operand} is not made by jnp.pad(name, widths) with zeros")
        assert padded is not None
        check(_whole_padded_dims(op, padded.widths), "a padded dim is split over several blocks")
        ref = refs[self.operand]
        check(
            all(_locatable(w) for w in padded.widths if _padded(w)),
            "a dim is padded on both sides by widths that are not literal",
        )
        check(only_read(kernel, ref), f"the kernel stores to or rebinds {ref}")
        check(
            not shared_kernel(loc, ir.calls, facts.index, kernel), "the kernel function runs in another pallas_call too"
        )
        where, spec = spec_site(loc, node, self.operand, len(facts.operands), len(facts.inputs))
        shape, _ = blockspec_parts(spec)
        check(
            isinstance(shape, cst.Tuple) and len(shape.elements) == len(op.shape),
            "the BlockSpec's block shape is not a literal tuple",
        )
        check(enclosing_function(loc, spec) is enclosing_function(loc, node), "the BlockSpec is built elsewhere")
        if self.dma:
            fetched_axis(facts, op)
            check_dma_offsets(op, padded.widths)
            check(module_alias(loc.wrapper.module, PALLAS, through_parent=False) is not None, "no `pl` import")
        return loc, node, kernel, ref, padded, where, spec, at.forwarder

    def apply(self, ir: KernelIR) -> KernelIR:
        module, pltpu = ensure_pltpu(ir.module)
        loc, node, kernel, ref, padded, where, spec, forwarder = self._plan(ir, module)
        facts = ir.calls[self.call]
        op = facts.inputs[self.operand]
        jnp = jnp_alias(loc.wrapper.module)
        assert jnp is not None
        shape, _ = blockspec_parts(spec)
        assert isinstance(shape, cst.Tuple)
        texts = [code(e.value) for e in shape.elements]
        new_dims = [_shrunk(t, w) if _padded(w) else t for t, w in zip(texts, padded.widths, strict=True)]
        new_shape = cst.parse_expression(f"({', '.join(new_dims)}{',' if len(new_dims) == 1 else ''})")
        pl = module_alias(loc.wrapper.module, PALLAS, through_parent=False)
        edits: dict[cst.CSTNode, cst.CSTNode]
        if self.dma:  # the input stays in HBM (`_plan` checked `pl`)
            edits = {where: cst.parse_expression(f"{pl}.BlockSpec(memory_space={pl}.ANY)")}
        else:  # in place when the list holds the BlockSpec itself; else (a name of a spec other operands may share)
            # the list element becomes a new spec
            edits = {shape: new_shape} if where is spec else {where: spec.deep_replace(shape, new_shape)}
        site = call_site(loc, node, trailing_star=True)
        assert site is not None
        edits[site.operands[self.operand]] = cst.Name(padded.source)
        dead = dead_assignment(loc, site.operands[self.operand], padded.pad)
        if dead is not None:
            edits[dead] = cst.RemovalSentinel.REMOVE  # type: ignore[assignment]
        visible = [(t, w) for t, w, b in zip(texts, padded.widths, op.block_shape, strict=True) if b is not None]
        if self.dma:
            assert pl is not None
            return self._apply_dma(ir, loc, node, kernel, ref, padded, edits, forwarder, (pl, pltpu, jnp), visible)
        inner = fresh_name(used_names(kernel), f"{ref}_unpadded")  # parameter names included
        offsets = [_offset(w, ref, inner, k) if _padded(w) else None for k, (_, w) in enumerate(visible)]
        index = ", ".join(":" if o is None else f"{o}:{o} + {inner}.shape[{k}]" for k, o in enumerate(offsets))
        build = f"{ref}[...] = {jnp}.zeros({ref}.shape, {ref}.dtype)\n{ref}[{index}] = {inner}[...]\n"
        axes = reuse_axes(facts, op)
        if axes and pl is not None:
            when = " & ".join(f"({pl}.program_id({a}) == 0)" for a in axes)
            fn = fresh_name(used_names(kernel), f"_build_{ref}")
            build = f"@{pl}.when({when})\ndef {fn}():\n" + "".join(f"    {line}\n" for line in build.splitlines())
        prologue = cst.parse_module(build).body
        edits[kernel] = ref_via_scratch(
            kernel, self.operand, ref, inner, prologue, len(facts.inputs) + len(facts.outputs) + len(facts.scratch)
        )
        if forwarder is not None:
            edits[forwarder] = forward_new_ref(forwarder)
        block = ", ".join(t for t, _ in visible) + ("," if len(visible) == 1 else "")
        add_scratch(loc, node, [cst.parse_expression(f"{pltpu}.VMEM(({block}), {padded.source}.dtype)")], edits)
        new = self._retraced(ir, loc, edits)
        got = new.calls[self.call]
        x = got.inputs[self.operand]
        whole = all(x.block_shape[d] == x.shape[d] for d, w in enumerate(padded.widths) if _padded(w))
        check(
            whole and got.grid == facts.grid and len(got.scratch) == len(facts.scratch) + 1,
            f"the rewrite traced to input shape {x.shape}, block {x.block_shape}, grid {got.grid}",
        )
        return new

    def _apply_dma(
        self,
        ir: KernelIR,
        loc: Located,
        node: cst.Call,
        kernel: cst.FunctionDef,
        ref: str,
        padded: _Site,
        edits: dict[cst.CSTNode, cst.CSTNode],
        forwarder: cst.Lambda | None,
        aliases: tuple[str, str, str],
        visible: list[tuple[str, tuple[Width, Width]]],
    ) -> KernelIR:
        """The `dma=true` rewrite: `edits` already pass `x` in HBM; the kernel prefetches its blocks (`fetched_axis`)
        into a two-slot padded scratch and reads the arrived slot under the old ref name. `aliases`: how the module
        spells `pl`, `pltpu` and `jnp`."""
        facts = ir.calls[self.call]
        op = facts.inputs[self.operand]
        pl, pltpu, jnp = aliases
        assert op.index_map.affine is not None
        axis = fetched_axis(facts, op)
        used = used_names(kernel)
        inner, slots, sem = (fresh_name(used, f"{ref}_{s}") for s in ("hbm", "slots", "sem"))
        lin, slot, copy = (fresh_name(used, f"_{ref}_{s}") for s in ("step", "slot", "copy"))
        start, arrive, ahead = (fresh_name(used, f"_{ref}_{s}") for s in ("first", "arrived", "next"))
        src, dst, k = [], [], 0
        for d, (b, width) in enumerate(zip(op.block_shape, padded.widths, strict=True)):
            row = op.index_map.affine[d]
            (at,) = affine_results([(row[axis], row[-1])], ["_blk"], {0: 0})
            if b is None:
                src.append(at)
                continue
            if _padded(width):
                lo, hi = width
                off = str(lo) if isinstance(lo, int) else f"{slots}.shape[{k + 1}] - {inner}.shape[{d}] - {hi}"
                src.append(":")
                dst.append(f"{pl}.ds({off}, {inner}.shape[{d}])")
            else:
                whole = b == op.shape[d] and at == "0"
                at = f"({at})" if " " in at else at
                src.append(":" if whole else f"{pl}.ds({at} * {slots}.shape[{k + 1}], {slots}.shape[{k + 1}])")
                dst.append(":")
            k += 1
        step = f"{pl}.program_id(0)"
        for j in range(1, axis + 1):
            step = f"({step}) * {pl}.num_programs({j}) + {pl}.program_id({j})"
        total = " * ".join(f"{pl}.num_programs({j})" for j in range(axis + 1))
        trailing = [f"({pl}.program_id({j}) == 0)" for j in range(axis + 1, len(facts.grid))]
        here = f"{pl}.program_id({axis})"
        wait = (
            f"{copy}({here}, {slot}).wait()\n\n"
            f"@{pl}.when({lin} + 1 < {total})\n"
            f"def {ahead}():\n"
            f"    {copy}(({here} + 1) % {pl}.num_programs({axis}), 1 - {slot}).start()\n"
        )
        if trailing:
            wait = f"@{pl}.when({' & '.join(trailing)})\ndef {arrive}():\n" + "".join(
                f"    {line}\n" if line else "\n" for line in wait.splitlines()
            )
        text = (
            f"{lin} = {step}\n"
            f"{slot} = {lin} % 2\n\n"
            f"def {copy}(_blk, _slot):\n"
            f"    return {pltpu}.make_async_copy(\n"
            f"        {inner}.at[{', '.join(src)}], {slots}.at[_slot, {', '.join(dst)}], {sem}.at[_slot]\n"
            f"    )\n\n"
            f"@{pl}.when({' & '.join([f'({lin} == 0)', *trailing])})\n"
            f"def {start}():\n"
            f"    {slots}[...] = {jnp}.zeros({slots}.shape, {slots}.dtype)\n"
            f"    {copy}({here}, {slot}).start()\n\n"
            f"{wait}\n"
            f"{ref} = {slots}.at[{slot}]\n"
        )
        prologue = cst.parse_module(text).visit(_Unindented()).body
        n_refs = len(facts.inputs) + len(facts.outputs) + len(facts.scratch)
        edits[kernel] = ref_via_scratch(kernel, self.operand, ref, inner, prologue, n_refs, added=(slots, sem))
        if forwarder is not None:
            edits[forwarder] = forward_new_ref(forward_new_ref(forwarder))
        block = ", ".join(t for t, _ in visible)
        new_scratch = [f"{pltpu}.VMEM((2, {block}), {padded.source}.dtype)", f"{pltpu}.SemaphoreType.DMA((2,))"]
        add_scratch(loc, node, [cst.parse_expression(e) for e in new_scratch], edits)
        new = self._retraced(ir, loc, edits)
        got = new.calls[self.call]
        x = got.inputs[self.operand]
        check(
            x.memory_space in ("any", "hbm") and got.grid == facts.grid and len(got.scratch) == len(facts.scratch) + 2,
            f"the rewrite traced to input memory {x.memory_space}, grid {got.grid}, {len(got.scratch)} scratch",
        )
        return new

    def _retraced(self, ir: KernelIR, loc: Located, edits: dict[cst.CSTNode, cst.CSTNode]) -> KernelIR:
        """`ir` with `edits` made, re-traced; PassNotApplicable when the result does not trace."""
        try:
            return ir.with_module(replace_many(loc.wrapper.module, nested_into(loc, edits)), self.spec())
        except KernelError as e:
            raise PassNotApplicable(f"the rewritten module does not trace: {e.message}") from None
