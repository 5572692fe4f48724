"""reshape-in-kernel: an input the wrapper reshapes across TPU's tiled minor dim is reshaped in VMEM by the kernel."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst

from ..cost_model.hardware import Chip
from ..errors import KernelError, PassNotApplicable, check
from ..ir.builders import fresh_name, tuple_expr
from ..ir.cst_edit import add_scratch, ensure_pltpu, forward_new_ref, nested_into, ref_via_scratch, replace_many
from ..ir.facts import CallFacts, Operand, dtype_bytes
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    CallSite,
    Located,
    blockspec_parts,
    code,
    dead_assignment,
    enclosing_function,
    input_site,
    jnp_alias,
    only_read,
    resolve_local,
    shared_kernel,
    spec_site,
    used_names,
)
from ..ir.trace import enclosing_jaxpr, find_pallas_call_chains, trace_entry
from .base import Pass, per_input_choices

Group = tuple[range, range]  # dims of the source array, dims of the reshaped one, with equal extents' products


def reshape_groups(src: Sequence[int], dst: Sequence[int]) -> tuple[Group, ...] | None:
    """A row-major reshape `src -> dst` as consecutive groups of dims whose extents multiply to the same number (the
    finest such split: (64, 112, 112, 128) -> (64, 56, 2, 56, 256) is [64]=[64], [112]=[56, 2], [112, 128]=[56, 256]);
    None when the element counts differ. Dims of extent 1 join the group before them."""
    if math.prod(src) != math.prod(dst):
        return None
    groups: list[Group] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        i0, j0 = i, j
        a, i = (src[i], i + 1) if i < len(src) else (1, i)
        b, j = (dst[j], j + 1) if j < len(dst) else (1, j)
        while a != b:  # equal products overall: the smaller side always has a dim left
            if a < b:
                a, i = a * src[i], i + 1
            else:
                b, j = b * dst[j], j + 1
        while i < len(src) and src[i] == 1:
            i += 1
        while j < len(dst) and dst[j] == 1:
            j += 1
        groups.append((range(i0, i), range(j0, j)))
    return tuple(groups)


@dataclass(frozen=True)
class _Source:
    """The wrapper's reshape that makes the operand: the reshape expression, the array it reshapes (a plain name)
    and that array's traced shape."""

    reshape: cst.Call
    name: str
    shape: tuple[int, ...]


def _reshape_call(loc: Located, node: cst.Call, operand: cst.BaseExpression) -> tuple[cst.Call, str] | None:
    """`x.reshape(...)` or `jnp.reshape(x, ...)` making `operand` (in place or through a local name assigned before
    the call), with `x` a plain name; else None."""
    made = resolve_local(loc, node, operand.value) if isinstance(operand, cst.Name) else operand
    if not isinstance(made, cst.Call) or any(a.star for a in made.args):
        return None
    func = made.func
    if isinstance(func, cst.Attribute) and func.attr.value == "reshape" and isinstance(func.value, cst.Name):
        jnp = jnp_alias(loc.wrapper.module)
        if func.value.value in (jnp, "jnp", "np"):  # jnp.reshape(x, shape)
            first = made.args[0].value if made.args and made.args[0].keyword is None else None
            return (made, first.value) if isinstance(first, cst.Name) else None
        return made, func.value.value  # x.reshape(shape)
    return None


def _traced_source(ir: KernelIR, call: int, operand: int) -> tuple[int, ...]:
    """The shape of the array a `reshape` equation turns into input `operand` of call `call`, in the jaxpr that
    holds the call (the entry's, or the body of the `jax.jit` it sits in), when that reshape's result feeds this call
    only; declines otherwise."""
    check(ir.workload is not None, "the kernel module is not loaded")
    assert ir.workload is not None
    top = trace_entry(ir.workload).jaxpr
    chains = find_pallas_call_chains(top)
    check(call < len(chains), f"no pallas_call #{call} in the traced entry")
    chain = chains[call]
    scope = enclosing_jaxpr(top, chain)
    check(scope is not None, "the call's enclosing jaxpr was not found")
    assert scope is not None
    var = chain[-1].invars[operand]
    made = [e for e in scope.eqns if any(v is var for v in e.outvars)]
    check(len(made) == 1 and made[0].primitive.name == "reshape", f"input {operand} is not made by a reshape")
    readers = [e for e in scope.eqns if any(v is var for v in e.invars)]
    check(len(readers) == 1 and all(v is not var for v in scope.outvars), "the reshaped array is read elsewhere too")
    return tuple(int(d) for d in made[0].invars[0].aval.shape)


def _zero_row(row: Sequence[int]) -> bool:
    return not any(row)


def _block_of_source(
    groups: Sequence[Group], op: Operand, src: Sequence[int], texts: Sequence[str], index: Sequence[str], name: str
) -> tuple[list[str], list[str]]:
    """The source array's block shape and index map elements (texts) whose block holds the operand's block.

    Per group of dims (`reshape_groups`): a group the block takes whole is the source's dims whole (index 0). A group
    whose first reshaped dim is blocked (b of it, at the map's index there) and the rest taken whole is a run of F =
    b x (the rest's extents) consecutive elements: the source's first dim of the group blocked by F / (the product of
    its other dims), those taken whole, when that divides. Declines for any other group (the block would not be one
    box of the source)."""
    affine = op.index_map.affine
    assert affine is not None
    block, where = [], []
    for xs, ys in groups:
        sizes = [b if b is not None else 1 for b in (op.block_shape[d] for d in ys)]
        whole = [s == op.shape[d] for s, d in zip(sizes, ys, strict=True)]
        if all(whole) and all(_zero_row(affine[d]) for d in ys):
            block += [f"{name}.shape[{k}]" for k in xs]
            where += ["0"] * len(xs)
            continue
        first, rest, inner = ys[0], ys[1:], xs[1:]
        check(
            all(whole[1:]) and all(_zero_row(affine[d]) for d in rest),
            f"the block of dims {list(ys)} does not take every reshaped dim after the first whole",
        )
        run = sizes[0] * math.prod(op.shape[d] for d in rest)
        check(
            op.shape[first] % sizes[0] == 0 and run % math.prod(src[k] for k in inner) == 0,
            f"the block of dims {list(ys)} is not one box of the source's dims {list(xs)}",
        )
        if len(xs) == 1 and len(ys) == 1:
            block.append(texts[first])  # the same dim: its block (squeezed or not) as written
        else:
            lead = "1" if op.block_shape[first] is None else f"({texts[first]})"
            run_text = " * ".join([lead, *(f"({texts[d]})" for d in rest)])
            if inner:
                run_text = f"({run_text}) // ({' * '.join(f'{name}.shape[{k}]' for k in inner)})"
            block += [run_text, *(f"{name}.shape[{k}]" for k in inner)]
        where += [index[first]] + ["0"] * len(inner)
    return block, where


def _upcast(dtype: str) -> str | None:
    """The 32-bit type a sub-32-bit block goes through for the in-kernel reshape (Mosaic's static profile crashes on
    packed bf16 relayouts; bf16 -> f32 -> bf16 is exact); None for 32-bit types."""
    if dtype_bytes(dtype) >= 4:
        return None
    check(dtype != "bool", "the operand is boolean")
    return "float32" if "float" in dtype else "int32"


@dataclass(frozen=True)
class _Plan:
    loc: Located
    node: cst.Call
    site: CallSite
    kernel: cst.FunctionDef
    ref: str
    source: _Source
    where: cst.CSTNode
    spec: cst.Call
    shape: cst.Tuple
    imap: cst.Lambda
    texts: tuple[str, ...]  # the operand's block shape as written
    block: tuple[str, ...]  # the source's block shape and index map elements (`_block_of_source`)
    where_texts: tuple[str, ...]
    forwarder: cst.Lambda | None  # a lambda between the call and the kernel, which takes the new ref too


@dataclass(frozen=True)
class ReshapeInKernelPass(Pass):
    """Move an input's reshape from the wrapper into the kernel: an operand made by `x.reshape(...)` (or
    `jnp.reshape`) that changes the minor dim is passed as `x`, with the block of `x` that holds the same elements
    (a BlockSpec over `x`'s dims), and the kernel reshapes it in VMEM into a scratch of the old block shape that the
    body reads under the old ref name. On TPU a reshape that moves the minor dim is a copy of the whole array through
    HBM (a read and a write, which the cost model charges to the wrapper); the kernel pays one VMEM relayout of its
    block per step instead. Sub-32-bit blocks are reshaped through 32 bits (exact).

    Where it applies: every group of dims the reshape splits or merges (`reshape_groups`) is either taken whole by
    the block, or has its first reshaped dim blocked and the rest taken whole, so the block is a run of rows of `x`
    (a row block of `x.reshape(N, H // 2, 2, W // 2, 2 * C)`, or of `x.reshape(B, T // 2, 2 * D)`). Parameters: `call`, `operand` (input index). Declines for other blocks, a
    reshape that keeps the minor dim (free on TPU), a reshaped array read elsewhere too, a body that stores to the
    ref, a kernel shared with another call, or a BlockSpec whose shape is not a literal tuple and whose index map is
    not a lambda returning a literal tuple, written in the wrapper that makes the call.
    """

    name: ClassVar[str] = "reshape-in-kernel"
    call: int = 0
    operand: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        return per_input_choices(ir, lambda c, i: cls(call=c, operand=i), lambda p: p._plan(ir, ir.module))

    def _plan(self, ir: KernelIR, module: cst.Module) -> _Plan:
        at = input_site(module, ir.calls, self.call, self.operand)
        loc, node, kernel, refs, site = at.loc, at.node, at.kernel, at.refs, at.site
        facts: CallFacts = ir.calls[self.call]
        op = facts.inputs[self.operand]
        check(op.is_pipelined and op.index_map.affine is not None, "the input is not a blocked, affine VMEM operand")
        found = _reshape_call(loc, node, site.operands[self.operand])
        check(found is not None, f"input {self.operand} is not made by x.reshape(...) or jnp.reshape(x, ...)")
        assert found is not None
        src_shape = _traced_source(ir, self.call, self.operand)
        check(
            bool(src_shape) and src_shape[-1] != op.shape[-1],
            "the reshape keeps the minor dim (no copy on TPU)",
        )
        ref = refs[self.operand]
        check(only_read(kernel, ref), f"the kernel stores to or rebinds {ref}")
        check(not shared_kernel(loc, ir.calls, facts.index, kernel), "the kernel function runs in another call too")
        where, spec = spec_site(loc, node, self.operand, len(facts.operands), len(facts.inputs))
        shape, imap = blockspec_parts(spec)
        check(
            isinstance(shape, cst.Tuple) and len(shape.elements) == len(op.shape),
            "the BlockSpec's block shape is not a literal tuple",
        )
        check(
            isinstance(imap, cst.Lambda)
            and isinstance(imap.body, cst.Tuple)
            and len(imap.body.elements) == len(op.shape),
            "the index map is not a lambda returning a literal tuple",
        )
        check(enclosing_function(loc, spec) is enclosing_function(loc, node), "the BlockSpec is built elsewhere")
        assert isinstance(shape, cst.Tuple) and isinstance(imap, cst.Lambda) and isinstance(imap.body, cst.Tuple)
        groups = reshape_groups(src_shape, op.shape)
        check(groups is not None, "the reshape changes the element count")
        assert groups is not None
        texts = tuple(code(e.value) for e in shape.elements)
        index = [code(e.value) for e in imap.body.elements]
        block, where_texts = _block_of_source(groups, op, src_shape, texts, index, found[1])
        upcast = _upcast(op.dtype)
        check(upcast is None or jnp_alias(loc.wrapper.module) is not None, "the module does not import jax.numpy")
        add_scratch(loc, node, [cst.Name("_")], {})  # declines here when the call's scratch list cannot be edited
        source = _Source(found[0], found[1], src_shape)
        return _Plan(
            loc,
            node,
            site,
            kernel,
            ref,
            source,
            where,
            spec,
            shape,
            imap,
            texts,
            tuple(block),
            tuple(where_texts),
            at.forwarder,
        )

    def apply(self, ir: KernelIR) -> KernelIR:
        module, pltpu = ensure_pltpu(ir.module)
        p = self._plan(ir, module)
        facts = ir.calls[self.call]
        op = facts.inputs[self.operand]
        texts, block, where = p.texts, p.block, p.where_texts
        upcast = _upcast(op.dtype)
        jnp = jnp_alias(p.loc.wrapper.module)
        new_spec = replace_many(p.spec, {p.shape: tuple_expr(block), p.imap.body: tuple_expr(where)})
        edits: dict[cst.CSTNode, cst.CSTNode] = {p.where: new_spec}
        site = p.site
        edits[site.operands[self.operand]] = cst.Name(p.source.name)
        dead = dead_assignment(p.loc, site.operands[self.operand], p.source.reshape)
        if dead is not None:
            edits[dead] = cst.RemovalSentinel.REMOVE  # type: ignore[assignment]
        inner = fresh_name(used_names(p.kernel), f"{p.ref}_flat")
        value = f"{inner}[...]"
        if upcast is not None:
            value = f"{value}.astype({jnp}.{upcast}).reshape({p.ref}.shape).astype({p.ref}.dtype)"
        else:
            value = f"{value}.reshape({p.ref}.shape)"
        prologue = cst.parse_module(f"{p.ref}[...] = {value}\n").body
        edits[p.kernel] = ref_via_scratch(
            p.kernel, self.operand, p.ref, inner, prologue, len(facts.inputs) + len(facts.outputs) + len(facts.scratch)
        )
        if p.forwarder is not None:
            edits[p.forwarder] = forward_new_ref(p.forwarder)
        visible = [t for t, b in zip(texts, op.block_shape, strict=True) if b is not None]
        kept = code(tuple_expr(visible))
        add_scratch(p.loc, p.node, [cst.parse_expression(f"{pltpu}.VMEM({kept}, {p.source.name}.dtype)")], edits)
        try:
            new = ir.with_module(replace_many(p.loc.wrapper.module, nested_into(p.loc, edits)), self.spec())
        except KernelError as e:
            raise PassNotApplicable(f"the rewritten module does not trace: {e.message}") from None
        got = new.calls[self.call]
        x = got.inputs[self.operand]
        check(
            x.shape == p.source.shape
            and x.block_elems == op.block_elems
            and got.grid == facts.grid
            and len(got.scratch) == len(facts.scratch) + 1,
            f"the rewrite traced to input shape {x.shape}, block {x.block_shape}, grid {got.grid}",
        )
        return new
