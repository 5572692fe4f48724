"""Build a KernelIR for untrusted (LLM-written) source without running it here: trace it in a child process.

The evaluation worker (`python -m pallasopt.harness.worker`, op "facts") loads and traces the module and replies with
`CallFacts.to_dict()` for each pallas_call; this module rebuilds the frozen facts from those dicts. The result has
`workload=None` and index maps without an evaluable `fn` (affine maps keep their closed form).
"""

from __future__ import annotations

import ast
import dataclasses
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any

from ..errors import KernelError
from ..harness.subproc import run_child
from ..ir import facts as facts_module
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR, parse_cst
from ..pyparse import parse_module
from ..workload import inspect_source

TRACE_TIMEOUT_S = 180.0


def ir_from_source_isolated(
    source: str,
    path: str,
    recipe: tuple[str, ...] = (),
    *,
    dims: Mapping[str, int] | None = None,
    timeout_s: float = TRACE_TIMEOUT_S,
) -> KernelIR:
    """Parse `source` here, trace it in a child process, and return its KernelIR (`workload=None`).

    `dims` are the problem dimensions to trace at (default: the integer literal defaults of `make_inputs`, read
    statically). Raises `KernelError` when the module is malformed, fails to trace, crashes or hangs the child.
    """
    module = parse_cst(source, path)
    spec = inspect_source(source, path)
    use_dims = dict(dims) if dims is not None else static_dims(source)
    request = {"op": "facts", "source": source, "path": path, "dims": use_dims}
    child = run_child("pallasopt.harness.worker", request, timeout_s=timeout_s)
    if child.reply is None:
        raise KernelError(f"tracing failed: {child.message}", path=path, line=spec.entry_line)
    if not child.reply.get("ok"):
        raise KernelError(f"tracing failed: {child.reply.get('message', 'unknown error')}", path=path)
    calls = tuple(calls_from_dicts(child.reply.get("calls") or []))
    if not calls:
        raise KernelError(f"entry {spec.entry!r} reaches no pl.pallas_call when traced", path=path)
    return KernelIR(
        source=source,
        path=path,
        calls=calls,
        dims=use_dims,
        entry=spec.entry,
        recipe=recipe,
        module=module,
        workload=None,
    )


def static_dims(source: str) -> dict[str, int]:
    """The integer defaults of `make_inputs`'s keyword parameters, read with `ast` (constant expressions only)."""
    tree = parse_module(source)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "make_inputs"), None)
    if fn is None:
        return {}
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True))
    pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
    out: dict[str, int] = {}
    for arg, default in pairs:
        try:
            value = _const_int(default)
        except ValueError:
            continue
        if arg.arg != (positional[0].arg if positional else None):
            out[arg.arg] = value
    return out


def _const_int(node: ast.expr) -> int:
    """Evaluate an integer constant expression (literals, + - * // ** and unary minus); ValueError otherwise."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_const_int(node.operand)
    if isinstance(node, ast.BinOp):
        a, b = _const_int(node.left), _const_int(node.right)
        if isinstance(node.op, ast.Add):
            return a + b
        if isinstance(node.op, ast.Sub):
            return a - b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, ast.FloorDiv) and b:
            return a // b
        if isinstance(node.op, ast.Pow) and 0 <= b <= 64:
            return int(a**b)
    raise ValueError("not an integer constant expression")


# ------------------------------------------------------------------------------------------ from-dict of facts


def calls_from_dicts(items: list[Mapping[str, Any]]) -> list[CallFacts]:
    """Rebuild `CallFacts` values from their `to_dict()` form (lists back to tuples, nested dataclasses)."""
    return [from_plain(CallFacts, d) for d in items]


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, vars(facts_module))


def from_plain(typ: Any, value: Any) -> Any:
    """The inverse of `facts.plain` for the facts dataclasses, guided by their type hints."""
    if value is None:
        return None
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(typ) if a is not type(None)]
        return from_plain(options[0], value) if options else value
    if dataclasses.is_dataclass(typ) and isinstance(typ, type):
        hints = _hints(typ)
        kwargs = {
            f.name: from_plain(hints[f.name], value[f.name])
            for f in dataclasses.fields(typ)
            if f.compare and f.name in value
        }
        return typ(**kwargs)
    if origin is tuple:
        args = typing.get_args(typ)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_plain(args[0], v) for v in value)
        if args:
            return tuple(from_plain(a, v) for a, v in zip(args, value, strict=True))
        return tuple(value)
    if origin is dict or typ is dict:
        return dict(value)
    return value
