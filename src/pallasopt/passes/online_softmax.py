"""online-softmax: a kernel holding a whole row to reduce a softmax over it gets a grid axis over chunks of the row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import KernelError, PassNotApplicable, check
from ..ir.builders import fresh_name, parse_statements
from ..ir.cst_edit import add_scratch, append_grid_axis, replace_many, semantics_edit, split_specs_on_new_axis
from ..ir.facts import CallFacts, Operand
from ..ir.kernel_ir import KernelIR, kernel_jaxpr
from ..ir.matchers import (
    Located,
    blockspec_parts,
    code,
    kernel_refs,
    module_alias,
    pallas_call_nodes,
    pl_alias,
    spec_nodes,
    used_names,
)
from ..ir.softmax_form import SoftmaxForm, match_softmax
from .base import Pass, kernel_site

# Lane-aligned chunk sizes `choices` offers: those below the row length that divide it at the traced dims and at
# CHECK_DIMS. `apply` takes any multiple of 128 that splits the row (a chunk the check dims do not divide makes the
# oracle derive larger check dims, harness/check_dims.py).
CHUNKS = tuple(128 * 2**k for k in range(9))  # 128 ... 32768


def candidate(call: CallFacts) -> bool:
    """Cheap screen from the traced facts: a straight-line body with a max, an exp and a sum, no state, one output."""
    prims = set(call.body.primitives)
    return (
        call.library_site is None
        and not call.body.has_dma
        and not call.scratch
        and call.num_scalar_prefetch == 0
        and len(call.outputs) == 1
        and {"reduce_max", "exp", "reduce_sum"} <= prims
        and not prims & {"cond", "while", "scan"}
    )


def _form(ir: KernelIR, facts: CallFacts, dims: dict[str, int] | None = None) -> SoftmaxForm:
    return match_softmax(kernel_jaxpr(ir, facts.index, dims), len(facts.inputs), len(facts.outputs))


@dataclass(frozen=True)
class OnlineSoftmaxPass(Pass):
    """Split a whole-row softmax reduction into chunks along the row: the kernel's block holds a whole row (the
    array's full last dim, or a whole key range) to take a logsumexp (`m + log(sum(exp(s - m)))`), a cross entropy
    (that minus the label's logit, picked with an iota compare: the chunk's iota gets the chunk's offset) or an
    attention (`softmax(s) @ V`) over it; the rewrite adds an innermost "arbitrary" grid axis over `chunk`-sized pieces of the
    row, keeps the running max and sum (and the rescaled P @ V accumulator) in f32 VMEM scratch, initializes them
    on the first chunk and writes the result on the last (the flash-attention rewrite, done by rule).

    Helps rows too long for VMEM (a 256k vocabulary) and lets the pipeline overlap the row's fetch with compute;
    the chunk becomes a module constant the tile pass can retune. The pattern is read from the body's jaxpr: one
    row max over the last axis of 2-D scores, the scores built from input blocks by elementwise ops, casts,
    transposes and dots only (no iota in the scores, no other reduction along the row), a single store. Declines
    otherwise, with the reason. Parameters: `call`, `chunk` (row elements per grid step, a multiple of 128 that
    divides the row).
    """

    name: ClassVar[str] = "online-softmax"
    call: int = 0
    chunk: int = 512

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        """The chunks that split the row at the traced dims and at CHECK_DIMS (so the oracle checks each at the
        module's small dims); the tile pass retunes the chunk constant from there (to larger chunks too)."""
        out: list[Pass] = []
        check_dims = ir.workload.check_dims if ir.workload is not None else None
        for c in ir.calls:
            if not candidate(c):
                continue
            try:
                lengths = [_form(ir, c).row_len]
                if check_dims:
                    lengths.append(_form(ir, c, {**ir.dims, **check_dims}).row_len)
            except (PassNotApplicable, KernelError):
                continue
            out.extend(
                cls(call=c.index, chunk=k) for k in CHUNKS if k < lengths[0] and all(n % k == 0 for n in lengths)
            )
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(facts.library_site is None, "the pallas_call is a library's: its kernel body is not this file's")
        check(self.chunk > 0 and self.chunk % 128 == 0, f"chunk {self.chunk} is not a positive multiple of 128")
        form = _form(ir, facts)
        check(
            self.chunk < form.row_len and form.row_len % self.chunk == 0,
            f"chunk {self.chunk} does not split the row of {form.row_len} into several equal pieces",
        )
        dims = {pos: facts.inputs[pos].block_dim_of(d) for pos, d in form.chunked}
        for pos, bdim in dims.items():
            op = facts.inputs[pos]
            check(
                op.block_shape[bdim] == op.shape[bdim],
                f"input {pos}'s block does not hold the whole row (block {op.block_shape}, array {op.shape})",
            )
            aff = op.index_map.affine
            check(aff is not None and not any(aff[bdim]), f"input {pos}'s index map moves along the row's dim")
        ks = kernel_site(ir, facts)
        loc, node, kernel, jnp, pltpu = ks.loc, ks.node, ks.kernel, ks.jnp, ks.pltpu
        refs = kernel_refs(kernel)
        check(refs is not None and len(refs) == len(facts.operands), "the kernel's positional refs do not match")
        assert refs is not None
        const = fresh_name(used_names(loc.wrapper.module), "SOFTMAX_CHUNK")
        edits: dict[cst.CSTNode, cst.CSTNode] = {}
        row_text = split_specs_on_new_axis(loc, node, facts, dims, lambda _: const, edits, index="c", along="the row")
        append_grid_axis(loc, node, f"{row_text} // {const}", edits)
        if facts.dimension_semantics is not None:  # none given: the default ("arbitrary") suits the chunk axis
            edits.update(semantics_edit(loc, node, facts, lambda sem: (*sem, "arbitrary")))
        pl = pl_alias(loc.wrapper.module)
        out_spec = spec_nodes(loc, node)[len(facts.inputs) + form.output]
        scratch = _scratch_texts(out_spec, facts.outputs[form.output], form)
        lax = module_alias(loc.wrapper.module, "jax.lax")
        check(
            lax is not None or form.kind != "cross-entropy", "the module does not import jax (the label pick needs lax)"
        )
        names = (pl, jnp, lax or "jax.lax", const)
        edits[kernel] = _rewrite_kernel(kernel, refs, facts, form, len(facts.grid), len(scratch), names)
        which = [id(c) for c in pallas_call_nodes(loc)].index(id(node))
        # the scratch edit replaces the pallas_call (or its GridSpec) node: a second traversal, after the others
        loc2 = Located.of(replace_many(loc.wrapper.module, edits))
        node2 = pallas_call_nodes(loc2)[which]
        edits2: dict[cst.CSTNode, cst.CSTNode] = {}
        add_scratch(loc2, node2, [cst.parse_expression(f"{pltpu}.VMEM({t}, {jnp}.float32)") for t in scratch], edits2)
        new = _insert_constant(replace_many(loc2.wrapper.module, edits2), kernel.name.value, const, self.chunk)
        try:
            return ir.with_module(new, self.spec())
        except KernelError as e:  # the rewrite is ours, but what it reads is the user's: say what failed
            raise PassNotApplicable(f"the chunked kernel does not trace: {e}") from None


def _scratch_texts(spec: cst.BaseExpression | None, out: Operand, form: SoftmaxForm) -> list[str]:
    """Shapes of the running max and sum (rows, 1) (and the attention accumulator (rows, D)), as source text in the
    output block's names so a later tile change keeps them coherent."""
    shape, _ = blockspec_parts(spec)
    check(isinstance(shape, cst.Tuple | cst.List), "the output's block shape is not a literal tuple")
    assert isinstance(shape, cst.Tuple | cst.List)
    kept = [(code(e.value), b) for e, b in zip(shape.elements, out.block_shape, strict=False) if b is not None]
    while len(kept) > 2 and kept[0][1] == 1:  # leading size-1 dims the kernel indexes away (`o_ref[0]`)
        kept = kept[1:]
    check(bool(kept) and kept[0][1] == form.rows, "the output block does not start with the scores' rows")
    rows = kept[0][0]
    texts = [f"({rows}, 1)", f"({rows}, 1)"]
    if form.kind == "cross-entropy":
        texts.append(f"({rows}, 1)")
    if form.kind == "attention":
        check(
            [b for _, b in kept] == [form.rows, form.head_dim],
            "the output block is not (rows, head dim) of the attention result",
        )
        texts.append("(" + ", ".join(t for t, _ in kept) + ")")
    return texts


def _scores_expr(kernel: cst.FunctionDef, jnp: str) -> tuple[int, cst.BaseExpression]:
    """The top-level statement index of the kernel's one row max, and the scores expression it reduces."""
    maxes = [
        c
        for c in m.findall(kernel, m.Call(func=m.Attribute(attr=m.Name("max") | m.Name("amax"))))
        if isinstance(c, cst.Call)
    ]
    check(len(maxes) == 1, f"{len(maxes)} `.max(...)` calls in the kernel: cannot tell which is the row max")
    (mx,) = maxes
    assert isinstance(kernel.body, cst.IndentedBlock)
    where = [i for i, s in enumerate(kernel.body.body) if any(c is mx for c in m.findall(s, m.Call()))]
    check(len(where) == 1, "the row max is not in a top-level statement of the kernel")
    func = mx.func
    assert isinstance(func, cst.Attribute)
    if code(func.value) == jnp:
        check(bool(mx.args) and mx.args[0].keyword is None, "the row max has no positional operand")
        return where[0], mx.args[0].value
    return where[0], func.value  # `s.max(axis=-1)`


def _rewrite_kernel(
    kernel: cst.FunctionDef,
    refs: tuple[str, ...],
    facts: CallFacts,
    form: SoftmaxForm,
    axis: int,
    n_scratch: int,
    aliases: tuple[str, str, str, str],
) -> cst.FunctionDef:
    pl, jnp, lax, const = aliases
    check(isinstance(kernel.body, cst.IndentedBlock), "the kernel is a one-line def")
    assert isinstance(kernel.body, cst.IndentedBlock)
    k, scores = _scores_expr(kernel, jnp)
    prefix = list(kernel.body.body[:k])
    chunked_refs = {refs[pos] for pos, _ in form.chunked}
    for s in [*prefix, kernel.body.body[k]]:
        for attr in m.findall(s, m.Attribute(attr=m.Name("shape"))):
            assert isinstance(attr, cst.Attribute)
            check(
                code(attr.value) not in chunked_refs,
                f"the kernel reads {code(attr.value)}.shape, which the chunking changes",
            )
    used = used_names(kernel)
    n = {
        w: fresh_name(used, w)
        for w in (
            "s_chunk",
            "chunk_id",
            "m_prev",
            "m_new",
            "alpha",
            "p",
            "cols",
            "m_scratch",
            "l_scratch",
            "acc_scratch",
            "picked_scratch",
        )
    }
    init_fn, fin_fn = fresh_name(used, "_init_row_state"), fresh_name(used, "_finalize_row")
    out = refs[len(facts.inputs) + form.output]
    attention = form.kind == "attention"
    acc_init = f"    {n['acc_scratch']}[...] = {jnp}.zeros_like({n['acc_scratch']})\n" if attention else ""
    acc_step = ""
    if attention:
        assert form.value_input is not None
        lhs, rhs = form.dot_dtypes
        index = ", ".join(["0"] * form.value_lead) or "..."
        acc_step = (
            f"{n['acc_scratch']}[...] = {n['alpha']} * {n['acc_scratch']}[...] + {jnp}.dot(\n"
            f"    {n['p']}.astype({jnp}.{lhs}), {refs[form.value_input]}[{index}].astype({jnp}.{rhs}), "
            f"preferred_element_type={jnp}.float32\n)\n"
        )
        result = f"{n['acc_scratch']}[...] / {n['l_scratch']}[...]"
    else:
        result = f"{n['m_scratch']}[...] + {jnp}.log({n['l_scratch']}[...])"
    if form.kind == "cross-entropy":
        assert form.label_input is not None
        pk, lab = n["picked_scratch"], refs[form.label_input]
        acc_init = f"    {pk}[...] = {jnp}.zeros_like({pk})\n"
        acc_step = (
            f"{n['cols']} = {n['chunk_id']} * {const} + {lax}.broadcasted_iota({jnp}.int32, {n['s_chunk']}.shape, 1)\n"
            f"{pk}[...] += {jnp}.sum(\n"
            f"    {jnp}.where({n['cols']} == {lab}[...].reshape({n['s_chunk']}.shape[0], 1), {n['s_chunk']}, 0.0),\n"
            f"    axis=1,\n    keepdims=True,\n)\n"
        )
        result = f"{result} - {pk}[...]"
    text = (
        f"{n['s_chunk']} = {_atom(scores)}.astype({jnp}.float32)\n"
        f"{n['chunk_id']} = {pl}.program_id({axis})\n"
        f"\n@{pl}.when({n['chunk_id']} == 0)\n"
        f"def {init_fn}():\n"
        f"    {n['m_scratch']}[...] = {jnp}.full_like({n['m_scratch']}, {jnp}.finfo({jnp}.float32).min)\n"
        f"    {n['l_scratch']}[...] = {jnp}.zeros_like({n['l_scratch']})\n"
        f"{acc_init}"
        f"\n{n['m_prev']} = {n['m_scratch']}[...]\n"
        f"{n['m_new']} = {jnp}.maximum({n['m_prev']}, {jnp}.max({n['s_chunk']}, axis=1, keepdims=True))\n"
        f"{n['alpha']} = {jnp}.exp({n['m_prev']} - {n['m_new']})\n"
        f"{n['p']} = {jnp}.exp({n['s_chunk']} - {n['m_new']})\n"
        f"{n['l_scratch']}[...] = {n['alpha']} * {n['l_scratch']}[...] + {jnp}.sum({n['p']}, axis=1, keepdims=True)\n"
        f"{acc_step}"
        f"{n['m_scratch']}[...] = {n['m_new']}\n"
        f"\n@{pl}.when({n['chunk_id']} == {pl}.num_programs({axis}) - 1)\n"
        f"def {fin_fn}():\n"
        f"    {out}[...] = ({result}).reshape({out}.shape).astype({out}.dtype)\n"
    )
    stmts = parse_statements(text)
    third = n["picked_scratch"] if form.kind == "cross-entropy" else n["acc_scratch"]
    names = [n["m_scratch"], n["l_scratch"], third][:n_scratch]
    params = list(kernel.params.params)
    last = params[-1]
    params[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    new_params = [cst.Param(cst.Name(x), comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))) for x in names]
    new_params[-1] = new_params[-1].with_changes(comma=last.comma)
    return kernel.with_changes(
        params=kernel.params.with_changes(params=[*params, *new_params]),
        body=kernel.body.with_changes(body=[*prefix, *stmts]),
    )


def _atom(expr: cst.BaseExpression) -> str:
    """`expr` as text that a `.method()` can follow (parenthesized unless a name, call, subscript or attribute)."""
    text = code(expr)
    return text if isinstance(expr, cst.Name | cst.Call | cst.Subscript | cst.Attribute) else f"({text})"


def _insert_constant(module: cst.Module, kernel_name: str, const: str, value: int) -> cst.Module:
    """`CONST = value` as a module-level statement right before the kernel's def (the tile pass retunes it)."""
    body = list(module.body)
    at = [i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == kernel_name]
    check(len(at) == 1, "the kernel is not a module-level function (the chunk constant has nowhere to go)")
    stmt = cst.parse_statement(f"{const} = {value}  # row elements per step of the online softmax\n")
    lead = body[at[0]].leading_lines
    body[at[0]] = body[at[0]].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
    body.insert(at[0], stmt.with_changes(leading_lines=lead))
    return module.with_changes(body=body)
