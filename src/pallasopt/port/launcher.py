"""The launcher (the Python function that calls `kernel[grid](...)`) rewritten from torch to jax.numpy.

It runs at trace time with concrete shapes, so shape arithmetic stays as written; each launch becomes a call of the
ported kernel that returns the arrays the kernel stores to (Triton writes in place; JAX returns new arrays).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from .exprs import Declined
from .source import TritonFile, arg_code, code, launch_target

TORCH_DTYPES = {
    "float32": "jnp.float32",
    "float": "jnp.float32",
    "float16": "jnp.float16",
    "half": "jnp.float16",
    "bfloat16": "jnp.bfloat16",
    "int32": "jnp.int32",
    "int64": "jnp.int32",
    "long": "jnp.int32",
    "int8": "jnp.int8",
    "uint8": "jnp.uint8",
    "bool": "jnp.bool_",
    "float64": "jnp.float32",
}
HELPERS = {
    "triton.cdiv": "_cdiv",
    "cdiv": "_cdiv",
    "triton.next_power_of_2": "_next_power_of_2",
    "next_power_of_2": "_next_power_of_2",
    "calculate_settings": "_calculate_settings",
}
BUILTINS = {
    "len",
    "min",
    "max",
    "int",
    "float",
    "bool",
    "isinstance",
    "tuple",
    "list",
    "range",
    "abs",
    "round",
    "dict",
    "str",
    "any",
    "all",
    "sum",
    "math.ceil",
    "math.floor",
    "math.sqrt",
}


@dataclass(frozen=True)
class LaunchInfo:
    """What the launcher rewrite needs to know about one kernel."""

    stored: tuple[int, ...]  # indexes of the params the kernel stores to
    params: tuple[str, ...]
    constexpr_literals: tuple[str, ...]  # constexpr params a launch may set with a literal (hoisted to constants)
    declined: str | None  # reason, when the rules declined the kernel


class _Launcher(cst.CSTTransformer):
    def __init__(self, tf: TritonFile, kernels: dict[str, LaunchInfo], local_funcs: set[str]):
        self.tf = tf
        self.kernels = kernels
        self.local_funcs = local_funcs
        self.notes: list[str] = []
        self.constants: dict[str, str] = {}

    def _line(self, node: cst.CSTNode) -> int:
        return self.tf.line(node)

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:
        params = updated.params.with_changes(
            params=[p.with_changes(annotation=None) for p in updated.params.params],
            kwonly_params=[p.with_changes(annotation=None) for p in updated.params.kwonly_params],
        )
        return updated.with_changes(decorators=[], params=params, returns=None)

    def leave_With(self, original: cst.With, updated: cst.With) -> cst.FlattenSentinel[cst.BaseStatement]:
        body = updated.body
        return cst.FlattenSentinel(body.body if isinstance(body, cst.IndentedBlock) else [])  # type: ignore[arg-type]

    def leave_If(self, original: cst.If, updated: cst.If) -> cst.If:
        calls = self._unknown_calls(original.test)
        if calls:
            self.notes.append(
                f"{self.tf.path}:{self._line(original)}: `if {code(original.test)}:` calls {', '.join(sorted(calls))}, "
                "code that queries the GPU or lives outside this file: the port takes the other path"
            )
            return updated.with_changes(test=cst.Name("False"))
        return updated

    def _unknown_calls(self, e: cst.BaseExpression) -> set[str]:
        found: set[str] = set()
        outer = self

        class _V(cst.CSTVisitor):
            def visit_Call(self, n: cst.Call) -> None:
                f = code(n.func)
                if (isinstance(n.func, cst.Name) and f not in BUILTINS and f not in HELPERS) or (
                    isinstance(n.func, cst.Attribute) and f.split(".")[0] in outer.local_funcs
                ):
                    found.add(f)

        e.visit(_V())
        return found

    def leave_Assert(self, original: cst.Assert, updated: cst.Assert) -> cst.BaseSmallStatement:
        text = code(original.test)
        if any(w in text for w in ("is_cuda", "device", "is_contiguous", "torch.")):
            return cst.Pass()
        return updated

    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        text = code(original)
        if text.startswith("torch.") and text[6:] in TORCH_DTYPES:
            return cst.parse_expression(TORCH_DTYPES[text[6:]])
        if original.attr.value == "device" and not text.startswith("torch."):
            return cst.Name("_DEVICE")
        if original.attr.value in ("is_cuda",):
            return cst.Name("True")
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        f = code(original.func)
        args = [arg_code(a) for a in updated.args]
        pos = [code(a.value) for a in updated.args if a.keyword is None and not a.star]
        kw = {a.keyword.value: code(a.value) for a in updated.args if a.keyword is not None}
        if f in HELPERS:
            return cst.parse_expression(f"{HELPERS[f]}({', '.join(args)})")
        if f in ("torch.empty_like", "torch.zeros_like"):
            dt = f", dtype={kw['dtype']}" if "dtype" in kw else ""
            return cst.parse_expression(f"jnp.zeros_like({pos[0]}{dt})")
        if f in ("torch.empty", "torch.zeros"):
            dt = kw.get("dtype", "jnp.float32")
            return cst.parse_expression(f"_empty({', '.join(pos)}, dtype={dt})")
        if f.startswith("torch."):
            raise Declined(self._line(original), f"the launcher calls {f}, which the port does not translate")
        if isinstance(original.func, cst.Attribute) and isinstance(updated.func, cst.Attribute):
            obj = code(updated.func.value)
            m = original.func.attr.value
            if m == "view" or m == "reshape":
                return cst.parse_expression(f"{obj}.reshape({', '.join(args)})")
            if m == "contiguous" or m == "detach" or m == "clone":
                return cst.parse_expression(obj)
            if m == "stride":
                return cst.parse_expression(f"_stride({obj}{', ' + pos[0] if pos else ''})")
            if m == "numel":
                return cst.parse_expression(f"{obj}.size")
            if m == "size":
                return cst.parse_expression(f"{obj}.shape[{pos[0]}]" if pos else f"{obj}.shape")
            if m == "dim":
                return cst.parse_expression(f"{obj}.ndim")
            if m == "element_size":
                return cst.parse_expression(f"{obj}.dtype.itemsize")
        return updated

    def leave_Expr(self, original: cst.Expr, updated: cst.Expr) -> cst.BaseSmallStatement:
        call = original.value
        if not isinstance(call, cst.Call):
            return updated
        name = launch_target(call)
        if name is None or name not in self.kernels:
            return updated
        info = self.kernels[name]
        if info.declined:
            msg = f"{self.tf.path}: kernel {name} was declined by the port rules: {info.declined}"
            return _small(f"raise NotImplementedError({msg!r})")
        new = updated.value
        assert isinstance(new, cst.Call) and isinstance(new.func, cst.Subscript)
        grid = code(new.func.slice[0].slice.value) if isinstance(new.func.slice[0].slice, cst.Index) else "None"
        targets: list[str] = []
        args: list[str] = []
        for i, a in enumerate(new.args):
            key = a.keyword.value if a.keyword is not None else (info.params[i] if i < len(info.params) else None)
            if key in info.constexpr_literals and isinstance(a.value, (cst.Integer, cst.Float)):
                const = f"{name.strip('_').upper()}_{key}"
                self.constants[const] = code(a.value)
                args.append(f"{key}={const}")
                continue
            args.append(arg_code(a))
            if key in {info.params[j] for j in info.stored}:
                if not isinstance(a.value, cst.Name):
                    raise Declined(
                        self._line(original),
                        f"the array the kernel {name} stores to is passed as "
                        f"'{code(a.value)}': bind it to a variable first",
                    )
                targets.append(a.value.value)
        lhs = ", ".join(targets) + ("," if len(targets) == 1 else "")
        return _small(f"{lhs} = _launch_{name}({grid}, {', '.join(args)})")


def _small(text: str) -> cst.BaseSmallStatement:
    stmt = cst.parse_statement(text)
    assert isinstance(stmt, cst.SimpleStatementLine)
    return stmt.body[0]


def rewrite_launcher(
    tf: TritonFile, fn: cst.FunctionDef, kernels: dict[str, LaunchInfo]
) -> tuple[str, list[str], dict[str, str]]:
    """The launcher as jax.numpy source, the notes on paths it could not take, and hoisted block-size constants."""
    t = _Launcher(tf, kernels, set(tf.functions) - {fn.name.value})
    new = fn.visit(t)
    assert isinstance(new, cst.FunctionDef)
    return code(new) + "\n", t.notes, t.constants


def launches(fn: cst.FunctionDef) -> list[str]:
    """The kernels `fn` launches, in source order."""
    found: list[str] = []

    class _V(cst.CSTVisitor):
        def visit_Call(self, n: cst.Call) -> None:
            name = launch_target(n)
            if name:
                found.append(name)

    fn.visit(_V())
    return found
