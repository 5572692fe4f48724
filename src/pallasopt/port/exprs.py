"""Value expressions of a Triton kernel rewritten to jax.numpy over Pallas blocks."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst

from .source import arg_code, code
from .tl import DECLINED, DROPPED, DTYPES, MATH, REDUCTIONS

TL_PREFIXES = ("tl.", "triton.language.", "tl.math.", "tl.extra.cuda.libdevice.", "libdevice.", "triton.language.math.")


class Declined(Exception):
    """A construct outside the rule subset; `line` is in the Triton file."""

    def __init__(self, line: int, why: str) -> None:
        self.line = line
        self.why = why
        super().__init__(f"line {line}: {why}")


def tl_name(func: cst.BaseExpression) -> str | None:
    """`sum` for `tl.sum` / `tl.math.sum` / `libdevice.sum`, else None."""
    text = code(func)
    if not re.fullmatch(r"[A-Za-z_][\w.]*", text):
        return None
    for p in sorted(TL_PREFIXES, key=len, reverse=True):
        if text.startswith(p):
            return text[len(p) :]
    return None


def _arg(call: cst.Call, pos: int, kw: str) -> cst.BaseExpression | None:
    for i, a in enumerate(call.args):
        if (a.keyword is None and a.star == "" and i == pos) or (a.keyword is not None and a.keyword.value == kw):
            return a.value
    return None


@dataclass
class ExprContext:
    """What the rewriter needs from the kernel translator."""

    line: int
    pointers: frozenset[str]
    jit_helpers: frozenset[str]
    bare_math: frozenset[str]  # names imported from triton modules (e.g. `from triton.language.math import tanh`)
    load: Callable[[cst.Call], str] | None  # translates a tl.load call; None where loads are not allowed
    # 2-D tile kernels (tiles.py): `offs[:, None]` of an offset vector -> a 2-D index expression (None: as written),
    # and the names that only exist as offset vectors (used bare, they are declined)
    subscript: Callable[[cst.Subscript], str | None] | None = None
    offsets: frozenset[str] = frozenset()


class _Rewriter(cst.CSTTransformer):
    def __init__(self, ctx: ExprContext) -> None:
        self.ctx = ctx
        self.replaced: dict[int, str] = {}

    def _decline(self, why: str) -> None:
        raise Declined(self.ctx.line, why)

    def visit_Subscript(self, node: cst.Subscript) -> bool:
        if self.ctx.subscript is not None:
            text = self.ctx.subscript(node)
            if text is not None:
                self.replaced[id(node)] = text
                return False
        return True

    def leave_Subscript(self, original: cst.Subscript, updated: cst.Subscript) -> cst.BaseExpression:
        if id(original) in self.replaced:
            return cst.parse_expression(self.replaced[id(original)])
        return updated

    def visit_Call(self, node: cst.Call) -> bool:
        name = tl_name(node.func)
        if name == "load":
            if self.ctx.load is None:
                self._decline("tl.load inside a helper function is not in the rule subset")
            assert self.ctx.load is not None
            self.replaced[id(node)] = self.ctx.load(node)
            return False
        if name == "store":
            self._decline("tl.store used as a value")
        return True

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if id(original) in self.replaced:
            return cst.parse_expression(self.replaced[id(original)])
        name = tl_name(original.func)
        args = ", ".join(arg_code(a) for a in updated.args)
        if name is not None:
            return cst.parse_expression(self._tl_call(name, original, updated, args))
        f = original.func
        if isinstance(f, cst.Attribute) and f.attr.value in ("to", "cast"):
            value = code(updated.func.value) if isinstance(updated.func, cst.Attribute) else ""
            return cst.parse_expression(f"_cast({value}, {code(updated.args[0].value)})")
        if isinstance(f, cst.Name) and f.value in self.ctx.bare_math and f.value in MATH:
            return cst.parse_expression(f"{MATH[f.value]}({args})")
        return updated

    def _tl_call(self, name: str, original: cst.Call, updated: cst.Call, args: str) -> str:
        if name == "dot" and self.ctx.subscript is not None:  # tile kernels: the MXU with an f32 result, as Triton
            a, b, acc = _arg(updated, 0, "input"), _arg(updated, 1, "other"), _arg(updated, 2, "acc")
            if a is None or b is None:
                self._decline("tl.dot needs two operands")
            out = _arg(updated, 6, "out_dtype")
            if out is not None and code(out) not in ("tl.float32", "jnp.float32"):
                self._decline(f"tl.dot with out_dtype={code(out)} is not in the rule subset (f32 results only)")
            dot = f"jnp.dot({code(a)}, {code(b)}, preferred_element_type=jnp.float32)"  # type: ignore[arg-type]
            return dot if acc is None or code(acc) == "None" else f"({code(acc)} + {dot})"
        if name in DECLINED:
            self._decline(f"tl.{name}: {DECLINED[name]}")
        if name == "program_id":
            axis = _arg(original, 0, "axis")
            if axis is None or code(axis) != "0":
                self._decline("a program id on axis > 0 (multi-axis grids are not in this build's rule subset)")
            return "_pid(_R)"
        if name == "num_programs":
            self._decline("tl.num_programs (persistent kernels) is not in the rule subset")
        if name == "arange":
            start, end = _arg(updated, 0, "start"), _arg(updated, 1, "end")
            if start is None or end is None:
                self._decline("tl.arange needs start and end")
            return f"(_iota({code(end)}, _W) + {code(start)})"  # type: ignore[arg-type]
        if name in REDUCTIONS:
            x = _arg(updated, 0, "input")
            axis = _arg(updated, 1, "axis")
            if x is None:
                self._decline(f"tl.{name} without an input")
            if axis is not None and code(axis) not in ("0", "None", "-1"):
                self._decline(f"tl.{name} over axis {code(axis)} of a 2-D block is not in the rule subset")
            return f'_red("{name}", {code(x)})'  # type: ignore[arg-type]
        if name in ("zeros", "full"):
            shape = _arg(updated, 0, "shape")
            if name == "zeros":
                dtype = _arg(updated, 1, "dtype")
                return f"_full({code(shape)}, 0, {code(dtype) if dtype else 'jnp.float32'}, _W)"  # type: ignore[arg-type]
            value, dtype = _arg(updated, 1, "value"), _arg(updated, 2, "dtype")
            return f"_full({code(shape)}, {code(value)}, {code(dtype) if dtype else 'jnp.float32'}, _W)"  # type: ignore[arg-type]
        if name in ("zeros_like", "full_like"):
            return f"jnp.{name}({args})"
        if name == "cast":
            return f"_cast({args})"
        if name == "constexpr":
            return f"({args})"
        if name in DTYPES:
            return f"{DTYPES[name]}({args})"
        if name in MATH:
            return f"{MATH[name]}({args})"
        if name in DROPPED:
            return "None"
        self._decline(f"tl.{name} is not in the rule subset")
        return ""

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        # tile kernels: `c_ptr.dtype.element_ty` (the element type of an argument) -> `c_ptr_dtype`, set by tiles.py
        text = code(node)
        if self.ctx.subscript is not None and text.endswith(".dtype.element_ty") and text[:-17] in self.ctx.pointers:
            self.replaced[id(node)] = f"{text[:-17]}_dtype"
            return False
        return True

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        if id(original) in self.replaced:
            return cst.parse_expression(self.replaced[id(original)])
        name = tl_name(original)
        if name is not None and name in DTYPES:
            return cst.parse_expression(DTYPES[name])
        if name == "constexpr":
            return cst.parse_expression("int")
        return updated

    def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
        if original.value in self.ctx.offsets:
            self._decline(
                f"the offset vector '{original.value}' is used without [:, None] / [None, :] in a 2-D tile kernel"
            )
        if original.value in self.ctx.pointers:
            self._decline(f"the pointer '{original.value}' is used as a value (pointer comparisons or casts)")
        return updated


def rewrite(e: cst.BaseExpression, ctx: ExprContext) -> str:
    """Source text of `e` over Pallas block values; raises `Declined` for constructs outside the subset."""
    return code(e.visit(_Rewriter(ctx)))  # type: ignore[arg-type]


def call_arg(call: cst.Call, pos: int, kw: str) -> cst.BaseExpression | None:
    """The argument at position `pos` or keyword `kw` of `call`."""
    return _arg(call, pos, kw)
