"""fuse: producer-consumer fusion of two consecutive pallas_calls, the consumer running on the producer's finished
block in VMEM."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import KernelError, PassNotApplicable, check
from ..ir.builders import (
    affine_results,
    fresh_name,
    index_map_expr,
    inline_names,
    rename_names,
    renumber_program_ids,
    tuple_expr,
)
from ..ir.cst_edit import (
    block_text,
    ensure_pltpu,
    keyword_arg,
    list_like,
    portable,
    replace_many,
    set_compiler_param,
    set_keyword,
    with_keyword_only,
)
from ..ir.facts import CallFacts, Operand
from ..ir.fusion import Link, blocked_like, dataflow, fusable, is_column_row, link, unit_row
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    PROGRAM_ID,
    Located,
    blockspec_parts,
    bound_names,
    call_site,
    code,
    enclosing_function,
    find_call_node,
    free_names,
    grid_spec_keyword,
    is_blockspec,
    is_call_to,
    kernel_function,
    kernel_refs,
    keyword,
    module_alias,
    module_names,
    pl_alias,
    program_id_axes,
    resolve,
    spec_list,
    used_names,
)
from .base import Pass
from .tile import TilePass, knobs_of
from .vmem_limit import needed_step

# Keywords of the consumer's pallas_call that describe its old grid: dropped from the fused call (later passes
# re-derive dimension semantics, VMEM limit and cost estimate for the fused kernel).
DROPPED = ("compiler_params", "cost_estimate", "name")


@dataclass(frozen=True)
class FusePass(Pass):
    """Fuse pallas_call `producer` with the call that reads its output block by block: one kernel that runs the
    producer's body and, once a block is finished (on the last step of the producer's reduction axes), the
    consumer's body on it in VMEM. The intermediate never goes to HBM.

    Helps wherever a kernel writes a large result only for the next kernel to read it back (a matmul then its
    activation, row or column reduction, normalization): it saves that array's HBM write and read and one launch.
    The consumer's grid order is kept and the producer's reduction axes go innermost, so reductions in the consumer
    (a column max, a row sum) carry their partials in the output block across the fused grid, as they did before.
    An elementwise consumer (its body made of elementwise primitives only, every operand blocked like the
    intermediate) takes the producer's blocks whatever its own were. Parameters: `producer` (index of the first
    call); `retile` (first re-tile the consumer with the tile pass so that it reads the producer's blocks, for a
    consumer that is not elementwise). Declines when a consumer reads blocks of another shape that no tile knob
    aligns, when the output has another reader or is a result, for several producer outputs, manual DMA, scalar
    prefetch, aliasing, or kernels it cannot read (`*args`, **kwargs, a kernel built by an expression other than
    `functools.partial(fn, keyword=...)`, grid_spec=, a pallas_call built in a factory). Keywords bound through
    functools.partial stay keyword-only parameters of the fused kernel, bound the same way.
    """

    name: ClassVar[str] = "fuse"
    producer: int = 0
    retile: bool = False
    vmem_mib: int = 0  # > 0: the fused call's vmem_limit_bytes, in MiB (its blocks need more than the default)

    def params(self) -> dict[str, Any]:
        extra = {"vmem_mib": self.vmem_mib} if self.vmem_mib else {}
        return {"producer": self.producer, "retile": self.retile, **extra}

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        for i in range(len(ir.calls) - 1):
            why = fusable(ir, i)
            if why is None:
                out.append(_with_vmem(cls(producer=i), ir, chip))
            elif "tile them alike" in why:
                out.append(cls(producer=i, retile=True))
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        base = ir
        if self.retile:
            why = fusable(ir, self.producer)
            check(why is None or "tile them alike" in why, why or "")
            base = _retiled(ir, self.producer) if why is not None else ir
        lk = link(base, self.producer)
        try:
            new = ir.with_module(_fuse(base, lk), self.spec())
        except KernelError as e:  # a rewrite this pass got wrong: decline with why, the search goes on
            raise PassNotApplicable(f"the fused module does not trace: {e.message}") from None
        _verify(base, new, lk)
        fused = new.calls[lk.consumer.index - 1]
        if self.vmem_mib * 2**20 > (fused.vmem_limit_bytes or 0):
            value = cst.parse_expression(f"{self.vmem_mib} * 1024 * 1024")
            new = ir.with_module(set_compiler_param(new.module, fused, "vmem_limit_bytes", value), self.spec())
        return new


def _with_vmem(p: FusePass, ir: KernelIR, chip: Chip) -> FusePass:
    """`p` with the VMEM limit its fused call needs when its blocks (whole rows, `Link.whole`, grow with the array)
    overflow the chip's default scoped VMEM: the smallest of vmem-limit's steps that holds them with 10% to spare
    (a fused kernel that does not compile is no step for a search to build on). `p` as is when none is needed, when
    no step holds them (the compiler tier says why) or when the fusion does not apply here."""
    try:
        fused = p.apply(ir).calls[dataflow(ir, p.producer).consumer - 1]  # the fused call replaced the consumer
    except PassNotApplicable:
        return p
    mib = needed_step(fused, chip)
    return replace(p, vmem_mib=mib) if mib else p


def _retiled(ir: KernelIR, producer: int) -> KernelIR:
    """The module re-tiled (by the tile pass, which checks each rewrite) so that the consumer reads the producer's
    output in the producer's blocks: per block dim, the consumer's knob takes the producer's size, or else the
    producer's knob takes the consumer's (a row-wise consumer of whole rows makes the producer tile whole rows)."""
    p = ir.calls[producer]
    flow = dataflow(ir, producer)
    check(flow.reshaped is None, "the consumer reads the producer's output reshaped")
    consumer = flow.consumer
    h, out = ir.calls[consumer].inputs[flow.operand], p.outputs[0]
    assert h.index_map.affine is not None and out.index_map.affine is not None
    knobs = knobs_of(ir)
    wanted: dict[int, dict[str, int]] = {consumer: {}, producer: {}}
    for d, (hb, pb) in enumerate(zip(h.block_shape, out.block_shape, strict=True)):
        if hb == pb or hb is None or pb is None:
            check(hb == pb, f"block dim {d} is squeezed in one call only")
            continue
        options = [(consumer, h.index_map.affine[d], hb, pb)]
        if hb != h.shape[d]:  # a whole-dim consumer block follows the dims; a producer literal would not
            options.append((producer, out.index_map.affine[d], pb, hb))
        for call, row, old, new in options:
            axis = unit_row(row)
            found = [k for k in knobs if k.call == call and isinstance(axis, int) and axis in k.axes and k.value == old]
            if len(found) == 1 and wanted[call].get(found[0].name, new) == new:
                wanted[call][found[0].name] = new
                break
        else:
            whole = " (the consumer's block spans the whole dim)" if hb == h.shape[d] else ""
            check(False, f"no tile knob aligns block dim {d}: {hb} in the consumer, {pb} in the producer{whole}")
    for call, sizes in wanted.items():
        if sizes:
            ir = TilePass(call=call, sizes=tuple(sizes.items())).apply(ir)
    return ir


def _fuse(ir: KernelIR, lk: Link) -> cst.Module:
    """The module with the two linked calls rewritten into one."""
    module, pltpu = ensure_pltpu(ir.module)
    loc = Located.of(module)
    p_node, c_node = find_call_node(loc, lk.producer), find_call_node(loc, lk.consumer)
    for node, who in ((p_node, "producer"), (c_node, "consumer")):
        check(keyword(node, "grid_spec") is None, f"the {who} is written with grid_spec=")
    p_kernel, c_kernel = kernel_function(loc, p_node), kernel_function(loc, c_node)
    check(p_kernel is not None and c_kernel is not None, "cannot find both kernel functions")
    assert p_kernel is not None and c_kernel is not None
    p_arg, c_arg = kernel_arg(p_node), kernel_arg(c_node)
    edits: dict[cst.CSTNode, cst.CSTNode] = {}
    fused_name = fresh_name(module_names(module), f"_fused{_suffix(p_kernel)}{_suffix(c_kernel)}")
    renames = _consumer_renames(p_kernel, c_kernel)
    c_bound = tuple((renames.get(k, k), v) for k, v in c_arg.keywords)
    kernel = KernelArg(partial=c_arg.partial or p_arg.partial, keywords=c_bound)
    shared = _fused_call(loc, lk, p_node, c_node, (fused_name, p_arg, kernel), pltpu, edits)
    fused = _fused_kernel(lk, (p_kernel, p_arg), (c_kernel, c_arg), fused_name, pl_alias(module), shared, renames)
    spaced = fused.with_changes(leading_lines=[cst.EmptyLine()] * 2)
    edits[c_kernel] = cst.FlattenSentinel([c_kernel, spaced])  # type: ignore[assignment]
    return replace_many(loc.wrapper.module, edits)


def _consumer_renames(pk: cst.FunctionDef, ck: cst.FunctionDef) -> dict[str, str]:
    """New names for the consumer kernel's refs and keywords that the producer kernel also uses."""
    p_refs: list[str] = list(kernel_refs(pk) or [])
    c_refs: list[str] = list(kernel_refs(ck) or [])
    p_kw = [q.name.value for q in pk.params.kwonly_params]
    c_kw = [q.name.value for q in ck.params.kwonly_params]
    taken = set(p_refs) | set(p_kw) | used_names(pk.body)
    return {r: fresh_name(taken | set(c_refs) | set(c_kw), r) for r in (*c_refs, *c_kw) if r in taken}


@dataclass(frozen=True)
class KernelArg:
    """How a pallas_call names its kernel: `fn`, or `functools.partial(fn, kw=value, ...)` (`partial` is the callee
    as written, `keywords` the bound keyword arguments)."""

    partial: str = ""
    keywords: tuple[tuple[str, cst.BaseExpression], ...] = ()


def kernel_arg(node: cst.Call) -> KernelArg:
    """The kernel argument of pallas_call `node` (declines anything but a name or a keyword-only partial of one)."""
    first = node.args[0].value if node.args and node.args[0].keyword is None else None
    if isinstance(first, cst.Name):
        return KernelArg()
    ok = (
        isinstance(first, cst.Call)
        and is_call_to(first, "partial")
        and bool(first.args)
        and isinstance(first.args[0].value, cst.Name)
        and first.args[0].keyword is None
        and all(a.keyword is not None and not a.star for a in first.args[1:])
    )
    check(ok, "a kernel is passed through an expression other than a name or functools.partial(fn, keywords)")
    assert isinstance(first, cst.Call)
    keywords = tuple((a.keyword.value, a.value) for a in first.args[1:] if a.keyword is not None)
    return KernelArg(partial=code(first.func), keywords=keywords)


def _suffix(fn: cst.FunctionDef) -> str:
    name = fn.name.value.strip("_")
    return "_" + (name[: -len("_kernel")] if name.endswith("_kernel") else name)


def _fused_kernel(
    lk: Link,
    producer: tuple[cst.FunctionDef, KernelArg],
    consumer: tuple[cst.FunctionDef, KernelArg],
    name: str,
    pl: str,
    shared: dict[int, int],
    renames: dict[str, str],
) -> cst.FunctionDef:
    """`def fused(p_inputs, c_inputs but h, c_outputs, p_scratch, c_scratch, h_block, *, p_kw, c_kw)`: the
    producer's body with its output ref turned into the last scratch, then the consumer's body on it when the block
    is finished. Keyword-only parameters the calls bind through functools.partial stay keywords (the consumer's
    renamed where the producer uses the name: `renames`, from `_consumer_renames`). A consumer input `i` in `shared` reads the same
    block as producer input `shared[i]` on every step: the consumer's body reads that ref, and it is no parameter."""
    p, c = lk.producer, lk.consumer
    (pk, p_arg), (ck, c_arg) = producer, consumer
    p_refs, c_refs = kernel_refs(pk), kernel_refs(ck)
    check(p_refs is not None and c_refs is not None, "a kernel takes *args")
    assert p_refs is not None and c_refs is not None
    for fn, refs, call, arg in ((pk, p_refs, p, p_arg), (ck, c_refs, c, c_arg)):
        check(len(refs) == len(call.operands) + len(call.scratch), f"{fn.name.value}'s parameters do not match refs")
        check(fn.params.star_kwarg is None, f"{fn.name.value} takes **kwargs")
        given = {k for k, _ in arg.keywords}
        kwonly = {q.name.value for q in fn.params.kwonly_params}
        check(given <= kwonly, f"{fn.name.value} is bound keywords that are not keyword-only: {sorted(given - kwonly)}")
        unbound = [q.name.value for q in fn.params.kwonly_params if q.default is None and q.name.value not in given]
        check(not unbound, f"{fn.name.value}'s keywords {unbound} are not bound")
        check(not fn.decorators, f"{fn.name.value} is decorated")
    n_in = len(p.inputs)
    p_out = p_refs[n_in]
    p_kw = [q.name.value for q in pk.params.kwonly_params]
    renames = dict(renames)  # the caller's stays as given
    h = c_refs[lk.operand]
    renames[h] = p_out  # the consumer reads the producer's finished block
    renames |= {c_refs[i]: p_refs[j] for i, j in shared.items()}
    c_in = [renames.get(r, r) for i, r in enumerate(c_refs[: len(c.inputs)]) if i != lk.operand and i not in shared]
    c_rest = [renames.get(r, r) for r in c_refs[len(c.inputs) :]]
    c_out, c_scr = c_rest[: len(c.outputs)], c_rest[len(c.outputs) :]
    c_body = rename_names(ck.body, renames)
    check(isinstance(c_body, cst.IndentedBlock), f"{ck.name.value}'s body is on one line")
    assert isinstance(c_body, cst.IndentedBlock)
    leaks = (free_names(c_body) - bound_names(c_body) - set(renames.values())) & (
        bound_names(pk.body) | set(p_refs) | set(p_kw)
    )
    check(not leaks, f"the consumer reads names the producer's body binds: {sorted(leaks)}")
    for body, who in ((pk.body, "producer"), (c_body, "consumer")):
        check(program_id_axes(body) is not None, f"the {who} uses a program_id axis that is not a literal")
    pos = {a: i for i, a in enumerate(lk.order)}
    p_body = renumber_program_ids(pk.body, pos)
    params = [*p_refs[:n_in], *c_in, *c_out, *p_refs[n_in + 1 :], *c_scr, p_out]
    taken_all = used_names(pk) | used_names(ck)
    consume = fresh_name(taken_all, "_consume")
    c_body, hoisted = _hoist_program_ids(c_body, taken_all)
    conds = [f"{pl}.program_id({pos[a]}) == {pl}.num_programs({pos[a]}) - 1" for a in lk.inner]
    last = conds[0] if len(conds) == 1 else " & ".join(f"({c})" for c in conds)
    gap = [cst.EmptyLine(indent=False)]
    header = f"@{pl}.when({last})\n" if last else ""
    stub = cst.parse_statement(f"{header}def {consume}():\n    pass\n")
    assert isinstance(stub, cst.FunctionDef)
    first, *rest = p_body.body
    if hoisted:
        first = first.with_changes(leading_lines=gap)
    stmts: list[Any] = [*hoisted, first, *rest, stub.with_changes(body=c_body, leading_lines=gap)]
    if not last:  # the producer writes each block in one step: run the consumer right after it
        stmts.append(cst.parse_statement(f"{consume}()\n").with_changes(leading_lines=gap))
    keywords = [*_keyword_params(pk, {}), *_keyword_params(ck, renames)]
    text = f"def {name}({', '.join([*params, *(['*', *keywords] if keywords else [])])}):\n    pass\n"
    shell = cst.parse_statement(text)
    assert isinstance(shell, cst.FunctionDef)
    return shell.with_changes(body=p_body.with_changes(body=stmts))


def _keyword_params(fn: cst.FunctionDef, renames: dict[str, str]) -> list[str]:
    """`fn`'s keyword-only parameters as source (renamed, defaults kept, annotations dropped)."""
    out = []
    for q in fn.params.kwonly_params:
        n = renames.get(q.name.value, q.name.value)
        out.append(n if q.default is None else f"{n}={code(q.default)}")
    return out


def _hoist_program_ids(body: cst.IndentedBlock, taken: set[str]) -> tuple[cst.IndentedBlock, list[cst.BaseStatement]]:
    """The consumer's body with each `program_id(a)` / `num_programs(a)` read into a local at the top of the fused
    kernel: inside the fused kernel the consumer runs under a `pl.when`, and JAX 0.10.2's interpret mode cannot
    lower `program_id` in a `pl.when` nested in another (NotImplementedError: no MLIR rule for 'program_id')."""
    names: dict[str, str] = {}
    stmts: list[cst.BaseStatement] = []

    class Hoist(cst.CSTTransformer):
        def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
            if not m.matches(original, PROGRAM_ID):
                return updated
            text = code(original)
            if text not in names:
                kind = "pid" if "program_id" in code(original.func) else "npid"
                names[text] = fresh_name(taken | set(names.values()), f"_{kind}{code(original.args[0].value)}")
                stmts.append(cst.parse_statement(f"{names[text]} = {text}\n"))
            return cst.Name(names[text])

    out = body.visit(Hoist())
    assert isinstance(out, cst.IndentedBlock)
    return out, stmts


def _spec(
    spec: cst.BaseExpression | None,
    op: Operand,
    grid_names: Sequence[str],
    axis_of: dict[int, int],
    names: set[str],
    block: str | None = None,
) -> cst.Call:
    """The operand's BlockSpec over the fused grid: the same block (and other arguments), a new index map."""
    check(is_blockspec(spec), f"the {op.name} spec is not a BlockSpec(...)")
    assert isinstance(spec, cst.Call) and op.index_map.affine is not None
    shape, _ = blockspec_parts(spec)
    imap = index_map_expr(grid_names, affine_results(op.index_map.affine, grid_names, axis_of))
    block_expr = cst.parse_expression(block or block_text(shape, op.block_shape, names))
    rest = [a for a in spec.args if a.keyword is not None and a.keyword.value not in ("block_shape", "index_map")]
    for a in rest:
        check(portable(a.value, names), f"the {op.name} BlockSpec's {a.keyword.value}= reads local names")  # type: ignore[union-attr]
    return spec.with_changes(args=[cst.Arg(block_expr), cst.Arg(imap), *rest])


def _fused_call(
    loc: Located,
    lk: Link,
    p_node: cst.Call,
    c_node: cst.Call,
    kernel: tuple[str, KernelArg, KernelArg],
    pltpu: str,
    edits: dict[cst.CSTNode, cst.CSTNode],
) -> dict[int, int]:
    """Turn the consumer's pallas_call into the fused one, fed the producer's operands; the producer's result is
    only shape-traced (`jax.eval_shape`) where the wrapper still reads its shape. Returns the consumer inputs that
    read the same array in the same blocks as a producer input (`_shared_inputs`): the fused call takes them once."""
    p, c = lk.producer, lk.consumer
    module = loc.wrapper.module
    names = module_names(module)
    p_site, c_site = call_site(loc, p_node), call_site(loc, c_node, trailing_star=True)
    check(p_site is not None and c_site is not None, "a pallas_call is not applied to positional operands in place")
    assert p_site is not None and c_site is not None
    check(lk.operand < len(c_site.operands), "the consumer reads the producer's output through `*args`")
    p_ops, defaults = _operands_in_consumer_scope(
        loc, lk, p_site.operands, p_node, c_node, c_site.operands[lk.operand], edits
    )
    c_ops = list(c_site.operands)
    grid_names = [f"g{i}" for i in range(len(lk.order))]
    p_axis = {a: i for i, a in enumerate(lk.order)}
    p_specs = spec_list(loc, p_node, "in_specs")
    c_specs = spec_list(loc, c_node, "in_specs")
    c_outs = spec_list(loc, c_node, "out_specs")
    check(len(p_specs) == len(p.inputs) and len(c_specs) == len(c.inputs), "cannot read every in_specs entry")
    check(len(c_outs) == len(c.outputs), "cannot read every out_specs entry")
    scope_names = names | used_names(enclosing_function(loc, c_node) or module)
    # The producer's block shapes may read its function's names (`(tm, K)`) where the fused call sits in that same
    # function: written as the traced sizes they would hold only at the traced dims.
    same_fn = enclosing_function(loc, p_node) is enclosing_function(loc, c_node)
    p_names = scope_names if same_fn else names
    whole = _whole_dims(lk, p_ops, c_ops, scope_names)
    p_whole = {a: whole.get(i, {}) for a, i in p_axis.items()}
    in_specs = [
        _spec(s, o, grid_names, p_axis, p_names, _whole_block(s, o, p_whole, p_names))
        for s, o in zip(p_specs, p.inputs, strict=True)
    ]
    c_spec = _consumer_spec(loc, lk, p_node, grid_names, p_axis, scope_names, p_names, whole)
    c_in_specs = [c_spec(s, o) for i, (s, o) in enumerate(zip(c_specs, c.inputs, strict=True)) if i != lk.operand]
    out_specs = [c_spec(s, o) for s, o in zip(c_outs, c.outputs, strict=True)]
    shared = _shared_inputs(loc, lk, c_node, (p_ops, c_site.operands), (in_specs, c_in_specs), same_fn)
    in_specs += [sp for i, sp in zip(_others(lk), c_in_specs, strict=True) if i not in shared]
    grid = _grid(loc, lk, p_node, c_node, p_ops, p_names if same_fn else names)
    scratch = [*_scratch(loc, p_node, p, p_names, defaults), *_scratch(loc, c_node, c, scope_names)]
    out = p.outputs[0]
    p_out_specs = spec_list(loc, p_node, "out_specs")
    if None in out.block_shape:  # squeezed dims: the kernel sees the block without them, and so is the scratch
        written, _ = blockspec_parts(p_out_specs[0] if len(p_out_specs) == 1 else None)
        kept = [e.value for e in written.elements] if isinstance(written, cst.Tuple | cst.List) else []
        texts = [str(b) for b in _kept(out)]  # the traced sizes, unless the spec writes them in names it can read
        if len(kept) == len(out.block_shape):
            kept = [e for e, b in zip(kept, out.block_shape, strict=True) if b is not None]
            texts = [code(e) if portable(e, p_names) else t for e, t in zip(kept, texts, strict=True)]
        block = code(tuple_expr(texts))
    else:
        block = block_text(blockspec_parts(p_out_specs[0])[0] if p_out_specs else None, out.block_shape, p_names)
    scratch.append(cst.parse_expression(f"{pltpu}.VMEM({block}, {module_alias(module, 'jax.numpy')}.{out.dtype})"))
    out_arg = keyword(c_node, "out_specs")
    assert out_arg is not None
    single_out = not isinstance(resolve(loc, c_node, out_arg.value), cst.List | cst.Tuple)
    in_arg = keyword(c_node, "in_specs")
    reshape_to, new_kw = None, {}
    if lk.reshaped is not None:  # the fused call writes the producer's shape; the wrapper reshapes it back to rows
        reshape_to, new_kw["out_shape"] = _rows_out_shape(loc, p_node, c_node, p_names, scope_names)
    new_kw |= {
        "grid": grid,
        "in_specs": list_like(in_arg.value if in_arg is not None else None, in_specs),
        "out_specs": out_specs[0] if single_out else list_like(out_arg.value, out_specs),
        "scratch_shapes": list_like(None, scratch),
    }
    args = [cst.Arg(_kernel_expr(kernel, p_names, defaults), comma=c_node.args[0].comma)]
    for a in c_node.args[1:]:
        key = a.keyword.value if a.keyword is not None else None
        if key in DROPPED:
            continue
        args.append(a.with_changes(value=new_kw.pop(key)) if key in new_kw else a)
    new_call = c_node.with_changes(args=args)
    for key, value in new_kw.items():
        new_call = set_keyword(new_call, key, value)
    apply_args = [cst.Arg(o) for o in (*p_ops, *(c_ops[i] for i in _others(lk) if i < len(c_ops) and i not in shared))]
    if c_site.star is not None:  # `*rest` holds the consumer's last operands, read as they were
        apply_args.append(cst.Arg(c_site.star, star="*"))
    check(c_site.apply not in edits, "the consumer's operands and call overlap the producer's")
    applied = c_site.apply.with_changes(args=apply_args)
    if c_site.apply.func is c_node:
        applied = applied.with_changes(func=new_call)
    else:
        edits[c_node] = new_call
    if reshape_to is not None:
        applied = cst.Call(func=cst.Attribute(value=applied, attr=cst.Name("reshape")), args=[cst.Arg(reshape_to)])
    edits[c_site.apply] = applied
    return shared


def _others(lk: Link) -> list[int]:
    """The consumer's inputs other than the intermediate, by index."""
    return [i for i in range(len(lk.consumer.inputs)) if i != lk.operand]


def _shared_inputs(
    loc: Located,
    lk: Link,
    c_node: cst.Call,
    operands: tuple[Sequence[cst.BaseExpression], Sequence[cst.BaseExpression]],
    specs: tuple[Sequence[cst.Call], Sequence[cst.Call]],
    same_fn: bool,
) -> dict[int, int]:
    """Consumer input index -> producer input index, for consumer inputs that name the same array as a producer input
    (one name, never rebound in the function around both calls) with the same fused BlockSpec: the same block on
    every step, which the fused call reads once (a norm and the scaling of the rows it normed both read `x`)."""
    if not same_fn:
        return {}
    fn = enclosing_function(loc, c_node)
    rebound = bound_names(fn.body) if fn is not None else set()
    (p_ops, c_ops), (p_specs, c_specs) = operands, specs
    out: dict[int, int] = {}
    for i, spec in zip(_others(lk), c_specs, strict=True):
        op = c_ops[i] if i < len(c_ops) else None  # past the operands written out: a `*rest` holds them
        if not isinstance(op, cst.Name) or op.value in rebound:
            continue
        for j, (p_op, p_spec) in enumerate(zip(p_ops, p_specs, strict=True)):
            if isinstance(p_op, cst.Name) and p_op.value == op.value and code(p_spec) == code(spec):
                out[i] = j
                break
    return out


def _whole_dims(
    lk: Link, p_ops: Sequence[cst.BaseExpression], c_ops: Sequence[cst.BaseExpression], names: set[str]
) -> dict[int, dict[int, str]]:
    """For each fused grid position given one whole step (`Link.whole`): array size -> an expression of it in the
    wrapper (`x.shape[1]`), from the inputs either call walks along that axis."""
    pos = {a: i for i, a in enumerate(lk.order)}
    out: dict[int, dict[int, str]] = {pos[a]: {} for a in lk.whole}
    sides = ((lk.producer, p_ops, dict(pos)), (lk.consumer, c_ops, {c: pos[a] for c, a in enumerate(lk.sigma)}))
    for call, ops, where in sides:
        for i, (o, expr) in enumerate(zip(call.inputs, ops, strict=False)):
            if (call is lk.consumer and i == lk.operand) or not portable(expr, names):
                continue
            assert o.index_map.affine is not None
            for d, row in enumerate(o.index_map.affine):
                axis = unit_row(row)
                k = where.get(axis) if type(axis) is int else None  # not False (== 0) or None
                if k in out:
                    out[k].setdefault(o.shape[d], f"{code(expr)}.shape[{d}]")
    return out


def _whole_block(
    spec: cst.BaseExpression | None, o: Operand, whole: dict[int, dict[int, str]], names: set[str]
) -> str | None:
    """The block of operand `o` with each dim its grid axis `a` walks spanning the whole array dim (`whole[a]`: size
    -> expression, for the axes given one whole step); None when no dim is."""
    assert o.index_map.affine is not None
    axes = [unit_row(row) for row in o.index_map.affine]
    hit = {d: whole[a] for d, a in enumerate(axes) if type(a) is int and whole.get(a)}  # not False (== 0)
    if not hit:
        return None
    shape, _ = blockspec_parts(spec) if is_blockspec(spec) else (None, None)
    written = shape.elements if isinstance(shape, cst.Tuple | cst.List) else ()
    items = []
    for d, b in enumerate(o.block_shape):
        if d in hit:
            check(o.shape[d] in hit[d], f"no input gives the size of {o.name} dim {d} in the wrapper")
            items.append(hit[d][o.shape[d]])
        elif len(written) == len(o.block_shape) and portable(written[d].value, names):
            items.append(code(written[d].value))
        else:
            items.append("None" if b is None else str(b))
    return code(tuple_expr(items))


def _kept(o: Operand) -> list[int]:
    """The block's sizes the kernel sees (squeezed dims dropped)."""
    return [b for b in o.block_shape if b is not None]


def _consumer_spec(
    loc: Located,
    lk: Link,
    p_node: cst.Call,
    grid_names: Sequence[str],
    p_axis: dict[int, int],
    scope_names: set[str],
    p_names: set[str],
    whole: dict[int, dict[int, str]],
) -> Any:
    """How each consumer operand's BlockSpec reads over the fused grid: as it was (its blocks kept), or, for a
    reblocked (elementwise) consumer, blocked exactly like the producer's output, and its per-column rows (1, C)
    following the output blocks' last dim."""
    p, c = lk.producer, lk.consumer
    out, h = p.outputs[0], c.inputs[lk.operand]
    if not lk.reblock:
        c_axis = {a: a for a in range(len(c.grid))}
        c_whole = {a: whole.get(a, {}) for a in c_axis}
        return lambda s, o: _spec(s, o, grid_names, c_axis, scope_names, _whole_block(s, o, c_whole, scope_names))
    p_out_spec = spec_list(loc, p_node, "out_specs")
    shape, _ = blockspec_parts(p_out_spec[0] if len(p_out_spec) == 1 else None)
    c_block = block_text(shape, out.block_shape, p_names)
    last = shape.elements[-1].value if isinstance(shape, cst.Tuple | cst.List) and shape.elements else None
    last_text = code(last) if last is not None and portable(last, p_names) else str(out.block_shape[-1])
    assert out.index_map.affine is not None
    width = len(out.index_map.affine[-1])
    row = replace(
        out,
        shape=(1, out.shape[-1]),
        block_shape=(1, out.block_shape[-1]),
        index_map=replace(out.index_map, affine=((0,) * width, out.index_map.affine[-1])),
    )

    def spec(s: cst.BaseExpression | None, o: Operand) -> cst.Call:
        if o.role == "in" and not blocked_like(o, h) and is_column_row(o, h):
            return _spec(s, row, grid_names, p_axis, scope_names, f"(1, {last_text})")
        return _spec(s, out, grid_names, p_axis, scope_names, c_block)

    return spec


def _rows_out_shape(
    loc: Located, p_node: cst.Call, c_node: cst.Call, p_names: set[str], scope_names: set[str]
) -> tuple[cst.BaseExpression, cst.BaseExpression]:
    """For a consumer that read the producer's output reshaped to rows: (the consumer's own result shape, which
    the fused result is reshaped back to, and its out_shape with the producer's shape and the consumer's dtype)."""
    structs = []
    for node, who, names in ((p_node, "producer", p_names), (c_node, "consumer", scope_names)):
        arg = keyword(node, "out_shape")
        value = resolve(loc, node, arg.value) if arg is not None else None
        ok = isinstance(value, cst.Call) and len(value.args) >= 2 and all(a.keyword is None for a in value.args[:2])
        check(ok, f"the {who}'s out_shape is not a ShapeDtypeStruct(shape, dtype)")
        assert isinstance(value, cst.Call)
        check(portable(value.args[0].value, names), f"the {who}'s out_shape reads names the fused call cannot")
        structs.append(value)
    p_struct, c_struct = structs
    new = c_struct.with_changes(args=[p_struct.args[0], *c_struct.args[1:]])
    return c_struct.args[0].value, new


def _kernel_expr(
    kernel: tuple[str, KernelArg, KernelArg], p_names: set[str], defaults: dict[str, cst.BaseExpression]
) -> cst.BaseExpression:
    """The fused call's kernel: the fused function's name, or a functools.partial binding the producer's keywords
    (their values written with the producer helper's defaults, where they must read no other name of it) and the
    consumer's."""
    name, p_arg, c_arg = kernel
    bound = []
    for k, v in p_arg.keywords:
        value = inline_names(v, defaults)
        check(portable(value, p_names), f"the producer's kernel keyword {code(v)} reads names local to its function")
        bound.append((k, value))
    bound += c_arg.keywords
    if not bound:
        return cst.Name(name)
    func = cst.parse_expression(c_arg.partial or p_arg.partial)
    return cst.Call(func=func, args=[cst.Arg(cst.Name(name)), *(keyword_arg(k, v) for k, v in bound)])


def _operands_in_consumer_scope(
    loc: Located,
    lk: Link,
    p_ops: Sequence[cst.BaseExpression],
    p_node: cst.Call,
    c_node: cst.Call,
    h_expr: cst.BaseExpression,
    edits: dict[cst.CSTNode, cst.CSTNode],
) -> tuple[list[cst.BaseExpression], dict[str, cst.BaseExpression]]:
    """The producer's operands as the consumer's function can name them (with the defaults of the producer helper's
    parameters its call leaves out), and the edit that keeps (or drops) the producer's result in the wrapper."""
    c_fn, p_fn = enclosing_function(loc, c_node), enclosing_function(loc, p_node)
    if lk.reshaped is not None:  # `y.reshape(rows, C)` or `jnp.reshape(y, (rows, C))`: the intermediate is `y`
        h_expr = _reshaped_name(loc, h_expr)
    value: cst.BaseExpression | None = h_expr
    if (
        isinstance(h_expr, cst.Name)
        and c_fn is not None
        and c_fn is not p_fn
        and h_expr.value in {q.name.value for q in c_fn.params.params}
    ):
        return _through_parameter(loc, c_fn, h_expr.value, p_fn, p_ops, edits)
    if isinstance(h_expr, cst.Name):
        value = resolve(loc, c_node, h_expr, hops=1)
        check(value is not None, f"cannot find where {h_expr.value} is assigned")
        assert value is not None
        stmt_parent = loc.parent(value)
        check(isinstance(stmt_parent, cst.Assign), f"{h_expr.value} is not assigned by a plain `=`")
        jax = module_alias(loc.wrapper.module, "jax")
        check(jax is not None, "the module does not import jax")
        assert jax is not None
        # The wrapper may still read the intermediate's shape (`M, N = h.shape`): keep it as a shape, computed
        # without running anything.
        fn = enclosing_function(loc, c_node)
        reads = [n for n in m.findall(fn or loc.wrapper.module, m.Name(h_expr.value)) if n is not h_expr]
        line = loc.parent(stmt_parent) if stmt_parent is not None else None
        if len(reads) == 1 and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            edits[line] = cst.RemovalSentinel.REMOVE  # type: ignore[assignment]  # nothing else reads it
        else:
            edits[value] = _shape_of(jax, value)
    # `value` is the producer's application, or a call of the helper function that returns it.
    if p_fn is c_fn:
        check(
            value is not None and any(n is p_node for n in _calls_in(value)),
            "the producer's result reaches the consumer through an expression pallasopt cannot follow",
        )
        return list(p_ops), {}
    return _producer_operands(value, p_fn, p_ops)


def _reshaped_name(loc: Located, expr: cst.BaseExpression) -> cst.Name:
    """The name reshaped in the consumer's operand `expr` (`y.reshape(...)` or `jnp.reshape(y, ...)`)."""
    name: cst.BaseExpression | None = None
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "reshape":
        jnp = module_alias(loc.wrapper.module, "jax.numpy")
        name = expr.args[0].value if jnp is not None and code(expr.func) == f"{jnp}.reshape" else expr.func.value
    check(isinstance(name, cst.Name), f"the consumer's operand {code(expr)} is not a reshape of a named result")
    assert isinstance(name, cst.Name)
    return name


def _producer_operands(
    value: cst.BaseExpression | None, p_fn: cst.FunctionDef | None, p_ops: Sequence[cst.BaseExpression]
) -> tuple[list[cst.BaseExpression], dict[str, cst.BaseExpression]]:
    """The producer's operands as the caller of its helper function `p_fn` passes them in `value` (`p_fn(x, w)`),
    and the defaults of the parameters that call leaves out (`tm=128`)."""
    check(
        isinstance(value, cst.Call) and isinstance(value.func, cst.Name),
        "the consumer reads a result it cannot trace back",
    )
    assert isinstance(value, cst.Call) and isinstance(value.func, cst.Name)
    check(p_fn is not None, "the producer's pallas_call is not in a function")
    assert p_fn is not None
    check(
        value.func.value == p_fn.name.value, f"{code(value)} does not call {p_fn.name.value}, the producer's function"
    )
    check(all(a.keyword is None and not a.star for a in value.args), f"{code(value)} passes keywords")
    params = [q.name.value for q in p_fn.params.params]
    binding = {params[i]: a.value for i, a in enumerate(value.args) if i < len(params)}
    out: list[cst.BaseExpression] = []
    for op in p_ops:
        check(
            isinstance(op, cst.Name) and op.value in binding,
            f"the producer's operand {code(op)} is not one of {p_fn.name.value}'s parameters",
        )
        assert isinstance(op, cst.Name)
        out.append(binding[op.value])
    left = [*p_fn.params.params[len(value.args) :], *p_fn.params.kwonly_params]
    return out, {q.name.value: q.default for q in left if q.default is not None}


def _through_parameter(
    loc: Located,
    c_fn: cst.FunctionDef,
    h: str,
    p_fn: cst.FunctionDef | None,
    p_ops: Sequence[cst.BaseExpression],
    edits: dict[cst.CSTNode, cst.CSTNode],
) -> tuple[list[cst.BaseExpression], dict[str, cst.BaseExpression]]:
    """The consumer sits in a helper that takes the intermediate as parameter `h`, called once as
    `consumer(producer(x, w))` (or with a name assigned that call). The helper gains keyword-only parameters for the
    producer's operands, passed at the call site, and `h` becomes the intermediate's shape (`jax.eval_shape`), which
    is all the helper still reads of it (re-tracing checks that). Returns the new parameters' names and the
    producer helper's defaults its call leaves out."""
    module = loc.wrapper.module
    jax = module_alias(module, "jax")
    check(jax is not None, "the module does not import jax")
    assert jax is not None
    sites = [c for c in m.findall(module, m.Call(func=m.Name(c_fn.name.value))) if isinstance(c, cst.Call)]
    check(len(sites) == 1, f"{c_fn.name.value} is called {len(sites)} times")
    site = sites[0]
    names = [q.name.value for q in c_fn.params.params]
    i = names.index(h)
    check(
        all(a.keyword is None and not a.star for a in site.args[: i + 1]) and len(site.args) > i,
        f"{code(site)} does not pass {h} by position",
    )
    arg = site.args[i].value
    value = resolve(loc, site, arg, hops=1) if isinstance(arg, cst.Name) else arg
    operands, defaults = _producer_operands(value, p_fn, p_ops)
    assert value is not None
    shape = _shape_of(jax, value)
    if isinstance(arg, cst.Name):
        stmt = loc.parent(value)
        check(isinstance(stmt, cst.Assign), f"{arg.value} is not assigned by a plain `=`")
        edits[value] = shape
    taken = used_names(c_fn) | module_names(module)
    fresh: list[str] = []
    for op in p_ops:
        assert isinstance(op, cst.Name)
        fresh.append(fresh_name(taken | set(fresh), op.value))
    edits[c_fn.params] = with_keyword_only(c_fn.params, fresh)
    new_args = [*site.args[:i], site.args[i].with_changes(value=arg if isinstance(arg, cst.Name) else shape)]
    new_args += [*site.args[i + 1 :]]
    if new_args[-1].comma is cst.MaybeSentinel.DEFAULT:
        new_args[-1] = new_args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    new_args += [keyword_arg(n, o) for n, o in zip(fresh, operands, strict=True)]
    check(site not in edits, f"{code(site)} is edited twice")
    edits[site] = site.with_changes(args=new_args)
    return [cst.Name(n) for n in fresh], defaults


def _shape_of(jax: str, value: cst.BaseExpression) -> cst.BaseExpression:
    """`jax.eval_shape(lambda: value)`: the intermediate's shape and dtype, computed without running anything."""
    return cst.parse_expression(f"{jax}.eval_shape(lambda: {code(value)})")


def _calls_in(expr: cst.CSTNode) -> list[cst.CSTNode]:
    return list(m.findall(expr, m.Call())) + ([expr] if isinstance(expr, cst.Call) else [])


def _grid(
    loc: Located, lk: Link, p_node: cst.Call, c_node: cst.Call, p_ops: Sequence[cst.BaseExpression], names: set[str]
) -> cst.Tuple:
    """The consumer's grid extents (when its blocks are kept), then each producer reduction axis, as
    `pl.cdiv(operand.shape[d], block)` over a producer input that axis walks."""
    items: list[cst.BaseExpression] = []
    if not lk.reblock:
        _holder, arg = grid_spec_keyword(loc, c_node, "grid")
        check(arg is not None, "the consumer has no grid=")
        assert arg is not None
        grid = resolve(loc, c_node, arg.value)
        check(
            isinstance(grid, cst.Tuple) and len(grid.elements) == len(lk.consumer.grid),
            "the consumer's grid is not a tuple",
        )
        assert isinstance(grid, cst.Tuple)
        ones = {c for c, a in enumerate(lk.sigma) if a in lk.whole}  # one step over the whole dim
        items = [cst.Integer("1") if c in ones else e.value for c, e in enumerate(grid.elements)]
    axes = lk.inner if not lk.reblock else lk.order
    p_specs = spec_list(loc, p_node, "in_specs")
    for axis in axes:
        items.append(
            _extent(loc, lk.producer, axis, p_specs, p_ops, names) or _out_extent(loc, lk, p_node, axis, names)
        )
    return tuple_expr(items)


def _out_extent(loc: Located, lk: Link, p_node: cst.Call, axis: int, names: set[str]) -> cst.BaseExpression:
    """`pl.cdiv(n, block)` for a producer axis only its output walks, read from the producer's out_shape and
    output block as written (both must read names the fused call can; else the fusion is declined: a literal would
    hold only at the traced dims)."""
    out = lk.producer.outputs[0]
    assert out.index_map.affine is not None
    dims = [d for d, row in enumerate(out.index_map.affine) if unit_row(row) == axis]
    arg = keyword(p_node, "out_shape")
    struct = resolve(loc, p_node, arg.value) if arg is not None else None
    shape = struct.args[0].value if isinstance(struct, cst.Call) and struct.args else None
    p_out = spec_list(loc, p_node, "out_specs")
    block, _ = blockspec_parts(p_out[0] if len(p_out) == 1 else None)
    ok = bool(dims) and all(isinstance(t, cst.Tuple | cst.List) for t in (shape, block))
    check(ok, f"no producer input walks its grid axis {axis}, and its out_shape and block are not literal tuples")
    assert isinstance(shape, cst.Tuple | cst.List) and isinstance(block, cst.Tuple | cst.List)
    n, b = shape.elements[dims[0]].value, block.elements[dims[0]].value
    check(portable(n, names) and portable(b, names), f"the producer's grid axis {axis} follows names of its function")
    if out.block_shape[dims[0]] is None:  # a squeezed dim: one block per index
        return n
    return cst.parse_expression(f"{pl_alias(loc.wrapper.module)}.cdiv({code(n)}, {code(b)})")


def _extent(
    loc: Located,
    p: CallFacts,
    axis: int,
    p_specs: Sequence[cst.BaseExpression | None],
    p_ops: Sequence[cst.BaseExpression],
    names: set[str],
) -> cst.BaseExpression | None:
    """`pl.cdiv(x.shape[d], block)` for the first producer input whose block dim d walks grid `axis` (None: no
    input does)."""
    for i, op in enumerate(p.inputs):
        assert op.index_map.affine is not None
        for d, row in enumerate(op.index_map.affine):
            size = op.block_shape[d]
            if unit_row(row) != axis:
                continue
            if size is None:  # a squeezed dim: one block per index
                check(op.shape[d] == p.grid[axis], f"the producer's axis {axis} does not cover input {i}")
                return cst.parse_expression(f"{code(p_ops[i])}.shape[{d}]")
            check(-(-op.shape[d] // size) == p.grid[axis], f"the producer's axis {axis} does not cover input {i}")
            shape, _ = blockspec_parts(p_specs[i])
            written = shape.elements[d].value if isinstance(shape, cst.Tuple | cst.List) else None
            text = code(written) if written is not None and portable(written, names) else str(size)
            return cst.parse_expression(f"{pl_alias(loc.wrapper.module)}.cdiv({code(p_ops[i])}.shape[{d}], {text})")
    # No input walks the axis (its maps hold it constant as written): the extent is read from the output
    # (`_out_extent`), or, for a reduction axis no block walks, the fusion is declined: neither the extent nor the
    # fused index maps could follow it at a size where it has more steps (a literal 1 would reduce only the first
    # block there, and the oracle's dims never exceed the defaults). A one-step axis a map walks as written (a
    # whole-K block) has its coefficient: `trace._fit_affine` probes index 1 on it.
    return None


def _scratch(
    loc: Located,
    node: cst.Call,
    call: CallFacts,
    names: set[str],
    defaults: dict[str, cst.BaseExpression] | None = None,
) -> list[cst.BaseExpression]:
    """The call's scratch_shapes entries, movable to the fused call: reading module names, or names of its helper's
    parameters that the helper's call leaves at their `defaults` (written as those values)."""
    if not call.scratch:
        return []
    _holder, arg = grid_spec_keyword(loc, node, "scratch_shapes")
    value = resolve(loc, node, arg.value) if arg is not None else None
    check(isinstance(value, cst.List | cst.Tuple), "scratch_shapes is not a literal list")
    assert isinstance(value, cst.List | cst.Tuple)
    items = [inline_names(e.value, defaults or {}) for e in value.elements]
    check(len(items) == len(call.scratch), "scratch_shapes does not list every scratch buffer")
    for s in items:
        check(portable(s, names), f"the scratch {code(s)} reads names local to its function")
    return items


def _verify(before: KernelIR, after: KernelIR, lk: Link) -> None:
    """The rewrite traced to one call fewer, with the consumer's outputs, over the fused grid."""
    check(len(after.calls) == len(before.calls) - 1, f"the rewrite traced to {len(after.calls)} pallas_calls")
    got = after.calls[lk.consumer.index - 1]
    want_grid = tuple(1 if a in lk.whole else lk.producer.grid[a] for a in lk.order)
    check(got.grid == want_grid, f"the fused call traced to grid {got.grid}, not {want_grid}")
    want = [(o.shape, o.dtype) for o in lk.consumer.outputs]
    if lk.reshaped is not None:  # written in the producer's shape, reshaped back to rows in the wrapper
        want = [(lk.producer.outputs[0].shape, o.dtype) for o in lk.consumer.outputs]
    check([(o.shape, o.dtype) for o in got.outputs] == want, "the fused call's outputs differ from the consumer's")
