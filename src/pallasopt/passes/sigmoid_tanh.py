"""sigmoid-tanh: a kernel's sigmoids (and SiLU / swish) computed as one tanh and a multiply-add."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import PassNotApplicable, check
from ..ir.builders import fresh_name
from ..ir.cst_edit import replace_many
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import Located, code, find_call_node, jnp_alias, kernel_body, module_alias, module_names
from .base import Pass, own_call

# The functions rewritten, by dotted name: a sigmoid of the argument, or the argument times its sigmoid.
SIGMOIDS = ("jax.nn.sigmoid", "jax.lax.logistic")
SILUS = ("jax.nn.silu", "jax.nn.swish")


@dataclass(frozen=True)
class SigmoidTanhPass(Pass):
    """Compute the sigmoids of pallas_call `call`'s kernel as `0.5 * tanh(0.5 * v) + 0.5`.

    Mosaic lowers `jax.nn.sigmoid` (`lax.logistic`) to `1 / (1 + exp(-v))` with an exact f32 divide
    (`jax/_src/pallas/mosaic/lowering.py`, `_logistic_lowering_rule`, JAX 0.10.2): an exp and an exact divide per
    element. The identity sigmoid(v) = (1 + tanh(v / 2)) / 2 needs one tanh
    and one multiply-add. libtpu's static schedule for a v5e: `fused_28_swish_scale_bias`'s body 0.228 -> 0.174 ms
    (its HBM floor is 0.421 ms). Rewrites, inside the kernel function (nested defs included), calls of
    `jax.nn.sigmoid` / `jax.lax.logistic` under any import form, `jax.nn.silu` / `jax.nn.swish` (v times it), and the
    hand-written `1 / (1 + jnp.exp(-v))`; each becomes a call of a module function the pass adds.

    Numerics: the same function, rounded differently. Where sigmoid(v) < ~3e-8 (v < -17 in f32) the tanh form
    rounds to 0, an absolute error under 3e-8 (the exp form keeps the tiny value; both are 0 past v = -88); the
    oracle's tolerance decides, as for every pass. Declines a kernel with none of these, helpers outside the kernel
    (not rewritten), a module without `jax.numpy`."""

    name: ClassVar[str] = "sigmoid-tanh"
    call: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        seen: set[str] = set()
        for c in ir.calls:
            if c.library_site is not None:
                continue
            try:
                kernel, _ = _plan(ir, c)
            except PassNotApplicable:
                continue
            if code(kernel) not in seen:  # a kernel two calls share is rewritten once
                seen.add(code(kernel))
                out.append(cls(call=c.index))
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        facts = own_call(ir, self.call)
        kernel, found = _plan(ir, facts)
        jnp = jnp_alias(ir.module)
        check(jnp is not None, "the module does not import jax.numpy")
        taken = module_names(ir.module)
        sig = fresh_name(taken, "_sigmoid_tanh")
        silu = fresh_name(taken | {sig}, "_silu_tanh")
        new_kernel = kernel.visit(_Rewrite(found, sig, silu))
        assert isinstance(new_kernel, cst.FunctionDef)
        helpers = [_helper(f"def {sig}(v):\n    return 0.5 * {jnp}.tanh(0.5 * v) + 0.5\n", SIGMOID_DOC)]
        if any(kind == "silu" for kind in found.values()):
            helpers.append(_helper(f"def {silu}(v):\n    return v * {sig}(v)\n", SILU_DOC))
        helpers[0] = helpers[0].with_changes(leading_lines=kernel.leading_lines)  # the kernel's own blank lines
        placed = cst.FlattenSentinel([*helpers, new_kernel.with_changes(leading_lines=GAP)])
        new = ir.with_module(replace_many(ir.module, {kernel: placed}), self.spec())  # type: ignore[dict-item]
        got = new.calls[self.call]
        check(got.grid == facts.grid and got.operands == facts.operands, "the rewrite changed the call's blocks")
        return new


GAP = [cst.EmptyLine(indent=False)] * 2  # blank lines before each function the pass writes
SIGMOID_DOC = "sigmoid(v) as one tanh and a multiply-add (pallasopt sigmoid-tanh: Mosaic's logistic divides)."
SILU_DOC = "silu(v) = v * sigmoid(v), the sigmoid as one tanh (pallasopt sigmoid-tanh)."


def _helper(text: str, doc: str) -> cst.FunctionDef:
    """A module-level helper function with its docstring, two blank lines above it."""
    fn = cst.parse_statement(text)
    assert isinstance(fn, cst.FunctionDef) and isinstance(fn.body, cst.IndentedBlock)
    docline = cst.parse_statement(f'"""{doc}"""\n')
    body = fn.body.with_changes(body=[docline, *fn.body.body])
    return fn.with_changes(body=body, leading_lines=GAP)


def _plan(ir: KernelIR, facts: CallFacts) -> tuple[cst.FunctionDef, dict[cst.CSTNode, str]]:
    """The call's kernel function and the expressions to rewrite in it ("sigmoid" or "silu"; declines with why)."""
    loc = Located.of(ir.module)
    kernel = kernel_body(loc, find_call_node(loc, facts))  # the body only: also behind a forwarding lambda
    check(kernel is not None, "cannot find the kernel function (a def the call runs)")
    assert kernel is not None
    found = _matches(ir.module, kernel)
    check(bool(found), "the kernel computes no sigmoid, SiLU or 1 / (1 + exp(-v)) in its own body")
    return kernel, found


def _names(module: cst.Module, dotted: tuple[str, ...]) -> set[str]:
    """How the module can spell each function in `dotted` (`jax.nn.sigmoid`, `nn.sigmoid`, `sigmoid`...)."""
    out: set[str] = set()
    for full in dotted:
        parent, _, last = full.rpartition(".")
        direct, via = module_alias(module, full, through_parent=False), module_alias(module, parent)
        out |= {direct} if direct is not None else set()
        out |= {f"{via}.{last}"} if via is not None else set()
    return out


def _matches(module: cst.Module, kernel: cst.FunctionDef) -> dict[cst.CSTNode, str]:
    """The kernel's sigmoid / SiLU calls and hand-written `1 / (1 + exp(-v))` quotients."""
    sig, silu = _names(module, SIGMOIDS), _names(module, SILUS)
    jnp = jnp_alias(module)
    out: dict[cst.CSTNode, str] = {}
    for node in m.findall(kernel, m.Call() | m.BinaryOperation(operator=m.Divide())):
        if isinstance(node, cst.Call) and len(node.args) == 1 and node.args[0].keyword is None:
            if not node.args[0].star:
                name = code(node.func)
                if name in sig:
                    out[node] = "sigmoid"
                elif name in silu:
                    out[node] = "silu"
        elif isinstance(node, cst.BinaryOperation) and jnp is not None and _exp_form(node, jnp) is not None:
            out[node] = "quotient"
    return out


def _one(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Integer | cst.Float) and float(node.value) == 1.0


def _exp_form(node: cst.BinaryOperation, jnp: str) -> cst.BaseExpression | None:
    """v of `1 / (1 + jnp.exp(-v))` (either order of the sum; None: not that form)."""
    if not _one(node.left):
        return None
    den = node.right
    if not isinstance(den, cst.BinaryOperation) or not isinstance(den.operator, cst.Add):
        return None
    exp = den.right if _one(den.left) else den.left if _one(den.right) else None
    if not isinstance(exp, cst.Call) or code(exp.func) != f"{jnp}.exp" or len(exp.args) != 1:
        return None
    arg = exp.args[0].value
    if isinstance(arg, cst.UnaryOperation) and isinstance(arg.operator, cst.Minus):
        return arg.expression
    return None


class _Rewrite(cst.CSTTransformer):
    """Replace each found node by a call of the helper (`_sigmoid_tanh(v)`, `_silu_tanh(v)`)."""

    def __init__(self, found: dict[cst.CSTNode, str], sig: str, silu: str) -> None:
        super().__init__()
        self.found, self.sig, self.silu = found, sig, silu

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        kind = self.found.get(original)
        if kind is None:
            return updated
        name = self.sig if kind == "sigmoid" else self.silu
        return updated.with_changes(func=cst.Name(name))

    def leave_BinaryOperation(self, original: cst.BinaryOperation, updated: cst.BinaryOperation) -> cst.BaseExpression:
        if self.found.get(original) != "quotient":
            return updated
        den = updated.right
        assert isinstance(den, cst.BinaryOperation)
        exp = den.right if _one(den.left) else den.left
        assert isinstance(exp, cst.Call) and isinstance(exp.args[0].value, cst.UnaryOperation)
        v = exp.args[0].value.expression
        return cst.Call(func=cst.Name(self.sig), args=[cst.Arg(v)], lpar=updated.lpar, rpar=updated.rpar)
