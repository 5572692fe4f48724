"""Reading a Triton file: its `@triton.jit` kernels, helper jit functions, launchers and module constants."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from ..errors import UserError


@dataclass(frozen=True)
class TritonFile:
    """What the rules need from a Triton source file."""

    path: str
    module: cst.Module
    jit: dict[str, cst.FunctionDef]  # every @triton.jit function, kernels and helpers
    launched: frozenset[str]  # the jit functions launched as `name[grid](...)`
    functions: dict[str, cst.FunctionDef]  # the other top-level functions
    lines: dict[int, int]  # id(node) -> line, for statements and calls

    def line(self, node: cst.CSTNode) -> int:
        return self.lines.get(id(node), 0)


def _is_jit(fn: cst.FunctionDef) -> bool:
    for d in fn.decorators:
        node = d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator
        code = cst.Module([]).code_for_node(node)
        if code in ("triton.jit", "jit", "triton.autotune") or code.endswith(".jit"):
            return True
    return False


def launch_target(call: cst.Call) -> str | None:
    """`name` for a launch `name[grid](...)`, else None."""
    f = call.func
    if isinstance(f, cst.Subscript) and isinstance(f.value, cst.Name):
        return f.value.value
    return None


class _Lines(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.lines: dict[int, int] = {}
        self.launches: set[str] = set()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement, cst.Call, cst.FunctionDef)):
            self.lines[id(node)] = self.get_metadata(PositionProvider, node).start.line
        if isinstance(node, cst.Call) and launch_target(node):
            self.launches.add(launch_target(node) or "")
        return True


def read_triton(path: str, text: str) -> TritonFile:
    """Parse `text` (the file at `path`); a syntax error is one line naming the file and line."""
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as e:
        raise UserError(f"syntax error: {e.message}", path=path, line=e.raw_line, hint="fix the Python syntax") from e
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    lines = _Lines()
    wrapper.visit(lines)
    jit: dict[str, cst.FunctionDef] = {}
    functions: dict[str, cst.FunctionDef] = {}
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef):
            (jit if _is_jit(stmt) else functions)[stmt.name.value] = stmt
    if not jit:
        raise UserError(
            "no @triton.jit function in the file", path=path, line=1, hint="pass the file that defines the kernels"
        )
    launched = frozenset(n for n in lines.launches if n in jit)
    return TritonFile(path, module, jit, launched, functions, lines.lines)


def code(node: cst.CSTNode) -> str:
    """The source text of `node`."""
    return cst.Module([]).code_for_node(node).strip()


def arg_code(a: cst.Arg) -> str:
    """One call argument as source, without its trailing comma."""
    value = code(a.value)
    if a.keyword is not None:
        return f"{a.keyword.value}={value}"
    return f"{a.star}{value}"
