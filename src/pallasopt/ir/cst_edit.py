"""libcst editing helpers the passes share: edit keywords and compiler params, replace literals and nodes.

Read-only lookups (finding a pallas_call, its specs, kernel and operands, import aliases) live in `matchers.py`.
Edits are minimal (one node each) so the output keeps the user's formatting and reads like code a person wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar, cast

import libcst as cst
import libcst.matchers as m

from ..errors import check
from .builders import fresh_name, replace_arg, tuple_expr
from .facts import CallFacts
from .matchers import (
    Located,
    Pos,
    blockspec_parts,
    code,
    docstring_lines,
    find_call_node,
    free_names,
    grid_spec_keyword,
    is_call_to,
    keyword,
    pallas_call_nodes,
    pltpu_alias,
    resolve,
    resolve_local,
    spec_nodes,
    used_names,
)

N = TypeVar("N", bound=cst.CSTNode)


def replace_node(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    """Replace one node (by identity) in `module`."""
    out = module.deep_replace(old, new)
    assert isinstance(out, cst.Module)
    return out


def keyword_arg(name: str, value: cst.BaseExpression) -> cst.Arg:
    """`name=value` as a call argument, spaced as black writes it."""
    return cst.Arg(keyword=cst.Name(name), value=value, equal=_EQ)


def with_keyword_only(params: cst.Parameters, names: Sequence[str]) -> cst.Parameters:
    """`params` with keyword-only parameters `names` appended (after a bare `*` when there is no `*args`)."""
    star = params.star_arg if params.star_arg is not cst.MaybeSentinel.DEFAULT else cst.ParamStar()
    return params.with_changes(
        star_arg=star, kwonly_params=[*params.kwonly_params, *(cst.Param(cst.Name(n)) for n in names)]
    )


def set_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with keyword `name=value` set (replaced in place, or appended after the last argument)."""
    existing = keyword(call, name)
    if existing is not None:
        return call.with_changes(args=[a.with_changes(value=value) if a is existing else a for a in call.args])
    args = list(call.args)
    new_arg = keyword_arg(name, value)
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


def ensure_pltpu(module: cst.Module) -> tuple[cst.Module, str]:
    """Make sure `jax.experimental.pallas.tpu` is imported; return the module and its alias."""
    alias = pltpu_alias(module)
    if alias is not None:
        return module, alias
    name = fresh_name(used_names(module), "pltpu")
    stmt = cst.parse_statement(f"from jax.experimental.pallas import tpu as {name}\n")
    body = list(module.body)
    insert_at = 0
    for i, s in enumerate(body):
        if isinstance(s, cst.SimpleStatementLine) and any(isinstance(x, cst.Import | cst.ImportFrom) for x in s.body):
            insert_at = i + 1
    body.insert(insert_at, stmt)
    return module.with_changes(body=body), name


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


def compiler_params_call(loc: Located, call: cst.Call) -> tuple[cst.Call | None, bool]:
    """The `CompilerParams(...)` call (or `.replace(...)` on one) a pallas_call uses, following a local name, that can
    be edited in place (not one another pallas_call uses too: that one is edited at the call site, as a shared
    module constant is); and whether compiler_params is present at all."""
    arg = keyword(call, "compiler_params")
    if arg is None:
        return None, False
    value = _params_node(loc, call)
    if value is None or any(
        other is not call and _params_node(loc, other) is value for other in pallas_call_nodes(loc)
    ):
        return None, True
    return value, True


def _params_node(loc: Located, call: cst.Call) -> cst.Call | None:
    arg = keyword(call, "compiler_params")
    value: cst.BaseExpression | None = arg.value if arg is not None else None
    hops = 0
    while isinstance(value, cst.Name) and hops < 4:
        value = resolve_local(loc, call, value.value)
        hops += 1
    return value if isinstance(value, cst.Call) and _is_params_expr(loc, call, value) else None


def shared_compiler_params(loc: Located, call: cst.Call) -> cst.Arg | None:
    """The `compiler_params=` argument when it is a CompilerParams defined outside the call's function (e.g. a
    module constant other calls may share): edit it at the call site with `.replace(...)`, never at its definition."""
    arg = keyword(call, "compiler_params")
    if arg is None or compiler_params_call(loc, call)[0] is not None:
        return None
    return arg if _is_params_expr(loc, call, arg.value) else None


def with_replaced(arg: cst.Arg, key: str, value: cst.BaseExpression) -> cst.BaseExpression:
    """`<compiler_params expression>.replace(key=value)`."""
    return cst.Call(
        func=cst.Attribute(arg.value, cst.Name("replace")),
        args=[cst.Arg(keyword=cst.Name(key), value=value, equal=_EQ)],
    )


def compiler_param_edit(
    loc: Located, call: cst.Call, key: str, value: cst.BaseExpression
) -> dict[cst.CSTNode, cst.CSTNode]:
    """The edit (for `replace_many`) that sets `key=value` in the pallas_call `call`'s compiler params: in the
    `CompilerParams(...)` it uses (inline or through a local name), with `.replace(...)` at the call site on one defined
    outside the call's function, or by adding `compiler_params=<pltpu>.CompilerParams(key=value)` (that edit replaces
    the pallas_call node, and the module must import pallas.tpu already: `edit_call_params` sees to both)."""
    params, present = compiler_params_call(loc, call)
    if params is not None:
        return {params: set_keyword(params, key, value)}
    shared = shared_compiler_params(loc, call)
    if shared is not None:
        return {shared.value: with_replaced(shared, key, value)}
    check(not present, "compiler_params is built in a way pallasopt cannot edit (not a CompilerParams(...) call)")
    alias = pltpu_alias(loc.wrapper.module)
    assert alias is not None, "import jax.experimental.pallas.tpu first (ensure_pltpu)"
    new_params = cst.Call(
        func=cst.Attribute(cst.Name(alias), cst.Name("CompilerParams")),
        args=[cst.Arg(keyword=cst.Name(key), value=value, equal=_EQ)],
    )
    return {call: set_keyword(call, "compiler_params", new_params)}


def semantics_edit(
    loc: Located, call: cst.Call, facts: CallFacts, new: Callable[[tuple[str, ...]], tuple[str, ...]]
) -> dict[cst.CSTNode, cst.CSTNode]:
    """The edits (for `replace_many`) that make the `dimension_semantics` of the pallas_call `call` (traced as `facts`)
    `new(current)`, where `current` is the traced semantics (`()` when the call sets none); no edits when unchanged.

    A literal tuple or list written in the call's `CompilerParams(dimension_semantics=...)` is edited in place: the
    elements it keeps keep their quoting and commas, added ones take its quote, a trailing comma stays. Otherwise the
    value is set as `compiler_param_edit` sets one (a new tuple in the CompilerParams, `.replace(...)` on a shared one,
    or new `compiler_params=`). The keys are nodes of `loc`'s module as they are before any other edit: a pass that
    rebuilds the call itself (lane-dense) substitutes the keys inside the call into its new call.
    """
    current = facts.dimension_semantics or ()
    wanted = tuple(new(current))
    if wanted == current:
        return {}
    params, _ = compiler_params_call(loc, call)
    arg = keyword(params, "dimension_semantics") if params is not None else None
    literal = arg.value if arg is not None else None
    if (
        isinstance(literal, cst.Tuple | cst.List)
        and all(isinstance(e, cst.Element) for e in literal.elements)
        and 0 < len(literal.elements) == len(current)
        and wanted
    ):
        return {literal: _edited_literal(literal, current, wanted)}
    return compiler_param_edit(loc, call, "dimension_semantics", tuple_expr([f'"{s}"' for s in wanted]))


def _edited_literal(
    literal: cst.Tuple | cst.List, current: tuple[str, ...], wanted: tuple[str, ...]
) -> cst.BaseExpression:
    """`literal` (whose elements traced to `current`) holding `wanted`, reusing its elements and commas."""
    elems = list(literal.elements)
    first = elems[0].value
    quote = code(first)[0] if isinstance(first, cst.SimpleString) else '"'
    unused = list(zip(current, elems, strict=True))
    values: list[cst.BaseExpression] = []
    for s in wanted:
        k = next((k for k, (c, _) in enumerate(unused) if c == s), None)
        values.append(unused.pop(k)[1].value if k is not None else cst.SimpleString(f"{quote}{s}{quote}"))
    n_old, n_new = len(elems), len(wanted)
    inner = elems[-2].comma if n_old >= 2 else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    last = elems[-1].comma
    is_tuple = isinstance(literal, cst.Tuple)
    if is_tuple and n_old == 1 and n_new > 1:
        last = cst.MaybeSentinel.DEFAULT  # the one-element tuple's comma, not a trailing one
    if is_tuple and n_new == 1 and not isinstance(last, cst.Comma):
        last = cst.Comma()
    commas = [elems[i].comma if i < n_old - 1 else inner for i in range(n_new - 1)] + [last]
    return literal.with_changes(elements=[cst.Element(v, comma=c) for v, c in zip(values, commas, strict=True)])


def edit_call_params(
    module: cst.Module, call: CallFacts, edit: Callable[[Located, cst.Call], Mapping[cst.CSTNode, cst.CSTNode]]
) -> cst.Module:
    """`module` with the edits `edit(loc, node)` makes for the pallas_call `call` (`compiler_param_edit`,
    `semantics_edit`), importing pallas.tpu first when the call has no compiler_params for the edit to add."""
    loc = Located.of(module)
    node = find_call_node(loc, call)
    if keyword(node, "compiler_params") is None:
        which = [id(n) for n in pallas_call_nodes(loc)].index(id(node))  # an added import moves the traced lines
        loc = Located.of(ensure_pltpu(loc.wrapper.module)[0])
        node = pallas_call_nodes(loc)[which]
    return replace_many(loc.wrapper.module, edit(loc, node))


def set_compiler_param(module: cst.Module, call: CallFacts, key: str, value: cst.BaseExpression) -> cst.Module:
    """Set `key=value` in the call's `pltpu.CompilerParams(...)`, adding `compiler_params=` if it has none."""
    return edit_call_params(module, call, lambda loc, node: compiler_param_edit(loc, node, key, value))


_EQ = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))


def replace_many(module: N, mapping: Mapping[cst.CSTNode, cst.CSTNode]) -> N:
    """Replace several nodes (by identity, as found in `module`, or in any other node) in one traversal."""

    class Replacer(cst.CSTTransformer):
        def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
            return mapping.get(original, updated)

    out = module.visit(Replacer())
    assert isinstance(out, type(module))
    return out


def portable(expr: cst.CSTNode, names: set[str]) -> bool:
    """Whether `expr` reads only `names` (e.g. module-level names: it can be moved to another function)."""
    return free_names(expr) <= names


def block_text(shape: cst.BaseExpression | None, traced: tuple[int | None, ...], names: set[str]) -> str:
    """The block shape as the user wrote it when it reads only module-level names, else the traced sizes."""
    if shape is not None and portable(shape, names):
        return code(shape)
    return code(tuple_expr(["None" if b is None else str(b) for b in traced]))


def list_like(like: cst.BaseExpression | None, items: Sequence[cst.BaseExpression]) -> cst.List:
    """A list of `items`, one per line when `like` (the list it replaces) was written one element per line."""
    if isinstance(like, cst.List | cst.Tuple) and like.elements:
        first = like.elements[0].comma
        if isinstance(first, cst.Comma) and "\n" in code(first):
            sep = first
        else:
            sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        last = like.elements[-1].comma
        elems = [cst.Element(v, comma=sep) for v in items[:-1]]
        elems.append(cst.Element(items[-1], comma=last if isinstance(last, cst.Comma) else cst.MaybeSentinel.DEFAULT))
        lbracket = like.lbracket if isinstance(like, cst.List) else cst.LeftSquareBracket()
        rbracket = like.rbracket if isinstance(like, cst.List) else cst.RightSquareBracket()
        return cst.List(elems, lbracket=lbracket, rbracket=rbracket)
    return cst.List([cst.Element(v) for v in items])


def add_scratch(
    loc: Located, call: cst.Call, scratch: Sequence[cst.BaseExpression], edits: dict[cst.CSTNode, cst.CSTNode]
) -> None:
    """Append the `scratch` shapes to the call's `scratch_shapes` (adding the keyword when absent), as an entry of `edits`.
    The edit replaces the holding call or list: make no other edit inside that node in the same `replace_many`, or
    pass the edits through `nested_into` first."""
    holder, arg = grid_spec_keyword(loc, call, "scratch_shapes")
    check(
        holder is not call or keyword(call, "grid_spec") is None,
        "the grid spec is not a GridSpec(...) call pallasopt can edit",
    )
    if arg is None:
        sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        items = [cst.Element(s, comma=sep) for s in scratch[:-1]] + [cst.Element(scratch[-1])]
        edits[holder] = set_keyword(holder, "scratch_shapes", cst.List(items))
        return
    value = arg.value
    check(isinstance(value, cst.List | cst.Tuple), "scratch_shapes is not a literal list")
    assert isinstance(value, cst.List | cst.Tuple)
    elems = list(value.elements)
    if elems and elems[-1].comma is cst.MaybeSentinel.DEFAULT:
        elems[-1] = elems[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    for k, s in enumerate(scratch):
        comma = (
            cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if k < len(scratch) - 1 else cst.MaybeSentinel.DEFAULT
        )
        elems.append(cst.Element(s, comma=comma))
    edits[value] = value.with_changes(elements=elems)


def nested_into(loc: Located, edits: dict[cst.CSTNode, cst.CSTNode]) -> dict[cst.CSTNode, cst.CSTNode]:
    """`edits` with each edit inside another edit's node applied to that node's replacement instead (`add_scratch`
    replaces the whole pallas_call, which holds the BlockSpec edited too; its replacement shares the untouched
    children, so the inner node is found there by identity). All the edits inside one node go in one traversal
    (`replace_many`): a traversal rebuilds the whole node, so a second one would find no inner node by identity (an
    inline kernel lambda and a BlockSpec inside one call lost the lambda's edit that way). Innermost targets first."""

    def target(node: cst.CSTNode) -> cst.CSTNode | None:
        up = loc.parent(node)
        while up is not None and up not in edits:
            up = loc.parent(up)
        return up

    def depth(node: cst.CSTNode) -> int:
        n, up = 0, loc.parent(node)
        while up is not None:
            n, up = n + 1, loc.parent(up)
        return n

    groups: dict[cst.CSTNode, list[cst.CSTNode]] = {}
    for inner in edits:
        up = target(inner)
        if up is not None:
            groups.setdefault(up, []).append(inner)
    out = dict(edits)
    for up in sorted(groups, key=depth, reverse=True):
        out[up] = replace_many(out[up], {inner: out.pop(inner) for inner in groups[up]})
    return out


def forward_new_ref(lam: cst.Lambda) -> cst.Lambda:
    """A forwarding lambda (`matchers.forwarding_lambda`) taking one more ref last and passing it on after the
    others, for a kernel function that got a new last positional parameter (`ref_via_scratch`)."""
    names = {p.name.value for p in lam.params.params}
    new = fresh_name(names | {n.value for n in m.findall(lam.body, m.Name()) if isinstance(n, cst.Name)}, "scratch_ref")
    body = lam.body
    assert isinstance(body, cst.Call)
    args = list(body.args)
    n = len(lam.params.params)
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    new_arg = cst.Arg(cst.Name(new), comma=comma if len(args) > n else cst.MaybeSentinel.DEFAULT)
    if n:
        args[n - 1] = args[n - 1].with_changes(comma=comma)
    params = list(lam.params.params)
    if params:
        params[-1] = params[-1].with_changes(comma=comma)
    params.append(cst.Param(cst.Name(new)))
    return lam.with_changes(
        params=lam.params.with_changes(params=params), body=body.with_changes(args=[*args[:n], new_arg, *args[n:]])
    )


def ref_via_scratch(
    kernel: cst.FunctionDef,
    operand: int,
    ref: str,
    inner: str,
    prologue: Sequence[cst.BaseStatement],
    n_refs: int | None = None,
    added: Sequence[str] = (),
) -> cst.FunctionDef:
    """The kernel taking its `operand`-th ref as `inner` (in `ref`'s place) and new positional parameters named
    `added` (default: `ref`; scratch the call adds, in order) after its `n_refs` refs (default: last; a kernel behind
    a forwarding lambda may take values of the lambda's after them), running `prologue` (which builds `ref` from
    `inner` and them) first thing in the body, after a docstring: the body reads `ref` as before."""
    params = list(kernel.params.params)
    at = len(params) if n_refs is None else n_refs
    params[operand] = params[operand].with_changes(name=cst.Name(inner))
    comma = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    params[at - 1] = params[at - 1].with_changes(comma=comma)
    names, tail = list(added) or [ref], at < len(params)  # tail: parameters after the new ones
    for k, name in enumerate(names):
        end = k == len(names) - 1 and not tail
        params.insert(at + k, cst.Param(name=cst.Name(name), comma=cst.MaybeSentinel.DEFAULT if end else comma))
    body = kernel.body
    assert isinstance(body, cst.IndentedBlock)
    stmts = list(body.body)
    first = docstring_lines(stmts)  # keep the docstring first
    new_body = body.with_changes(body=[*stmts[:first], *prologue, *stmts[first:]])
    return kernel.with_changes(params=kernel.params.with_changes(params=params), body=new_body)


def append_grid_axis(loc: Located, node: cst.Call, extent: str, edits: dict[cst.CSTNode, cst.CSTNode]) -> None:
    """Append an axis of `extent` (source text) to the call's grid, innermost, as an entry of `edits`: in the grid's
    tuple literal (followed through a local name), else as `(grid, extent)`."""
    holder, arg = grid_spec_keyword(loc, node, "grid")
    check(arg is not None, "the pallas_call has no grid= to extend")
    assert arg is not None
    value = arg.value
    target = resolve(loc, holder, value)
    if isinstance(target, cst.Tuple) and target.elements:
        elems = list(target.elements)
        elems[-1] = elems[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        new = target.with_changes(elements=[*elems, cst.Element(cst.parse_expression(extent))])
        check(target not in edits, "the grid is shared with another edited node")
        edits[target] = new
        return
    check(not isinstance(target, cst.Tuple | cst.List), "the grid is an empty or list literal")
    new_value = cst.parse_expression(f"({code(value)}, {extent})")
    edits[arg] = arg.with_changes(value=new_value)


@dataclass(frozen=True)
class GridLocals:
    """Locals that stand for `pl.program_id(axis)` (and, with `counts`, `pl.num_programs(axis)`) inside statements
    moved under a `pl.when`: plain interpret mode cannot lower either there, so a pass binds them before it
    (`bind`) and rewrites the moved statements to read the locals (`use`). `pids` maps every axis read to its local,
    those the kernel had bound already included; `new_pids` and `counts` are what `bind` binds."""

    pids: Mapping[int, str]
    new_pids: tuple[int, ...]
    counts: Mapping[int, str]

    def bind(self, pl: str) -> list[str]:
        return [f"{self.pids[a]} = {pl}.program_id({a})" for a in self.new_pids] + [
            f"{n} = {pl}.num_programs({a})" for a, n in sorted(self.counts.items())
        ]

    def use(self, node: N) -> N:
        pids, counts = self.pids, self.counts

        class UseLocals(cst.CSTTransformer):
            def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
                arg = original.args[0].value if len(original.args) == 1 else None
                if isinstance(arg, cst.Integer):
                    axis = int(arg.evaluated_value)
                    if is_call_to(original, "program_id") and axis in pids:
                        return cst.Name(pids[axis])
                    if is_call_to(original, "num_programs") and axis in counts:
                        return cst.Name(counts[axis])
                return updated

        return cast(N, node.visit(UseLocals()))


def _grid_axes(nodes: Sequence[cst.CSTNode], fn: str) -> set[int]:
    out: set[int] = set()
    for node in nodes:
        for c in m.findall(node, m.Call()):
            arg = c.args[0].value if isinstance(c, cst.Call) and len(c.args) == 1 else None
            if isinstance(c, cst.Call) and isinstance(arg, cst.Integer) and is_call_to(c, fn):
                out.add(int(arg.evaluated_value))
    return out


def grid_locals(
    nodes: Sequence[cst.CSTNode],
    taken: set[str],
    *,
    also: Iterable[int] = (),
    bound: Mapping[int, str] | None = None,
    counts: bool = False,
) -> GridLocals:
    """The `GridLocals` for the program ids `nodes` read (plus the axes `also`, e.g. a mask's), named `pid{axis}`
    (`num{axis}`) with underscores until they clash with nothing in `taken`; an axis in `bound` keeps the local the
    kernel already has. With `counts`, `num_programs` reads get locals too."""
    known = dict(bound or {})
    used = set(taken) | set(known.values())
    pids = dict(known)
    new: list[int] = []
    for a in sorted((_grid_axes(nodes, "program_id") | set(also)) - set(known)):
        pids[a] = fresh_name(used, f"pid{a}")
        used.add(pids[a])
        new.append(a)
    nums: dict[int, str] = {}
    for a in sorted(_grid_axes(nodes, "num_programs")) if counts else ():
        nums[a] = fresh_name(used, f"num{a}")
        used.add(nums[a])
    return GridLocals(pids, tuple(new), nums)


def with_grid_index(lam: cst.Lambda, want: str) -> tuple[cst.Lambda, str]:
    """An index map `lam` taking one more, last grid index (for an axis a pass appends to the grid), named `want`
    with underscores until it clashes with nothing `lam` reads or takes; its body is unchanged (the caller may use
    the name there)."""
    name = fresh_name(used_names(lam) | {p.name.value for p in lam.params.params}, want)
    params = [p.with_changes(comma=cst.MaybeSentinel.DEFAULT) for p in (*lam.params.params, cst.Param(cst.Name(name)))]
    return lam.with_changes(params=lam.params.with_changes(params=params)), name


def split_specs_on_new_axis(
    loc: Located,
    node: cst.Call,
    facts: CallFacts,
    dims: Mapping[int, int],
    block: Callable[[str], str],
    edits: dict[cst.CSTNode, cst.CSTNode],
    *,
    index: str,
    along: str,
) -> str:
    """For a grid axis a pass appends innermost (`append_grid_axis`): every BlockSpec of the call gets an index map
    taking that axis's index too (named `index`, with underscores until it clashes with nothing), and each input in
    `dims` (input position -> block dim) walks the axis along that dim, where its map returned 0 (`along` names the
    dim in the reasons), its block there becoming `block(text)` of the dim's block as written. The edits go into
    `edits`; returns the written block of the first walked dim (the whole length the axis splits)."""
    specs = spec_nodes(loc, node)
    check(len(specs) == len(facts.operands), "the BlockSpecs are not a literal list pallasopt can edit")
    role: dict[int, int | None] = {}
    for k, spec in enumerate(specs):
        check(isinstance(spec, cst.Call), f"operand {k}'s BlockSpec is not a call pallasopt can edit")
        want = dims.get(k) if k < len(facts.inputs) else None
        check(role.get(id(spec), want) == want, f"operand {k} shares its BlockSpec with an operand split otherwise")
        role[id(spec)] = want
    whole: str | None = None
    for k, spec in enumerate(specs):
        assert isinstance(spec, cst.Call)
        if spec in edits:
            continue
        shape, lam = blockspec_parts(spec)
        check(isinstance(lam, cst.Lambda), f"operand {k}'s index map is not a lambda")
        assert isinstance(lam, cst.Lambda)
        check(
            len(lam.params.params) == len(facts.grid) and lam.params.star_arg is cst.MaybeSentinel.DEFAULT,
            f"operand {k}'s index map does not take exactly the {len(facts.grid)} grid indices",
        )
        wider, name = with_grid_index(lam, index)
        body, new_spec = lam.body, spec
        bdim = dims.get(k) if k < len(facts.inputs) else None
        if bdim is not None:
            check(isinstance(body, cst.Tuple) and len(body.elements) > bdim, f"input {k}'s index map is not a tuple")
            assert isinstance(body, cst.Tuple)
            check(code(body.elements[bdim].value) == "0", f"input {k}'s index map does not return 0 along {along}")
            body = body.with_changes(
                elements=[e.with_changes(value=cst.Name(name)) if i == bdim else e for i, e in enumerate(body.elements)]
            )
            check(isinstance(shape, cst.Tuple | cst.List), f"input {k}'s block shape is not a literal tuple")
            assert isinstance(shape, cst.Tuple | cst.List)
            text = code(shape.elements[bdim].value)
            whole = whole or text
            piece = cst.parse_expression(block(text))
            new_shape = shape.with_changes(
                elements=[e.with_changes(value=piece) if i == bdim else e for i, e in enumerate(shape.elements)]
            )
            new_spec = replace_arg(new_spec, shape, new_shape)
        edits[spec] = replace_arg(new_spec, lam, wider.with_changes(body=body))
    check(whole is not None, f"no input is walked along {along}")
    assert whole is not None
    return whole
