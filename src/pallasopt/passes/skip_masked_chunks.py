"""skip-masked-chunks: an in-kernel `fori_loop` over chunks runs only over the chunks its iota mask leaves unmasked."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Any, ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import check
from ..ir.builders import inline_names
from ..ir.cst_edit import replace_many
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..ir.mask_bounds import Mask, Reader, bound_on_axis, neutral_fill, static_value
from ..ir.matchers import Located, code, find_call_node, is_call_to, jnp_alias, kernel_body, module_names, pl_alias
from ..ir.scope import Scope, fori_loops, loop_body_def, params, statements
from .base import Pass

LOOP = -1  # the pseudo grid axis the loop counter stands for in the mask's linear forms
MAX_INLINE = 20  # substitution rounds when a helper's locals are inlined into its mask condition


def candidate(call: CallFacts) -> bool:
    """Cheap screen from the traced facts: an iota-built select inside a loop of the kernel body."""
    prims = set(call.body.primitives)
    return (
        call.library_site is None
        and "iota" in prims
        and bool(prims & {"select_n", "select"})
        and bool(prims & {"scan", "while"})
    )


@dataclass(frozen=True)
class SkipMaskedChunksPass(Pass):
    """Narrow the bounds of an in-kernel `jax.lax.fori_loop` over chunks to the chunks its iota mask can leave
    unmasked. The loop body (or a helper it calls) masks a value with `jnp.where(cond, x, fill)` where `cond`
    compares indices built from the loop counter (`j * BLOCK_K + iota`) and the grid (`program_id(a) * BLOCK_Q +
    iota`): a causal mask `cols <= rows` bounds the chunks from above, a sliding window (`rows - cols < W`) from
    below. `fori_loop(0, S // BLOCK_K, body, init)` becomes
    `fori_loop(0, jnp.minimum(S // BLOCK_K, (pl.program_id(2) * BLOCK_Q + BLOCK_Q - 1) // BLOCK_K + 1), body, init)`:
    the fully masked chunks (about half of a causal row) are neither loaded nor computed.

    Helps causal and windowed attention written as one grid step per query block with an inner loop over the keys
    (the GQA / MQA style with whole K and V blocks in VMEM). Needs the fill to be 0 or a large negative value (a fully
    masked chunk then adds nothing to an online-softmax or sum carry), the mask to be a conjunction of comparisons
    each linear in the counter, and a positive chunk stride (a module constant, a literal, or the size of a
    `pl.ds` the body reads). Parameters: `call`, `loop` (which fori_loop of the kernel, in source order).
    """

    name: ClassVar[str] = "skip-masked-chunks"
    call: int = 0
    loop: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        loc = Located.of(ir.module)
        for c in ir.calls:
            if not candidate(c):
                continue
            kernel = kernel_body(loc, find_call_node(loc, c))
            if kernel is not None and isinstance(kernel.body, cst.IndentedBlock):
                out += [cls(call=c.index, loop=i) for i in range(len(fori_loops(kernel, streamed=True)))]
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        check(facts.library_site is None, "the kernel body is in a library, not in this file")
        loc = Located.of(ir.module)
        node = find_call_node(loc, facts)
        kernel = kernel_body(loc, node)
        check(kernel is not None and isinstance(kernel.body, cst.IndentedBlock), "cannot find the kernel function")
        assert kernel is not None
        loops = fori_loops(kernel, streamed=True)
        check(
            0 <= self.loop < len(loops),
            f"no loop #{self.loop}: the kernel has {len(loops)} fori_loop(s) in its top-level statements",
        )
        loop = loops[self.loop]
        namespace = vars(ir.workload.module) if ir.workload is not None else {}
        jnp = jnp_alias(ir.module)
        check(jnp is not None, "the module does not import jax.numpy (the new bounds need jnp.minimum)")
        assert jnp is not None
        lower, upper = _new_bounds(ir.module, kernel, loop, namespace, pl_alias(ir.module), jnp)
        args = list(loop.args)
        args[0] = args[0].with_changes(value=cst.parse_expression(lower))
        args[1] = args[1].with_changes(value=cst.parse_expression(upper))
        new = loop.with_changes(args=args)
        return ir.with_module(replace_many(loc.wrapper.module, {loop: new}), self.spec())


def _helper_scope(
    helper: cst.FunctionDef, call: cst.Call, opaque_name: str
) -> tuple[dict[str, cst.BaseExpression], dict[str, cst.BaseExpression]]:
    """A helper's names seen from one call: (locals, parameters). Locals assigned once map to their value (in the
    helper's terms), any other local or rebound parameter to an opaque placeholder; parameters map to the call's
    arguments (in the caller's terms) or their defaults."""
    check(not any(a.star for a in call.args), f"`{helper.name.value}` is called with *args or **kwargs")
    positional = [a.value for a in call.args if a.keyword is None]
    keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    by_param: dict[str, cst.BaseExpression] = {}
    kwonly = {p.name.value for p in helper.params.kwonly_params}
    for i, p in enumerate(params(helper)):
        name = p.name.value
        if i < len(positional) and name not in kwonly:
            by_param[name] = positional[i]
        elif name in keywords:
            by_param[name] = keywords[name]
        else:
            by_param[name] = p.default if p.default is not None else cst.Name(opaque_name)
    scope = Scope.of(statements(helper))
    local: dict[str, cst.BaseExpression] = dict(scope.env)
    for name in scope.opaque | (set(scope.env) & set(by_param)):
        local[name] = cst.Name(opaque_name)
    return local, by_param


def _expand(
    cond: cst.BaseExpression, local: dict[str, cst.BaseExpression], params: dict[str, cst.BaseExpression]
) -> cst.BaseExpression:
    """A helper's condition in its caller's terms: helper locals expanded (their values are in the helper's terms,
    so repeatedly), then the parameters replaced by the call's arguments (once: those are the caller's terms)."""
    expr = cond
    for _ in range(MAX_INLINE):
        names = {n.value for n in m.findall(expr, m.Name()) if isinstance(n, cst.Name)} & set(local)
        names = {n for n in names if not m.matches(local[n], m.Name(n))}
        if not names:
            return inline_names(expr, params)
        expr = inline_names(expr, {n: local[n] for n in names})
    check(False, "the helper's mask condition is too deeply nested to expand")
    return expr


@dataclass(frozen=True)
class _Found:
    mask: Mask
    fill: cst.BaseExpression
    where: str  # where the mask was read (for messages)


def _masks(
    module: cst.Module, kernel: cst.FunctionDef, body: cst.FunctionDef, reader: Reader, opaque_name: str
) -> list[_Found]:
    """Every iota mask in the loop body, or in a module-level / kernel-level helper the body calls once."""
    found: list[_Found] = []

    def read(cond: cst.BaseExpression, fill: cst.BaseExpression, where: str) -> None:
        mask = reader.mask(cond)
        if mask is not None and any(a == LOOP for c in mask.constraints() for a, _, _ in c.form.pids):
            found.append(_Found(mask, fill, where))

    for w in m.findall(body, m.Call()):
        if isinstance(w, cst.Call) and is_call_to(w, "where") and len(w.args) == 3:
            read(w.args[0].value, w.args[2].value, f"`{body.name.value}`")
    helpers = {
        s.name.value: s for s in [*module.body, *statements(kernel)] if isinstance(s, cst.FunctionDef) and s is not body
    }
    for c in m.findall(body, m.Call(func=m.Name())):
        assert isinstance(c, cst.Call) and isinstance(c.func, cst.Name)
        helper = helpers.get(c.func.value)
        if helper is None:
            continue
        local, params = _helper_scope(helper, c, opaque_name)
        for w in m.findall(helper, m.Call()):
            if isinstance(w, cst.Call) and is_call_to(w, "where") and len(w.args) == 3:
                cond = _expand(w.args[0].value, local, params)
                read(cond, w.args[2].value, f"`{helper.name.value}` (called from `{body.name.value}`)")
    return found


def _positive(text: str, namespace: dict[str, Any], strides: set[str]) -> int | None:
    v = static_value(text, namespace)
    if isinstance(v, int):
        return (v > 0) - (v < 0)
    return 1 if text.replace(" ", "") in strides else None


def _ds_sizes(node: cst.CSTNode) -> set[str]:
    """Source texts of the sizes of `pl.ds(start, size)` slices in `node` (a slice size is positive)."""
    out: set[str] = set()
    for c in m.findall(node, m.Call()):
        if isinstance(c, cst.Call) and (is_call_to(c, "ds") or is_call_to(c, "dslice")) and len(c.args) >= 2:
            out.add(code(c.args[1].value).replace(" ", ""))
    return out


def _new_bounds(
    module: cst.Module,
    kernel: cst.FunctionDef,
    loop: cst.Call,
    namespace: dict[str, Any],
    pl: str,
    jnp: str,
) -> tuple[str, str]:
    """Source texts of the loop's narrowed (lower, upper) bounds."""
    body = loop_body_def(kernel, loop)
    counter = params(body)[0].name.value
    stmts = statements(kernel)
    at = next(i for i, s in enumerate(stmts) if loop in set(m.findall(s, m.Call())))
    kernel_scope, body_scope = Scope.of(stmts), Scope.of(statements(body))
    clash = body_scope.bound & set(kernel_scope.env)
    check(not clash, f"the loop body rebinds kernel locals {sorted(clash)}")
    opaque_name = "__pallasopt_opaque"
    carry = params(body)[1].name.value
    env = {**kernel_scope.env, **body_scope.env}
    for name in body_scope.opaque | kernel_scope.opaque | {carry}:
        env.pop(name, None)
    reader = Reader(env, is_call_to, indices={counter: LOOP})
    found = _masks(module, kernel, body, reader, opaque_name)
    check(bool(found), "no jnp.where(cond, x, fill) in the loop whose cond compares the loop counter to iota indices")
    check(len({repr(f.mask) for f in found}) == 1, f"{len(found)} different iota masks in the loop")
    mask = found[0].mask
    for f in found:
        check(
            neutral_fill(f.fill, namespace),
            f"the fill `{code(f.fill)}` of the mask in {f.where} is not 0 or a large negative value",
        )
    check(mask.conjunctive, "the mask has an `|`: its unmasked chunks are not one range")
    pid_locals = kernel_scope.pid_locals(at)
    strides = _ds_sizes(body) | _ds_sizes(module)
    bounds = [
        bound_on_axis(
            c,
            LOOP,
            lambda t: _positive(t, namespace, strides),
            lambda a: pid_locals.get(a, f"{pl}.program_id({a})"),
        )
        for c in mask.constraints()
    ]
    check(any(b is not None for b in bounds), "cannot solve the mask for a range of chunks (is the stride positive?)")
    visible = _visible(kernel, kernel_scope.bound_in(0, at), module)
    used = set().union(*(c.form.names for c in mask.constraints()))
    hidden = sorted(n for n in used if n not in visible or n == opaque_name)
    check(not hidden, f"the mask reads {hidden}, which are not known where the loop starts")
    lower, upper = code(loop.args[0].value), code(loop.args[1].value)
    for b in bounds:
        if b is None:
            continue
        kind, text = b
        if kind == "hi":
            upper = f"{jnp}.minimum({upper}, {text} + 1)"
        else:
            lower = f"{jnp}.maximum({lower}, {text})"
    return lower, upper


def _visible(kernel: cst.FunctionDef, local: set[str], module: cst.Module) -> set[str]:
    """Names the loop's bounds may read: the kernel's parameters, its locals bound before the loop, module names."""
    return {p.name.value for p in params(kernel)} | local | module_names(module) | set(dir(builtins))
