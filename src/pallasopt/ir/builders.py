"""libcst builders every pass may use: rename names in a body, pick fresh names, build tuple and index-map
expressions, renumber grid axes. The read-only lookups they rely on are in `matchers.py`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

import libcst as cst
import libcst.matchers as m

from ..errors import check
from .matchers import PROGRAM_ID, blockspec_parts, code

N = TypeVar("N", bound=cst.CSTNode)


class RenameNames(cst.CSTTransformer):
    """Rename variables: every `Name` in `renames`, except an attribute's name (`x.o_ref`) or a call's keyword."""

    def __init__(self, renames: Mapping[str, str]) -> None:
        super().__init__()
        self.renames = dict(renames)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        return False  # only the object part can be a variable: visited by hand in leave_Attribute

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        value = original.value.visit(self)
        assert isinstance(value, cst.BaseExpression)
        return updated.with_changes(value=value)

    def leave_Arg(self, original: cst.Arg, updated: cst.Arg) -> cst.Arg:
        return updated.with_changes(keyword=original.keyword)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.Name:
        new = self.renames.get(original.value)
        return updated.with_changes(value=new) if new is not None else updated


def rename_names(node: N, renames: Mapping[str, str]) -> N:
    """`node` with every use of the names in `renames` renamed (a ref in a kernel body, a loop variable...)."""
    out = node.visit(RenameNames(renames))
    assert isinstance(out, type(node))
    return out


class InlineNames(RenameNames):
    """Replace variables by expressions (parenthesized): every `Name` in `values`, except attribute names and
    keywords. The replacements are not visited again."""

    def __init__(self, values: Mapping[str, cst.BaseExpression]) -> None:
        super().__init__({})
        self.values = dict(values)

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:  # type: ignore[override]
        new = self.values.get(original.value)
        if new is None:
            return updated
        return cst.parse_expression(f"({code(new)})")


def inline_names(node: cst.BaseExpression, values: Mapping[str, cst.BaseExpression]) -> cst.BaseExpression:
    """`node` with every use of a name in `values` replaced by its expression, in parentheses (a helper function's
    parameters by the caller's arguments, a local by the value it was assigned)."""
    out = node.visit(InlineNames(values))
    assert isinstance(out, cst.BaseExpression)
    return out


def fresh_name(used: set[str], want: str) -> str:
    """`want`, prefixed with underscores until it clashes with none of `used`."""
    name = want
    while name in used:
        name = "_" + name
    return name


def tuple_expr(items: Sequence[str | cst.BaseExpression]) -> cst.Tuple:
    """`(a, b)` from source texts or expressions (`(a,)` for one item, `()` for none)."""
    exprs = [cst.parse_expression(i) if isinstance(i, str) else i for i in items]
    sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    elements = [cst.Element(e, comma=sep) if k < len(exprs) - 1 else cst.Element(e) for k, e in enumerate(exprs)]
    if len(elements) == 1:
        elements[0] = elements[0].with_changes(comma=cst.Comma())
    return cst.Tuple(elements)


def index_map_expr(params: Sequence[str], results: Sequence[str | cst.BaseExpression]) -> cst.Lambda:
    """`lambda i, j, k: (i, j)`: an index map over grid indices `params` returning block indices `results`."""
    text = "lambda " + ", ".join(params) + ": " + code(tuple_expr(results))
    lam = cst.parse_expression(text if params else "lambda: " + code(tuple_expr(results)))
    assert isinstance(lam, cst.Lambda)
    return lam


class _Renumber(cst.CSTTransformer):
    def __init__(self, mapping: Mapping[int, int]) -> None:
        super().__init__()
        self.mapping = mapping

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if not m.matches(original, PROGRAM_ID) or not updated.args:
            return updated
        arg = updated.args[0]
        assert isinstance(arg.value, cst.Integer)  # program_id_axes() checked it first
        new = self.mapping[int(arg.value.evaluated_value)]
        return updated.with_changes(args=[arg.with_changes(value=cst.Integer(str(new))), *updated.args[1:]])


def renumber_program_ids(node: N, mapping: Mapping[int, int]) -> N:
    """`node` with every `program_id(a)` / `num_programs(a)` axis literal `a` replaced by `mapping[a]` (check
    `program_id_axes(node)` first: every axis must be a literal in `mapping`)."""
    out = node.visit(_Renumber(mapping))
    assert isinstance(out, type(node))
    return out


def affine_results(rows: Sequence[Sequence[int]], grid_names: Sequence[str], axis_of: Mapping[int, int]) -> list[str]:
    """Source text of an affine index map's results: row `(c0, c1, ..., const)` over old grid axes, written over
    `grid_names` with old axis a at new position `axis_of[a]` (e.g. `["g1", "2 * g0 + 1"]`)."""
    out = []
    for row in rows:
        terms = [
            f"{c} * {grid_names[axis_of[a]]}" if c != 1 else grid_names[axis_of[a]] for a, c in enumerate(row[:-1]) if c
        ]
        if row[-1] or not terms:
            terms.append(str(row[-1]))
        out.append(" + ".join(terms))
    return out


def substitute(node: N, mapping: Mapping[cst.CSTNode, cst.CSTNode]) -> N:
    """`node` with the nodes in `mapping` (by identity, as found inside `node`) replaced, in one traversal."""

    class Replacer(cst.CSTTransformer):
        def on_leave(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:  # type: ignore[override]
            return mapping.get(original, updated)

    out = node.visit(Replacer())
    assert isinstance(out, cst.CSTNode)
    return out  # type: ignore[return-value]


def _swap(xs: tuple[str, ...]) -> tuple[str, ...]:
    return (*xs[:-2], xs[-1], xs[-2])


def swapped_blockspec(spec: cst.Call, affine: Sequence[Sequence[int]], n_grid: int) -> cst.Call:
    """The BlockSpec of a transposed operand: the last two block dims and index-map results in the other order (the
    map as written when it is a lambda of the grid indices returning a tuple, else from the traced affine rows)."""
    shape, _ = blockspec_parts(spec)
    check(isinstance(shape, cst.Tuple | cst.List) and len(shape.elements) >= 2, "the block shape is not a tuple")
    assert isinstance(shape, cst.Tuple | cst.List)
    dims = _swap(tuple(code(e.value) for e in shape.elements))
    _, imap = blockspec_parts(spec)
    params = [p.name.value for p in imap.params.params] if isinstance(imap, cst.Lambda) else []
    names = params if len(params) == n_grid else [f"g{i}" for i in range(n_grid)]
    body = imap.body if isinstance(imap, cst.Lambda) else None
    if isinstance(body, cst.Tuple) and len(body.elements) == len(dims) and len(params) == n_grid:
        results = list(_swap(tuple(code(e.value) for e in body.elements)))  # as written: dims-generic
    else:  # from the traced affine map (an axis of extent 1 at the traced dims reads as a constant)
        results = list(_swap(tuple(affine_results(affine, names, {i: i for i in range(n_grid)}))))
    rest = [x for x in spec.args if x.keyword is not None and x.keyword.value not in ("block_shape", "index_map")]
    new_shape = cst.parse_expression(f"({', '.join(dims)})")
    return spec.with_changes(args=[cst.Arg(new_shape), cst.Arg(index_map_expr(names, results)), *rest])


def operand_text(expr: cst.BaseExpression) -> str:
    """`expr` as the operand of an attribute access (`<expr>.reshape(...)`): parenthesized unless it is a name, an
    attribute, a call or a subscript."""
    simple = isinstance(expr, cst.Name | cst.Attribute | cst.Call | cst.Subscript)
    return code(expr) if simple else f"({code(expr)})"


def replace_arg(call: cst.Call, old: cst.BaseExpression, new: cst.BaseExpression) -> cst.Call:
    """`call` with the argument whose value is `old` (by identity) taking the value `new`."""
    return call.with_changes(args=[a.with_changes(value=new) if a.value is old else a for a in call.args])


def parse_statements(text: str) -> list[cst.BaseStatement]:
    """The statements of `text`, their blank lines unindented (so they print cleanly wherever they are placed)."""
    return [
        st.with_changes(leading_lines=[cst.EmptyLine(indent=False) for _ in st.leading_lines])
        for st in cst.parse_module(text).body
    ]
