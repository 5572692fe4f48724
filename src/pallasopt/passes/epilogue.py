"""epilogue: move the wrapper's elementwise work on a pallas_call's result into the kernel, before the store."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from ..cost_model.hardware import Chip
from ..errors import KernelError, PassNotApplicable, check
from ..ir.builders import affine_results, fresh_name, substitute
from ..ir.cst_edit import ensure_pltpu, list_like, replace_many, set_keyword
from ..ir.epilogue import Epilogue, find_epilogue, follow, leaves
from ..ir.epilogue_reach import OperandLayout, Sunk, sink_into_helper, to_output_layout
from ..ir.facts import CallFacts, Operand
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    Located,
    blockspec_parts,
    call_site,
    code,
    descendants,
    find_call_node,
    free_names,
    grid_spec_keyword,
    is_self_assign,
    jnp_alias,
    keyword,
    module_alias,
    pl_alias,
    pltpu_alias,
    resolve,
    spec_list,
    used_names,
)
from ..ir.trace import trace_entry
from ..pyparse import parse_expression
from .base import Pass


@dataclass(frozen=True)
class EpiloguePass(Pass):
    """Move the elementwise work the wrapper does on pallas_call `call`'s result (a bias or residual add, an
    activation, a scale, a cast; `y = call(...); y = y + b; return relu(y)` chains too) into the kernel: the
    kernel computes into a VMEM scratch block and stores `epilogue(block, operand blocks)` on the last step of the
    output's reduction axes. An operand the epilogue reads becomes a new input blocked like the output (a dim of
    size 1 broadcasts: block 1, index 0); literals and module constants stay Python values.

    Helps wherever the wrapper reads the kernel's result back from HBM only to write a same-sized array (an
    XLA elementwise fusion after the call): that round trip goes, and the call writes the final dtype (a cast to
    bf16 halves the write). Parameters: `call` (index of the pallas_call). Declines when the result is reduced,
    reshaped, indexed or read twice in the wrapper, when the epilogue reads another call's result computed later,
    for several outputs, aliasing, or an output revisited across a grid axis that is not innermost.
    """

    name: ClassVar[str] = "epilogue"
    call: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        seen: set[tuple[int, int] | None] = set()
        for c in ir.calls:
            try:
                _plan(ir, c)
                if c.span in seen:  # the same pallas_call traced again: the same rewrite
                    continue
                seen.add(c.span)
            except PassNotApplicable as e:
                try:  # the call's value returned by a helper whose caller has an epilogue (CST only, no trace)
                    _sink_plan(ir, c, e)
                except (PassNotApplicable, KernelError):
                    continue
            except KernelError:
                continue
            out.append(cls(call=c.index))
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        base, plan = ir, None
        try:
            plan = _plan(ir, facts)
        except PassNotApplicable as e:
            sunk = _sunk(ir, facts, e)  # the call's value is returned by a helper: its caller's epilogue moves in
            base, facts, plan = sunk
        try:  # first with the operands unblocked (memory_space=ANY) to learn their traced shapes
            probe = base.with_module(_rewrite(base, facts, plan, None), self.spec())
            n = len(facts.inputs)
            got = [o.shape for o in probe.calls[facts.index].inputs[n : n + len(plan.operands) + 1]]
            reshaped = got[len(plan.operands)] if plan.reshape is not None else None
            out_text = _out_shape_text(base, facts)
            layouts = [
                to_output_layout(name, code(op), got[k], reshaped, facts.outputs[0].shape, out_text, _jnp(base))
                if plan.relayout[k]
                else OperandLayout((), got[k])
                for k, (name, op) in enumerate(zip(_operand_names(base, plan), plan.operands, strict=True))
            ]
            new = ir.with_module(_rewrite(base, facts, plan, layouts), self.spec())
        except KernelError as e:  # a rewrite this pass got wrong: decline with why, the search goes on
            raise PassNotApplicable(f"the rewritten module does not trace: {e.message}") from None
        _verify(ir, new, facts)
        return new


def _sunk(ir: KernelIR, facts: CallFacts, declined: PassNotApplicable) -> tuple[KernelIR, CallFacts, Epilogue]:
    """When the call's value is returned as it is by a helper, the module with its caller's epilogue moved into
    the helper (or into a copy for that call site), re-traced, with the call and plan there; else `declined`."""
    moved = _sink_plan(ir, facts, declined)
    try:
        mid = ir.with_module(moved.module, "epilogue-sink")
    except KernelError as e:
        raise PassNotApplicable(
            f"the caller's epilogue moved into {moved.helper} does not trace: {e.message}"
        ) from None
    check(len(mid.calls) == len(ir.calls), "moving the caller's epilogue into the helper changes the calls traced")
    mloc = Located.of(mid.module)
    helper = next(f for f in mid.module.body if isinstance(f, cst.FunctionDef) and f.name.value == moved.helper)
    lo, hi = mloc.start(helper)[0], mloc.end_line(helper)
    inside = [c for c in mid.calls if c.span is not None and lo <= c.span[0] <= hi]
    check(bool(inside), f"no traced call comes from {moved.helper} after moving the caller's epilogue")
    return mid, inside[0], _plan(mid, inside[0])


def _sink_plan(ir: KernelIR, facts: CallFacts, declined: PassNotApplicable) -> Sunk:
    """The module with the caller's epilogue moved into the helper returning the call's value, else `declined`."""
    loc = Located.of(ir.module)
    try:
        node = find_call_node(loc, facts)
        site = call_site(loc, node)
    except PassNotApplicable:
        raise declined from None
    if site is None or not follow(loc, site.apply).returned:
        raise declined
    same = [c.index for c in ir.calls if c.span == facts.span]
    return sink_into_helper(loc, site.apply, same.index(facts.index), len(same))


def _jnp(ir: KernelIR) -> str:
    return jnp_alias(ir.module) or "jnp"


def _out_shape_text(ir: KernelIR, facts: CallFacts) -> str:
    old_out = keyword(find_call_node(Located.of(ir.module), facts), "out_shape")
    check(old_out is not None, "the call has no out_shape=")
    assert old_out is not None
    return code(old_out.value)


def _operand_names(ir: KernelIR, plan: Epilogue) -> list[str]:
    used = used_names(plan.fn) | used_names(ir.module)
    return [fresh_name(used, f"_e{i}") for i in range(len(plan.operands))]


def _plan(ir: KernelIR, facts: CallFacts) -> Epilogue:
    check(facts.library_site is None, f"call {facts.index} is a library kernel")
    check(len(facts.outputs) == 1, "the call has several outputs")
    check(not facts.input_output_aliases, "the call aliases an input to its output")
    check(not facts.dynamic_axes, "the call has a grid extent known only at run time")
    out = facts.outputs[0]
    check(out.is_pipelined and out.index_map.affine is not None, "the output is not a blocked VMEM operand")
    loc = Located.of(ir.module)
    node = find_call_node(loc, facts)
    site = call_site(loc, node)
    check(site is not None, "the pallas_call is not applied to positional operands in place")
    assert site is not None
    _reduction_axes(facts)
    return find_epilogue(loc, site.apply)


def _reduction_axes(facts: CallFacts) -> tuple[int, ...]:
    """The grid axes the output block stays put along (its accumulation axes); they must be the innermost ones."""
    affine = facts.outputs[0].index_map.affine
    assert affine is not None
    n = len(facts.grid)
    # An axis of extent 1 at the traced dims fits any coefficient: it is no evidence of accumulation.
    red = tuple(a for a in range(n) if facts.grid[a] > 1 and all(row[a] == 0 for row in affine))
    inner = tuple(a for a in range(n) if a >= min(red, default=n) and facts.grid[a] > 1)
    check(red == inner, f"the output block is revisited across grid axes {red}, not innermost")
    return red


def _spec_for(
    shape: tuple[int, ...], out: Operand, out_spec: cst.Call, pl: str, grid_names: Sequence[str]
) -> cst.BaseExpression:
    """The operand's BlockSpec: the output's block and index in each dim it shares, block 1 at index 0 where it is
    broadcast (size 1)."""
    block, imap = blockspec_parts(out_spec)
    check(isinstance(block, cst.Tuple | cst.List), "the output's block shape is not written as a tuple")
    assert isinstance(block, cst.Tuple | cst.List) and out.index_map.affine is not None
    dims = [code(e.value) for e in block.elements]
    body = imap.body if isinstance(imap, cst.Lambda) else None
    written = len(imap.params.params) == len(grid_names) if isinstance(imap, cst.Lambda) else False
    if written and isinstance(body, cst.Tuple) and len(body.elements) == len(shape):
        results = [code(e.value) for e in body.elements]  # the output's map as written: dims-generic
    else:  # from the traced affine fit
        results = affine_results(out.index_map.affine, grid_names, {a: a for a in range(len(grid_names))})
    blocks, idx = [], []
    for d, (size, full) in enumerate(zip(shape, out.shape, strict=True)):
        if size == full:
            blocks.append(dims[d])
            idx.append(results[d])
        else:
            check(size == 1, f"an operand of shape {shape} does not broadcast to the output's {out.shape}")
            check(out.block_shape[d] is not None, f"an operand broadcasts along the output's squeezed dim {d}")
            blocks.append("1")
            idx.append("0")
    params = ", ".join(grid_names)
    tup = lambda xs: f"({xs[0]},)" if len(xs) == 1 else f"({', '.join(xs)})"
    return cst.parse_expression(f"{pl}.BlockSpec({tup(blocks)}, lambda {params}: {tup(idx)})")


def _rewrite(ir: KernelIR, facts: CallFacts, plan: Epilogue, layouts: list[OperandLayout] | None) -> cst.Module:
    """The module with the epilogue in the kernel; `layouts=None` gives the probe (operands passed unblocked, and
    the reshaped output's shape as one more operand when the chain reshapes)."""
    module = ir.module
    loc = Located.of(module)
    node = find_call_node(loc, facts)
    site = call_site(loc, node)
    assert site is not None
    pl, jnp, jax = pl_alias(module), jnp_alias(module), module_alias(module, "jax")
    check(jnp is not None and jax is not None, "the module does not import jax and jax.numpy")
    assert jnp is not None and jax is not None
    pltpu = pltpu_alias(module) or fresh_name(used_names(module), "pltpu")
    fn = plan.fn
    used = used_names(fn) | used_names(module)
    names = {w: fresh_name(used, w) for w in ("_epilogue", "_epilogue_kernel", "refs", "_last", "_store", "o")}
    ops = _operand_names(ir, plan)
    out = facts.outputs[0]
    rank = len(out.shape)

    # The epilogue as a function of the output block and the operand blocks, one statement per wrapper statement.
    o = names["o"]
    leaf_of = {code(e): n for e, n in zip(plan.operands, ops, strict=True)}
    lines = []
    for r in plan.regions:
        mapping: dict[cst.CSTNode, cst.CSTNode] = {u: cst.Name(o) for u in r.uses}
        for leaf in leaves(loc, r.top, r.uses):
            if code(leaf) in leaf_of:
                mapping[leaf] = cst.Name(leaf_of[code(leaf)])
        lines.append(f"    {o} = {ast.unparse(parse_expression(code(substitute(r.top, mapping)).strip()))}\n")
    epi = f"def {names['_epilogue']}({', '.join([o, *ops])}):\n" + "".join(lines) + f"    return {o}\n"

    # The operands, computed in the wrapper (brought to the output's layout and rank once their shapes are known).
    assigns = []
    shapes: list[tuple[int, ...]] | None = None if layouts is None else []
    for name, expr, k in zip(ops, plan.operands, range(len(ops)), strict=True):
        text = code(expr)
        if layouts is None or shapes is None:
            assigns.append(f"{name} = {jnp}.asarray({text})\n")
            continue
        lines, shape = list(layouts[k].lines), layouts[k].shape
        if len(shape) < rank:
            missing = tuple(range(rank - len(shape)))
            lines.append(f"{name} = {jnp}.expand_dims({name}, {missing})\n")
            shape = (1,) * len(missing) + tuple(shape)
        if len(lines) == 1 and not layouts[k].lines:  # only the rank alignment: one statement, as written
            lines = [f"{name} = {jnp}.expand_dims({text}, {missing})\n"]
        else:
            lines.insert(0, f"{name} = {text}\n")
        assigns += lines
        shapes.append(tuple(shape))
    probe_ops = list(ops)
    if layouts is None and plan.reshape is not None:
        v = fresh_name(used | set(ops), "_v")
        inner = plan.reshape.func.value if isinstance(plan.reshape.func, cst.Attribute) else plan.reshape.args[0].value
        shaped = code(substitute(plan.reshape, {inner: cst.Name(v)}))
        old_out = keyword(node, "out_shape")
        check(old_out is not None, "the call has no out_shape=")
        assert old_out is not None
        probe_ops.append(fresh_name(used | set(ops) | {v}, "_er"))
        assigns.append(
            f"{probe_ops[-1]} = {jnp}.zeros({jax}.eval_shape(lambda {v}: {shaped}, {code(old_out.value)}).shape,"
            f" {jnp}.int8)\n"
        )

    # The kernel: the original one computing into a scratch block, then the store of the epilogue's value.
    n_in = facts.num_scalar_prefetch + len(facts.inputs)
    refs, n_e = names["refs"], len(probe_ops)
    kexpr = node.args[0].value if node.args and node.args[0].keyword is None else None
    karg = keyword(node, "kernel")
    kexpr = kexpr if kexpr is not None else (karg.value if karg is not None else None)
    check(kexpr is not None, "cannot find the pallas_call's kernel argument")
    assert kexpr is not None
    red = _reduction_axes(facts)
    out_map = blockspec_parts(spec_list(loc, node, "out_specs")[0])[1]
    if isinstance(out_map, cst.Lambda) and len(out_map.params.params) == len(facts.grid):
        read = free_names(out_map.body)  # as written: an axis of extent 1 at the traced dims is told apart
        red = tuple(a for a, p in enumerate(out_map.params.params) if p.name.value not in read)
        check(red == tuple(range(len(facts.grid) - len(red), len(facts.grid))), f"grid axes {red} are not innermost")
    reads = ", ".join([f"{refs}[-1][...]", *(f"{refs}[{n_in + i}][...]" for i in range(n_e))])
    store = f"{refs}[{n_in + n_e}][...] = {names['_epilogue']}({reads})"
    body = [f"    {code(kexpr)}(*{refs}[:{n_in}], {refs}[-1], *{refs}[{n_in + n_e + 1}:-1])\n"]
    if shapes is not None and red:
        conds = [f"({pl}.program_id({a}) == {pl}.num_programs({a}) - 1)" for a in red]
        body.append(f"    {names['_last']} = {' & '.join(conds)}\n\n")
        body.append(f"    @{pl}.when({names['_last']})\n    def {names['_store']}():\n        {store}\n")
    elif shapes is not None:
        body.append(f"    {store}\n")
    doc = f'    """{code(kexpr)} with the wrapper\'s epilogue applied to its output block before the store."""\n'
    kdef = f"def {names['_epilogue_kernel']}(*{refs}):\n" + doc + "".join(body)
    new_stmts = [*(cst.parse_statement(a) for a in assigns), cst.parse_statement(epi), cst.parse_statement(kdef)]

    # The pallas_call: the new kernel, the operands' specs, the scratch block, the epilogue's output shape.
    out_specs = spec_list(loc, node, "out_specs")
    check(len(out_specs) == 1 and isinstance(out_specs[0], cst.Call), "cannot read the output's BlockSpec")
    assert isinstance(out_specs[0], cst.Call)
    _, imap = blockspec_parts(out_specs[0])
    params = [p.name.value for p in imap.params.params] if isinstance(imap, cst.Lambda) else []
    grid_names = params if len(params) == len(facts.grid) else [f"g{i}" for i in range(len(facts.grid))]
    if shapes is None:
        specs = [cst.parse_expression(f"{pl}.BlockSpec(memory_space={pl}.ANY)") for _ in probe_ops]
    else:
        specs = [_spec_for(s, out, out_specs[0], pl, grid_names) for s in shapes]
    holder, in_arg = grid_spec_keyword(loc, node, "in_specs")
    check(in_arg is not None, "the call has no in_specs")
    assert in_arg is not None
    in_val = resolve(loc, holder, in_arg.value)
    check(in_val is in_arg.value and isinstance(in_val, cst.List | cst.Tuple), "in_specs is not a list in place")
    assert isinstance(in_val, cst.List | cst.Tuple)
    new_in = list_like(in_val, [*(e.value for e in in_val.elements), *specs])
    block, _ = blockspec_parts(out_specs[0])
    assert isinstance(block, cst.Tuple | cst.List)
    kept = [code(e.value) for e, b in zip(block.elements, out.block_shape, strict=True) if b is not None]
    shape_text = f"({kept[0]},)" if len(kept) == 1 else f"({', '.join(kept)})"
    scratch = cst.parse_expression(f"{pltpu}.VMEM({shape_text}, {jnp}.{out.dtype})")
    _, scr_arg = grid_spec_keyword(loc, node, "scratch_shapes")
    if scr_arg is not None:
        check(isinstance(scr_arg.value, cst.List | cst.Tuple), "scratch_shapes is not a list in place")
        assert isinstance(scr_arg.value, cst.List | cst.Tuple)
        new_scr: cst.BaseExpression = list_like(scr_arg.value, [*(e.value for e in scr_arg.value.elements), scratch])
    else:
        new_scr = cst.List([cst.Element(scratch)])
    new_holder = holder.with_changes(
        args=[
            a.with_changes(value=new_in) if a is in_arg else (a.with_changes(value=new_scr) if a is scr_arg else a)
            for a in holder.args
        ]
    )
    if scr_arg is None:
        new_holder = set_keyword(new_holder, "scratch_shapes", new_scr)
    old_out = keyword(node, "out_shape")
    check(old_out is not None, "the call has no out_shape=")
    assert old_out is not None
    new_call = node if holder is node else substitute(node, {holder: new_holder})
    if holder is node:
        new_call = new_holder
    elif holder not in descendants(node):
        new_call = node
    eval_shape = f"{jax}.eval_shape({names['_epilogue']}, {', '.join([code(old_out.value), *ops])})"
    if layouts is not None or plan.reshape is None:  # the probe's operands may not be in the output's layout yet
        new_call = set_keyword(new_call, "out_shape", cst.parse_expression(eval_shape))
    args = list(new_call.args)
    k = next(
        i for i, a in enumerate(args) if (a.keyword is None and i == 0) or (a.keyword and a.keyword.value == "kernel")
    )
    args[k] = args[k].with_changes(value=cst.Name(names["_epilogue_kernel"]))
    new_call = new_call.with_changes(args=args)

    # The wrapper: the new statements before the one building the call; each region gives way to its input.
    edits: dict[cst.CSTNode, cst.CSTNode] = {}
    apply_args = [*site.apply.args]
    last = apply_args[-1]
    apply_args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    apply_args += [cst.Arg(cst.Name(n), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for n in probe_ops]
    apply_args[-1] = apply_args[-1].with_changes(comma=last.comma)
    new_apply = site.apply.with_changes(args=apply_args)
    if site.apply.func is node:
        new_apply = new_apply.with_changes(func=new_call)
    else:
        edits[node] = new_call
    if holder is not node and holder not in descendants(node):
        edits[holder] = new_holder
    for r in plan.regions:  # the first region holds the call itself, the others read the value before them
        if r.uses[0] is plan.reshape:  # the reshape stays in the wrapper, the work after it moves
            edits[r.top] = substitute(plan.reshape, {site.apply: new_apply})
        else:
            edits[r.top] = new_apply if r.uses[0] is site.apply else cst.Name(code(r.uses[0]))
    if plan.regions[0].uses[0] is not site.apply:
        edits[site.apply] = new_apply
    fn_block = fn.body
    assert isinstance(fn_block, cst.IndentedBlock)
    stmts = list(fn_block.body)
    at = _holder_statement(loc, stmts, node)
    gap = [cst.EmptyLine(indent=False)]
    new_stmts = [st.with_changes(leading_lines=gap) if isinstance(st, cst.FunctionDef) else st for st in new_stmts]
    new_body: list[cst.BaseStatement] = []
    for i, s in enumerate(stmts):
        if i == at:
            new_body.extend(new_stmts)  # type: ignore[arg-type]
        new = substitute(s, edits)
        if i == at:
            new = new.with_changes(leading_lines=gap)
        if not is_self_assign(new):  # `y = y`, left where a statement's work moved into the kernel
            new_body.append(new)
    new_fn = fn.with_changes(body=fn_block.with_changes(body=new_body))
    outer = {k2: v for k2, v in edits.items() if not any(k2 is n or k2 in descendants(n) for n in stmts)}
    outer[fn] = new_fn
    base, alias = ensure_pltpu(module)  # the same statement nodes, an import added when missing
    assert alias == pltpu
    return replace_many(base, outer)


def _holder_statement(loc: Located, stmts: list[cst.BaseStatement], node: cst.CSTNode) -> int:
    cur: cst.CSTNode | None = node
    while cur is not None and cur not in stmts:
        cur = loc.parent(cur)
    check(cur is not None, "the pallas_call is built outside the function that applies it")
    return stmts.index(cur)  # type: ignore[arg-type]


def _verify(old: KernelIR, new: KernelIR, facts: CallFacts) -> None:
    """One call still, its output the same shape, and the entry's results the same shapes and dtypes."""
    check(len(new.calls) == len(old.calls), f"the rewrite traced to {len(new.calls)} calls, not {len(old.calls)}")
    got = new.calls[facts.index].outputs[0]
    check(got.shape == facts.outputs[0].shape, f"the epilogue changes the output's shape to {got.shape}")
    assert old.workload is not None and new.workload is not None
    before = [(a.shape, str(a.dtype)) for a in trace_entry(old.workload).jaxpr.out_avals]
    after = [(a.shape, str(a.dtype)) for a in trace_entry(new.workload).jaxpr.out_avals]
    check(before == after, f"the entry's results change from {before} to {after}")
