"""Index helpers of the 2-D tile rules (tiles.py): axes of `offs[:, None]` subscripts, address terms, scalar
index expressions as plain Python."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from .exprs import Declined, call_arg, tl_name
from .source import code

GRID = ("_g0", "_g1", "_g2")  # the kernel body's names of pl.program_id(0..2)


@dataclass(frozen=True)
class Axis:
    """One axis of a 2-D access: block size, what indexes the block ("t:NAME" tile, "iter", None), stride."""

    size: str
    tile: str | None
    stride: str


def is_tile_kernel(fn: cst.FunctionDef) -> bool:
    """Whether the kernel uses 2-D offsets (`x[:, None]`), tl.dot or block pointers: then the tile rules apply."""
    text = code(fn)
    return any(s in text for s in ("[:, None]", "[None, :]", ".dot(", "make_block_ptr"))


def axis_of(sub: cst.Subscript) -> int | None:
    els = sub.slice
    if len(els) != 2:
        return None
    kinds = []
    for e in els:
        if isinstance(e.slice, cst.Slice) and e.slice.lower is None and e.slice.upper is None:
            kinds.append(":")
        elif isinstance(e.slice, cst.Index) and code(e.slice.value) == "None":
            kinds.append("N")
        else:
            return None
    return {(":", "N"): 0, ("N", ":"): 1}.get((kinds[0], kinds[1]))


def terms(e: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Add):
        return terms(e.left) + terms(e.right)
    return [e]


def norm(text: str) -> str:
    return "".join(text.split()).replace("(", "").replace(")", "")


def conj(m: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(m, cst.BinaryOperation) and isinstance(m.operator, cst.BitAnd):
        return conj(m.left) + conj(m.right)
    return [m]


def calls(node: cst.CSTNode) -> list[cst.Call]:
    found: list[cst.Call] = []

    class _V(cst.CSTVisitor):
        def visit_Call(self, n: cst.Call) -> None:
            found.append(n)

    node.visit(_V())
    return found


@dataclass
class _Py(cst.CSTTransformer):
    line: int
    bad: list[str] = field(default_factory=list)

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = tl_name(original.func)
        if name is None:
            return updated
        if name == "program_id":
            axis = call_arg(original, 0, "axis")
            return cst.parse_expression(f"_p[{code(axis) if axis is not None else 0}]")
        simple = {"cdiv": "_cdiv", "minimum": "min", "maximum": "max"}
        if name in simple:
            return updated.with_changes(func=cst.Name(simple[name]))
        self.bad.append(name)
        return updated


def py(e: cst.BaseExpression, line: int) -> str:
    """A scalar index expression as plain Python (tl.cdiv -> _cdiv, tl.program_id(a) -> _p[a])."""
    t = _Py(line)
    out = code(e.visit(t))  # type: ignore[arg-type]
    if t.bad:
        raise Declined(line, f"tl.{t.bad[0]} in the program-id mapping or loop bounds is not in the tile rules")
    return out
