"""Where a pallas_call's result is followed, in the wrapper, by plain elementwise JAX work on it alone (a bias add,
an activation, a scale, a cast, a residual add): the statements, the expressions to move and their operands
(read from the CST only; nothing is rewritten or traced here)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from ..errors import check
from .matchers import Located, bound_names, code, free_names, module_alias, module_names

# Functions that act element by element (keyword arguments are static settings, e.g. gelu's `approximate`).
ELEMENTWISE: dict[str, frozenset[str]] = {
    "jax.numpy": frozenset(
        [
            "abs",
            "absolute",
            "maximum",
            "minimum",
            "exp",
            "exp2",
            "expm1",
            "log",
            "log1p",
            "log2",
            "tanh",
            "sin",
            "cos",
            "sqrt",
            "square",
            "reciprocal",
            "negative",
            "sign",
            "where",
            "clip",
            "power",
            "logaddexp",
            "floor",
            "ceil",
            "round",
            "cbrt",
            "arctan",
            "sinh",
            "cosh",
        ]
    ),
    "jax.nn": frozenset(
        [
            "relu",
            "relu6",
            "gelu",
            "sigmoid",
            "silu",
            "swish",
            "softplus",
            "elu",
            "selu",
            "celu",
            "leaky_relu",
            "hard_tanh",
            "hard_sigmoid",
            "hard_silu",
            "hard_swish",
            "log_sigmoid",
            "soft_sign",
        ]
    ),
    "jax.lax": frozenset(
        ["exp", "tanh", "logistic", "max", "min", "rsqrt", "erf", "abs", "neg", "sqrt", "log", "pow", "square", "sign"]
    ),
}
BINARY = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide, cst.Power, cst.FloorDivide, cst.Modulo)
LITERAL = m.Integer() | m.Float() | m.Imaginary() | m.SimpleString() | m.Name("True") | m.Name("False")


@dataclass(frozen=True)
class Region:
    """One statement's part of the epilogue: `top` is moved into the kernel; `uses` are where it reads the value
    before it (the call's result, or the previous statement's target); `target` is the name it assigns (None for
    a `return` or a larger expression)."""

    stmt: int
    top: cst.BaseExpression
    uses: tuple[cst.BaseExpression, ...]
    target: str | None


@dataclass(frozen=True)
class Epilogue:
    """The elementwise work after a pallas_call's application, statement `first` of function `fn`'s body on.

    `reshape` is the wrapper's reshape of the call's result when the chain goes through one (it stays in the
    wrapper); the regions from `after_reshape` on act on the reshaped value, and the operands flagged in
    `relayout` are read only there (they must be brought to the call's output layout)."""

    fn: cst.FunctionDef
    first: int
    regions: tuple[Region, ...]
    operands: tuple[cst.BaseExpression, ...]  # leaves computed in the wrapper: they become kernel inputs (distinct)
    reshape: cst.Call | None = None
    after_reshape: int = 0
    relayout: tuple[bool, ...] = ()


def elementwise_functions(module: cst.Module) -> frozenset[str]:
    """The spellings of the elementwise functions under this module's imports (`jnp.tanh`, `jax.nn.relu`...)."""
    out: set[str] = set()
    for dotted, names in ELEMENTWISE.items():
        alias = module_alias(module, dotted)
        if alias is not None:
            out.update(f"{alias}.{n}" for n in names)
    return frozenset(out)


def lift(loc: Located, node: cst.BaseExpression, fns: frozenset[str]) -> cst.BaseExpression | str:
    """The expression right above `node` when it does elementwise work on it, else why not (a sentence)."""
    parent = loc.parent(node)
    if isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, BINARY):
        return parent
    if isinstance(parent, cst.UnaryOperation) and isinstance(parent.operator, cst.Minus | cst.Plus):
        return parent
    if isinstance(parent, cst.Comparison):
        return parent
    if isinstance(parent, cst.ComparisonTarget):
        up = loc.parent(parent)
        assert isinstance(up, cst.Comparison)
        return up
    if isinstance(parent, cst.Arg):
        call = loc.parent(parent)
        assert isinstance(call, cst.Call)
        name = code(call.func)
        if parent.keyword is None and not parent.star and name in fns:
            return call
        if isinstance(call.func, cst.Call):
            return "it is passed to another pallas_call (the fuse pass's case)"
        return f"it is passed to {name.splitlines()[0]}, which is not an elementwise function this pass knows"
    if isinstance(parent, cst.Attribute) and parent.value is node:
        call = loc.parent(parent)
        if parent.attr.value == "astype" and isinstance(call, cst.Call) and call.func is parent:
            return call
        return f"the wrapper reads its .{parent.attr.value}"
    if isinstance(parent, cst.Subscript):
        return "the wrapper indexes it"
    if isinstance(parent, cst.Return):
        return "the wrapper returns it as it is"
    if isinstance(parent, cst.Assign):
        return "it is assigned as it is"
    return f"the wrapper uses it as a whole (in a {type(parent).__name__})"


def _statement(loc: Located, node: cst.CSTNode) -> cst.CSTNode | None:
    cur: cst.CSTNode | None = node
    while cur is not None and not isinstance(cur, cst.SimpleStatementLine | cst.BaseCompoundStatement):
        cur = loc.parent(cur)
    return cur


def _climb(loc: Located, uses: tuple[cst.BaseExpression, ...], fns: frozenset[str]) -> tuple[cst.BaseExpression, str]:
    """The largest elementwise expression holding every use (or the use itself), and why it stops there."""
    tops: list[cst.BaseExpression] = []
    why = ""
    for u in uses:
        node = u
        while True:
            up = lift(loc, node, fns)
            if isinstance(up, str):
                why = why or up
                break
            node = up
        tops.append(node)
    if any(t is not tops[0] for t in tops):
        return uses[0], "its uses are in different expressions"
    return tops[0], why


def _assigned(loc: Located, top: cst.BaseExpression) -> str | None:
    """The name `top` is assigned to, when it is a whole `name = top` statement."""
    parent = loc.parent(top)
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name):
        return parent.targets[0].target.value
    return None


def _name_uses(stmt: cst.CSTNode, name: str) -> tuple[cst.BaseExpression, ...]:
    """The reads of `name` in a simple statement (its assignment targets excluded)."""
    targets: set[cst.CSTNode] = set()
    for t in m.findall(stmt, m.AssignTarget()):
        assert isinstance(t, cst.AssignTarget)
        targets.update(m.findall(t, m.Name()))
    return tuple(n for n in m.findall(stmt, m.Name(name)) if isinstance(n, cst.Name) and n not in targets)


def reshape_of(loc: Located, node: cst.BaseExpression) -> cst.Call | None:
    """The `node.reshape(...)` / `jnp.reshape(node, ...)` call right above `node`, if any."""
    parent = loc.parent(node)
    if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value == "reshape":
        call = loc.parent(parent)
        return call if isinstance(call, cst.Call) and call.func is parent else None
    jnp = module_alias(loc.wrapper.module, "jax.numpy")
    if isinstance(parent, cst.Arg) and parent.keyword is None and not parent.star and jnp is not None:
        call = loc.parent(parent)
        if isinstance(call, cst.Call) and code(call.func) == f"{jnp}.reshape" and call.args[0] is parent:
            return call
    return None


@dataclass(frozen=True)
class Chain:
    """How far the wrapper's elementwise work on a call's result goes (see `find_epilogue`)."""

    fn: cst.FunctionDef
    first: int
    regions: tuple[Region, ...]
    why: str  # why it stops there
    returned: bool  # the value (through names and an optional reshape, no elementwise work) is returned as it is
    reshape: cst.Call | None
    after_reshape: int


def follow(loc: Located, apply: cst.Call) -> Chain:
    """The chain of statements doing elementwise work on `apply`'s value (`y = ...; z = f(y); return g(z)`), each
    value read by the next statement only; one reshape of the value itself may sit in the chain."""
    fns = elementwise_functions(loc.wrapper.module)
    fn = _function_of(loc, apply)
    body = fn.body
    check(isinstance(body, cst.IndentedBlock), "the wrapper function is on one line")
    assert isinstance(body, cst.IndentedBlock)
    stmts = list(body.body)
    first = _statement(loc, apply)
    check(first in stmts, "the pallas_call is applied inside a nested block (if/for/with) of the wrapper")
    k = stmts.index(first)  # type: ignore[arg-type]
    regions: list[Region] = []
    uses: tuple[cst.BaseExpression, ...] = (apply,)
    why = ""
    reshape: cst.Call | None = None
    after = 0
    returned = False
    while True:
        r = reshape_of(loc, uses[0]) if len(uses) == 1 else None
        if r is not None and reshape is None:
            reshape, after, uses = r, len(regions), (r,)
        top, why = _climb(loc, uses, fns)
        target = _assigned(loc, top)
        if top is not uses[0] or len(uses) > 1:
            regions.append(Region(k, top, uses, target))
        elif not regions and isinstance(loc.parent(top), cst.Return):
            returned = True
        if target is None or k + 1 >= len(stmts):
            break
        nxt = stmts[k + 1]
        later = [n for s in stmts[k + 2 :] for n in m.findall(s, m.Name(target))]
        rebinds = target in bound_names(nxt)
        reads = _name_uses(nxt, target)
        if not reads or not isinstance(nxt, cst.SimpleStatementLine):
            why = why if regions else f"its value {target} is not read by the next statement"
            break
        if later and not rebinds:
            why = f"{target} is read again after the next statement"
            break
        uses, k = reads, k + 1
    return Chain(fn, stmts.index(first), tuple(regions), why, returned, reshape, after)  # type: ignore[arg-type]


def find_epilogue(loc: Located, apply: cst.Call) -> Epilogue:
    """The elementwise work the wrapper does on the result of `apply` (a pallas_call's application), following
    `y = ...; z = f(y); return g(z)` chains while each value is read by the next statement only; declines with the
    reason when there is none."""
    c = follow(loc, apply)
    if not c.regions:
        check(False, f"no elementwise work on the call's result in the wrapper: {c.why}")
    regions = list(c.regions)
    ops, relayout = _operands(loc, c.fn, regions, c.after_reshape if c.reshape is not None else len(regions))
    return Epilogue(c.fn, c.first, c.regions, ops, c.reshape, c.after_reshape, relayout)


def _function_of(loc: Located, node: cst.CSTNode) -> cst.FunctionDef:
    cur = loc.parent(node)
    while cur is not None and not isinstance(cur, cst.FunctionDef):
        cur = loc.parent(cur)
    check(cur is not None, "the pallas_call is not applied inside a function")
    assert isinstance(cur, cst.FunctionDef)
    return cur


def static_leaf(expr: cst.BaseExpression, module_level: set[str], local: set[str]) -> bool:
    """A leaf the kernel can read as a Python value: a literal, or names bound only at module level (`jnp.float32`,
    a module constant)."""
    if m.matches(expr, LITERAL | m.UnaryOperation(expression=LITERAL)):
        return True
    names = free_names(expr)
    return bool(names) and names <= module_level and not names & local


def leaves(loc: Located, top: cst.BaseExpression, uses: tuple[cst.BaseExpression, ...]) -> list[cst.BaseExpression]:
    """The largest subexpressions of `top` that hold no use, in source order; function names, keyword-argument
    values and `.astype` arguments are settings, not leaves."""
    holding: set[cst.CSTNode] = set()
    for u in uses:
        cur: cst.CSTNode | None = u
        while cur is not None and cur is not top:
            holding.add(cur)
            cur = loc.parent(cur)
    holding.add(top)
    out: list[cst.BaseExpression] = []

    def walk(node: cst.CSTNode) -> None:
        if any(node is u for u in uses):
            return
        if isinstance(node, cst.BaseExpression) and node not in holding:
            out.append(node)
            return
        if isinstance(node, cst.Call):
            is_astype = isinstance(node.func, cst.Attribute) and node.func.attr.value == "astype"
            if is_astype:
                assert isinstance(node.func, cst.Attribute)
                walk(node.func.value)
            else:
                for a in node.args:
                    if a.keyword is None:
                        walk(a.value)
            return
        for child in node.children:
            walk(child)

    walk(top)
    return out


def settings(loc: Located, top: cst.BaseExpression, uses: tuple[cst.BaseExpression, ...]) -> list[cst.BaseExpression]:
    """The settings of `top` that `leaves` passes over, in source order: `.astype` arguments and keyword-argument
    values of calls holding no use (`y.astype(x.dtype)`, `jnp.clip(y, a_min=lo)`): written once where the value
    is, they must still read the same names when the epilogue moves."""
    out: list[cst.BaseExpression] = []
    for call in m.findall(top, m.Call()):
        if not isinstance(call, cst.Call) or any(u is call for u in uses):
            continue
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "astype":
            out += [a.value for a in call.args]
        else:
            out += [a.value for a in call.args if a.keyword is not None]
    return sorted(out, key=lambda n: loc.start(n))


def _operands(
    loc: Located, fn: cst.FunctionDef, regions: list[Region], after: int
) -> tuple[tuple[cst.BaseExpression, ...], tuple[bool, ...]]:
    """The distinct non-static leaves, and for each whether it is read after the reshape (regions `after` on)."""
    module_level = module_names(loc.wrapper.module)
    local = bound_names(fn.body) | {p.name.value for p in fn.params.params}
    seen: dict[str, cst.BaseExpression] = {}
    side: dict[str, bool] = {}
    for i, r in enumerate(regions):
        for leaf in leaves(loc, r.top, r.uses):
            if not static_leaf(leaf, module_level, local):
                check(
                    not m.findall(leaf, m.Call(func=m.Call())),
                    f"the epilogue reads another call's result: {code(leaf)}",
                )
                key = code(leaf)
                check(side.get(key, i >= after) == (i >= after), f"{key} is read both before and after the reshape")
                seen.setdefault(key, leaf)
                side[key] = i >= after
    return tuple(seen.values()), tuple(side[k] for k in seen)
