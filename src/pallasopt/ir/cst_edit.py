"""libcst helpers the passes share: locate a pallas_call by its traced span, edit keywords, replace literals.

Edits are minimal (one node each) so the output keeps the user's formatting and reads like code a person wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from ..errors import check
from .facts import CallFacts

Pos = tuple[int, int]  # (line, column) of a node's start, 1-based line, 0-based column


@dataclass(frozen=True)
class Located:
    """A module wrapped with position and parent metadata, resolved once per edit."""

    wrapper: MetadataWrapper
    positions: Mapping[cst.CSTNode, object]
    parents: Mapping[cst.CSTNode, cst.CSTNode]

    @staticmethod
    def of(module: cst.Module) -> Located:
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        return Located(
            wrapper=wrapper,
            positions=wrapper.resolve(PositionProvider),
            parents=wrapper.resolve(ParentNodeProvider),
        )

    def start(self, node: cst.CSTNode) -> Pos:
        rng = self.positions[node]
        return (rng.start.line, rng.start.column)  # type: ignore[attr-defined]

    def end_line(self, node: cst.CSTNode) -> int:
        return int(self.positions[node].end.line)  # type: ignore[attr-defined]

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(node)


def is_pallas_call(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and (
        m.matches(node.func, m.Attribute(attr=m.Name("pallas_call"))) or m.matches(node.func, m.Name("pallas_call"))
    )


def pallas_call_nodes(loc: Located) -> list[cst.Call]:
    found: list[cst.Call] = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if is_pallas_call(node):
                found.append(node)

    loc.wrapper.module.visit(Finder())
    return found


def find_call_node(loc: Located, call: CallFacts) -> cst.Call:
    """The `pallas_call(...)` node that produced `call` (declines when the span is unknown or ambiguous)."""
    check(
        call.library_site is None,
        f"call {call.index}'s pallas_call is in a library ({call.library_site}): only the values this file passes "
        "to it can change",
    )
    check(call.span is not None, "the traced call has no source location")
    assert call.span is not None
    first, last = call.span
    inside = [n for n in pallas_call_nodes(loc) if first <= loc.start(n)[0] <= last]
    check(len(inside) == 1, f"cannot tell which pallas_call on lines {first}-{last} made call {call.index}")
    return inside[0]


def keyword(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def replace_node(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    """Replace one node (by identity) in `module`."""
    out = module.deep_replace(old, new)
    assert isinstance(out, cst.Module)
    return out


def set_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with keyword `name=value` set (replaced in place, or appended after the last argument)."""
    existing = keyword(call, name)
    if existing is not None:
        return call.with_changes(args=[a.with_changes(value=value) if a is existing else a for a in call.args])
    args = list(call.args)
    new_arg = cst.Arg(
        keyword=cst.Name(name), value=value, equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
    )
    if args:
        last = args[-1]
        multiline = isinstance(last.comma, cst.Comma) and "\n" in cst.Module([]).code_for_node(last.comma)
        if multiline:
            assert isinstance(last.comma, cst.Comma)
            new_arg = new_arg.with_changes(comma=last.comma)
            if len(args) >= 2 and isinstance(args[-2].comma, cst.Comma):
                args[-1] = last.with_changes(comma=args[-2].comma)  # keep the arguments' indentation
        else:
            args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            if isinstance(last.comma, cst.Comma):
                new_arg = new_arg.with_changes(comma=last.comma)
    args.append(new_arg)
    return call.with_changes(args=args)


def replace_integers(module: cst.Module, values: Mapping[Pos, int]) -> cst.Module:
    """Replace the integer literals that start at the given positions with new values."""
    loc = Located.of(module)

    class Replacer(cst.CSTTransformer):
        def leave_Integer(self, original: cst.Integer, updated: cst.Integer) -> cst.BaseExpression:
            pos = loc.start(original)
            if pos in values:
                return updated.with_changes(value=str(values[pos]))
            return updated

    # The transformer must visit the wrapper's module (the nodes the positions were computed for).
    out = loc.wrapper.module.visit(Replacer())
    return out


def pltpu_alias(module: cst.Module) -> str | None:
    """The name the module binds `jax.experimental.pallas.tpu` to, if it imports it."""
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                mod = cst.Module([]).code_for_node(small.module) if small.module else ""
                for alias in small.names:
                    name = cst.Module([]).code_for_node(alias.name)
                    if mod == "jax.experimental.pallas" and name == "tpu":
                        return alias.asname.name.value if alias.asname else "tpu"  # type: ignore[union-attr]
            if isinstance(small, cst.Import):
                for alias in small.names:
                    if cst.Module([]).code_for_node(alias.name) == "jax.experimental.pallas.tpu" and alias.asname:
                        return alias.asname.name.value  # type: ignore[union-attr]
    return None


def ensure_pltpu(module: cst.Module) -> tuple[cst.Module, str]:
    """Make sure `jax.experimental.pallas.tpu` is imported; return the module and its alias."""
    alias = pltpu_alias(module)
    if alias is not None:
        return module, alias
    name = "pltpu"
    used = {n.value for n in m.findall(module, m.Name()) if isinstance(n, cst.Name)}
    while name in used:
        name = "_" + name
    stmt = cst.parse_statement(f"from jax.experimental.pallas import tpu as {name}\n")
    body = list(module.body)
    insert_at = 0
    for i, s in enumerate(body):
        if isinstance(s, cst.SimpleStatementLine) and any(isinstance(x, cst.Import | cst.ImportFrom) for x in s.body):
            insert_at = i + 1
    body.insert(insert_at, stmt)
    return module.with_changes(body=body), name


def enclosing_function(loc: Located, node: cst.CSTNode) -> cst.FunctionDef | None:
    cur: cst.CSTNode | None = loc.parent(node)
    while cur is not None and not isinstance(cur, cst.FunctionDef):
        cur = loc.parent(cur)
    return cur


def resolve_local(loc: Located, at: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """The expression last assigned to `name` in the function enclosing `at` (or the module), before `at`."""
    fn = enclosing_function(loc, at)
    scope: cst.CSTNode = fn if fn is not None else loc.wrapper.module
    target_line = loc.start(at)[0]
    best: tuple[int, cst.BaseExpression] | None = None

    class Finder(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            nonlocal best
            for t in node.targets:
                if m.matches(t.target, m.Name(name)):
                    line = loc.start(node)[0]
                    if line < target_line and (best is None or line > best[0]):
                        best = (line, node.value)

    scope.visit(Finder())
    return best[1] if best else None


def _func_name(call: cst.Call) -> str:
    f = call.func
    return f.attr.value if isinstance(f, cst.Attribute) else (f.value if isinstance(f, cst.Name) else "")


def _module_value(loc: Located, name: str) -> cst.BaseExpression | None:
    """The expression last assigned to `name` by a top-level statement of the module."""
    found: cst.BaseExpression | None = None
    for stmt in loc.wrapper.module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign) and any(m.matches(t.target, m.Name(name)) for t in small.targets):
                    found = small.value
    return found


def _is_params_expr(loc: Located, at: cst.CSTNode, value: cst.BaseExpression | None, hops: int = 0) -> bool:
    """`value` is statically a `CompilerParams(...)` (through local or module names, or `.replace(...)` on one)."""
    while isinstance(value, cst.Name) and hops < 6:
        value = resolve_local(loc, at, value.value) or _module_value(loc, value.value)
        hops += 1
    if not isinstance(value, cst.Call) or hops >= 6:
        return False
    if _func_name(value).endswith("CompilerParams"):
        return True
    f = value.func
    return _func_name(value) == "replace" and isinstance(f, cst.Attribute) and _is_params_expr(loc, at, f.value, hops)


def _compiler_params_call(loc: Located, call: cst.Call) -> tuple[cst.Call | None, bool]:
    """The `CompilerParams(...)` call (or `.replace(...)` on one) a pallas_call uses, following a local name, that can
    be edited in place; and whether compiler_params is present at all."""
    arg = keyword(call, "compiler_params")
    if arg is None:
        return None, False
    value: cst.BaseExpression | None = arg.value
    hops = 0
    while isinstance(value, cst.Name) and hops < 4:
        value = resolve_local(loc, call, value.value)
        hops += 1
    if isinstance(value, cst.Call) and _is_params_expr(loc, call, value):
        return value, True
    return None, True


def shared_compiler_params(loc: Located, call: cst.Call) -> cst.Arg | None:
    """The `compiler_params=` argument when it is a CompilerParams defined outside the call's function (e.g. a
    module constant other calls may share): edit it at the call site with `.replace(...)`, never at its definition."""
    arg = keyword(call, "compiler_params")
    if arg is None or _compiler_params_call(loc, call)[0] is not None:
        return None
    return arg if _is_params_expr(loc, call, arg.value) else None


def with_replaced(arg: cst.Arg, key: str, value: cst.BaseExpression) -> cst.BaseExpression:
    """`<compiler_params expression>.replace(key=value)`."""
    return cst.Call(
        func=cst.Attribute(arg.value, cst.Name("replace")),
        args=[cst.Arg(keyword=cst.Name(key), value=value, equal=_EQ)],
    )


def set_compiler_param(module: cst.Module, call: CallFacts, key: str, value: cst.BaseExpression) -> cst.Module:
    """Set `key=value` in the call's `pltpu.CompilerParams(...)`, adding `compiler_params=` if it has none."""
    loc = Located.of(module)
    node = find_call_node(loc, call)
    params, present = _compiler_params_call(loc, node)
    if params is not None:
        return replace_node(loc.wrapper.module, params, set_keyword(params, key, value))
    shared = shared_compiler_params(loc, node)
    if shared is not None:
        return replace_node(loc.wrapper.module, shared.value, with_replaced(shared, key, value))
    check(not present, "compiler_params is built in a way pallasopt cannot edit (not a CompilerParams(...) call)")
    module2, alias = ensure_pltpu(loc.wrapper.module)
    loc2 = Located.of(module2)
    node2 = find_call_node(loc2, call)
    new_params = cst.Call(
        func=cst.Attribute(cst.Name(alias), cst.Name("CompilerParams")),
        args=[cst.Arg(keyword=cst.Name(key), value=value, equal=_EQ)],
    )
    return replace_node(loc2.wrapper.module, node2, set_keyword(node2, "compiler_params", new_params))


_EQ = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))


def spec_nodes(loc: Located, call: cst.Call) -> list[cst.BaseExpression | None]:
    """The BlockSpec expressions of a pallas_call in operand order (inputs then outputs; None where unknown)."""
    from .knobs import _spec_list

    return _spec_list(loc, call, "in_specs") + _spec_list(loc, call, "out_specs")


def replace_many(module: cst.Module, mapping: Mapping[cst.CSTNode, cst.CSTNode]) -> cst.Module:
    """Replace several nodes (by identity, as found in `module`) in one traversal."""

    class Replacer(cst.CSTTransformer):
        def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
            return mapping.get(original, updated)

    return module.visit(Replacer())


def kernel_function(loc: Located, call: cst.Call) -> cst.FunctionDef | None:
    """The module-level function a pallas_call runs as its kernel (directly or through functools.partial)."""
    first = call.args[0].value if call.args and call.args[0].keyword is None else None
    if first is None:
        arg = keyword(call, "kernel")
        first = arg.value if arg is not None else None
    hops = 0
    while first is not None and hops < 4:
        if isinstance(first, cst.Call) and first.args:  # functools.partial(fn, ...)
            first = first.args[0].value
        elif isinstance(first, cst.Name):
            name = first.value
            defs = [
                d
                for d in m.findall(loc.wrapper.module, m.FunctionDef(name=m.Name(name)))
                if isinstance(d, cst.FunctionDef)
            ]
            if len(defs) == 1:  # module level or a closure in the entry
                return defs[0]
            first = resolve_local(loc, call, name)
        else:
            return None
        hops += 1
    return None


def grid_spec_keyword(loc: Located, call: cst.Call, key: str) -> tuple[cst.Call, cst.Arg | None]:
    """A pallas_call keyword (`grid`, `scratch_shapes`, ...) given directly or inside its `grid_spec=GridSpec(...)`:
    the call that holds it and the argument (None when absent)."""
    arg = keyword(call, key)
    if arg is None:
        gs = keyword(call, "grid_spec")
        val = gs.value if gs is not None else None
        while isinstance(val, cst.Name):
            val = resolve_local(loc, call, val.value)
        if isinstance(val, cst.Call):
            return val, keyword(val, key)
    return call, arg
