"""dma-overlap: a copy from HBM that is started and waited on at once becomes a double-buffered prefetch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import check
from ..ir.builders import rename_names
from ..ir.cst_edit import replace_many
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import Located, find_call_node, grid_spec_keyword, kernel_function, pl_alias
from .base import Pass


def _is_call_to(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Call) and (
        m.matches(node.func, m.Attribute(attr=m.Name(name))) or m.matches(node.func, m.Name(name))
    )


def _method_stmt(stmt: cst.CSTNode, var: str, method: str) -> bool:
    """`var.method()` as a statement of its own."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    expr = stmt.body[0]
    return isinstance(expr, cst.Expr) and m.matches(
        expr.value, m.Call(func=m.Attribute(value=m.Name(var), attr=m.Name(method)), args=[])
    )


@dataclass(frozen=True)
class _Site:
    index: int  # statement index of `copy = make_async_copy(src, dst, sem)` in the kernel body
    var: str
    src: cst.BaseExpression
    dst: str
    sem: str


def _find(kernel: cst.FunctionDef) -> list[_Site]:
    body = list(kernel.body.body)
    out = []
    for i, stmt in enumerate(body[:-2]):
        if not (
            isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign)
        ):
            continue
        assign = stmt.body[0]
        target = assign.targets[0].target if len(assign.targets) == 1 else None
        call = assign.value
        if not isinstance(target, cst.Name) or not _is_call_to(call, "make_async_copy"):
            continue
        assert isinstance(call, cst.Call)
        args = [a.value for a in call.args]
        if len(args) != 3 or not isinstance(args[1], cst.Name) or not isinstance(args[2], cst.Name):
            continue
        if _method_stmt(body[i + 1], target.value, "start") and _method_stmt(body[i + 2], target.value, "wait"):
            out.append(_Site(i, target.value, args[0], args[1].value, args[2].value))
    return out


def _step_name(kernel: cst.FunctionDef, axis: int) -> str | None:
    """The local bound to `pl.program_id(axis)` in the kernel, if any."""
    for stmt in kernel.body.body:
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign):
            a = stmt.body[0]
            t = a.targets[0].target if len(a.targets) == 1 else None
            v = a.value
            if isinstance(t, cst.Name) and _is_call_to(v, "program_id"):
                assert isinstance(v, cst.Call)
                arg = v.args[0].value if v.args else None
                if isinstance(arg, cst.Integer) and int(arg.evaluated_value) == axis:
                    return t.value
    return None


def applicable(call: CallFacts) -> bool:
    moving = [a for a, g in enumerate(call.grid) if g > 1]
    sem = call.dimension_semantics or ()
    return (
        call.body.has_dma
        and len(moving) == 1
        and not (len(sem) > moving[0] and sem[moving[0]] in ("parallel", "core_parallel"))
    )


@dataclass(frozen=True)
class DmaOverlapPass(Pass):
    """Turn `copy = make_async_copy(hbm.at[...step...], buf, sem); copy.start(); copy.wait()` into a two-slot
    prefetch: step i waits on the copy started at step i-1 and starts the copy for step i+1, so the HBM transfer
    overlaps the compute. The VMEM buffer and semaphore get a leading dimension of 2.

    Helps kernels that copy by hand from `memory_space=pl.ANY` inputs and serialize each transfer with the compute.
    Needs a single sequential grid axis (the prefetch chain runs across steps) and the source index written in
    terms of `pl.program_id`. Checked with the TPU interpreter's race detector. Parameter: `call`.
    """

    name: ClassVar[str] = "dma-overlap"
    call: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        return tuple(cls(call=c.index) for c in ir.calls if applicable(c))

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(facts.body.has_dma, "the kernel does no manual DMA")
        check(applicable(facts), "needs exactly one grid axis with more than one step, not marked parallel")
        axis = next(a for a, g in enumerate(facts.grid) if g > 1)
        loc = Located.of(ir.module)
        node = find_call_node(loc, facts)
        kernel = kernel_function(loc, node)
        check(kernel is not None, "cannot find the kernel function")
        assert kernel is not None
        sites = _find(kernel)
        check(len(sites) == 1, "no single copy that is started and waited on at once")
        site = sites[0]
        step = _step_name(kernel, axis)
        check(step is not None, f"the copy's index is not written with a local `= pl.program_id({axis})`")
        assert step is not None
        src_names = {n.value for n in m.findall(site.src, m.Name()) if isinstance(n, cst.Name)}
        check(step in src_names, "the copy's source does not depend on the grid step")
        pl = pl_alias(ir.module)
        edits: dict[cst.CSTNode, cst.CSTNode] = {}
        edits[kernel] = _rewrite_kernel(kernel, site, step, axis, pl)
        _double_scratch(loc, node, facts, kernel, site, edits)
        return ir.with_module(replace_many(loc.wrapper.module, edits), self.spec())


def _rewrite_kernel(kernel: cst.FunctionDef, site: _Site, step: str, axis: int, pl: str) -> cst.FunctionDef:
    copy_call = site.src  # the source expression, re-evaluated for (step, slot) in a helper
    helper = f"_{site.var}_for"
    slot = f"_{site.var}_slot"
    current = f"_{site.var}_buf"

    src_for_step = rename_names(copy_call, {step: "step"})
    assert isinstance(src_for_step, cst.BaseExpression)
    make = _make_async_copy_func(kernel, site)
    helper_def = cst.parse_statement(
        f"def {helper}(step, slot):\n"
        f"    return {make}({cst.Module([]).code_for_node(src_for_step)}, {site.dst}.at[slot], {site.sem}.at[slot])\n"
    )
    gap = [cst.EmptyLine(indent=False)]
    new_stmts = [
        helper_def.with_changes(leading_lines=gap),
        cst.parse_statement(f"{slot} = {step} % 2\n").with_changes(leading_lines=gap),
        cst.parse_statement(
            f"@{pl}.when({step} == 0)\ndef _prime():\n    {helper}({step}, {slot}).start()\n"
        ).with_changes(leading_lines=gap),
        cst.parse_statement(
            f"@{pl}.when({step} + 1 < {pl}.num_programs({axis}))\n"
            f"def _prefetch_next():\n    {helper}({step} + 1, 1 - {slot}).start()\n"
        ).with_changes(leading_lines=gap),
        cst.parse_statement(f"{helper}({step}, {slot}).wait()\n").with_changes(leading_lines=gap),
        cst.parse_statement(f"{current} = {site.dst}.at[{slot}]\n"),
    ]
    body = list(kernel.body.body)
    rest = [rename_names(s, {site.dst: current}) for s in body[site.index + 3 :]]
    new_body = body[: site.index] + new_stmts + rest  # type: ignore[operator]
    return kernel.with_changes(body=kernel.body.with_changes(body=new_body))


def _make_async_copy_func(kernel: cst.FunctionDef, site: _Site) -> str:
    for stmt in kernel.body.body:
        if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign):
            v = stmt.body[0].value
            if _is_call_to(v, "make_async_copy"):
                assert isinstance(v, cst.Call)
                return cst.Module([]).code_for_node(v.func)
    return "pltpu.make_async_copy"


def _double_scratch(
    loc: Located,
    call: cst.Call,
    facts: CallFacts,
    kernel: cst.FunctionDef,
    site: _Site,
    edits: dict[cst.CSTNode, cst.CSTNode],
) -> None:
    """Give the copy's VMEM buffer and semaphore scratch a leading dimension of 2."""
    params = [p.name.value for p in kernel.params.params]
    n_scratch = len(facts.scratch)
    check(n_scratch >= 2 and len(params) >= n_scratch, "the kernel's scratch parameters do not match")
    scratch_params = params[len(params) - n_scratch :]
    check(site.dst in scratch_params and site.sem in scratch_params, "the copy's buffer or semaphore is not scratch")
    _holder, arg = grid_spec_keyword(loc, call, "scratch_shapes")
    holder_val = arg.value if arg is not None else None
    check(isinstance(holder_val, cst.List | cst.Tuple), "scratch_shapes is not a literal list")
    assert isinstance(holder_val, cst.List | cst.Tuple)
    elems = [e.value for e in holder_val.elements]
    check(len(elems) == n_scratch, "scratch_shapes does not list every scratch buffer")
    buf = elems[scratch_params.index(site.dst)]
    sem = elems[scratch_params.index(site.sem)]
    check(isinstance(buf, cst.Call) and buf.args, "the buffer's scratch is not a VMEM(shape, dtype) call")
    assert isinstance(buf, cst.Call)
    shape = buf.args[0].value
    check(isinstance(shape, cst.Tuple), "the buffer's scratch shape is not a tuple")
    assert isinstance(shape, cst.Tuple)
    inner_shape = cst.Module([]).code_for_node(shape)[1:-1].rstrip(", ")
    edits[shape] = cst.parse_expression(f"(2, {inner_shape})")
    check(m.matches(sem, m.Attribute(attr=m.Name("DMA"))), "the semaphore is not a plain SemaphoreType.DMA")
    edits[sem] = cst.parse_expression(f"{cst.Module([]).code_for_node(sem)}((2,))")
