"""A kernel file as the user hands it in: plain Python, or an LLM reply with prose and ``` fences around the code.

Also the JAX API drift that old suite kernels carry (names removed from the Pallas API since they were written):
found statically, reported as one line naming the call and its replacement, and rewritten only when asked.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass

from ..errors import KernelError
from ..pyparse import parse_module

_OPEN_FENCE = re.compile(r"^```(?:python|py|python3)?[ \t]*\n", re.MULTILINE)
_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^[ \t]*```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class KernelCode:
    """The Python code of a kernel file and where it came from (``extracted``: it was cut out of a reply)."""

    code: str
    path: str
    extracted: bool = False
    first_line: int = 1  # the line of the original file where `code` starts
    cut_off: bool = False  # the reply's ```python block is never closed (its code parses and is taken as it stands)

    def notes(self) -> tuple[str, ...]:
        """What a user should know about where the code came from (one line each)."""
        if not self.cut_off:
            return ()
        last = self.first_line + self.code.rstrip("\n").count("\n")
        return (
            f"the reply's ```python block (line {self.first_line}) is never closed: the reply looks cut off after "
            f"line {last}; its code parses and is used as it stands (`pallasopt check` tells whether it is whole)",
        )


def _parse(text: str) -> ast.Module | SyntaxError:
    """The module, or why it does not parse (a null byte counts as a syntax error)."""
    try:
        return parse_module(text)
    except SyntaxError as e:
        return e
    except ValueError as e:
        return SyntaxError(str(e))


def extract_code(text: str, path: str) -> KernelCode:
    """The module's code: the file itself if it is Python, else the one fenced Python block that is a module.

    An LLM reply often holds prose and one or more ``` blocks; the block taken is the longest one that parses and
    defines something at top level (a snippet of a few lines is an explanation, not the module)."""
    whole = _parse(text)
    if isinstance(whole, ast.Module):
        return KernelCode(text, path)
    blocks = []
    for m in _FENCE.finditer(text):
        lang, body = m.group(1).lower(), m.group(2)
        tree = _parse(body) if lang in ("", "python", "py", "python3") else None
        if isinstance(tree, ast.Module) and any(
            isinstance(n, ast.FunctionDef | ast.ClassDef | ast.Assign | ast.Import | ast.ImportFrom) for n in tree.body
        ):
            blocks.append((len(body), text[: m.start(2)].count("\n") + 1, body))
    if not blocks:
        cut = _unclosed_block(text, path)
        if cut is not None:
            return cut
        raise _no_module(text, path, whole)
    _, line, body = max(blocks)
    return KernelCode(body, path, extracted=True, first_line=line)


def _unclosed_block(text: str, path: str) -> KernelCode | None:
    """The code of a reply whose ```python block is never closed (an LLM reply cut off mid-generation: 28 of the
    gemini3 kernels JAXBench ships end that way after a whole statement) when it parses and defines something."""
    opened = _OPEN_FENCE.search(text)
    if opened is None or "```" in text[opened.end() :]:
        return None
    body = text[opened.end() :]
    tree = _parse(body)
    if not isinstance(tree, ast.Module) or not any(
        isinstance(n, ast.FunctionDef | ast.ClassDef | ast.Assign | ast.Import | ast.ImportFrom) for n in tree.body
    ):
        return None
    first = text[: opened.end()].count("\n") + 1
    return KernelCode(body, path, extracted=True, first_line=first, cut_off=True)


def _looks_cut_off(text: str, err: SyntaxError) -> bool:
    """A file that stops parsing at its end: the failure is in its last three lines, or an opening bracket or string
    that is never closed (Python names the line it opened on)."""
    msg = err.msg or ""
    return (err.lineno or 0) >= len(text.splitlines()) - 2 or "never closed" in msg or "unterminated" in msg


def _no_module(text: str, path: str, whole: SyntaxError) -> KernelError:
    """Why a file holds no module: its own syntax error, or, for a reply whose ```python block is never closed (an
    LLM reply cut off mid-generation, seen in JAXBench's gemini3 70_Gemm_Sigmoid_Scaling_ResidualAdd), where that
    block stops parsing."""
    opened = _OPEN_FENCE.search(text)
    hint = "pass the kernel's Python module (or an LLM reply with the module in a ```python block)"
    if opened is not None and "```" not in text[opened.end() :]:
        first = text[: opened.end()].count("\n") + 1
        err = _parse(text[opened.end() :])
        if isinstance(err, SyntaxError):
            return KernelError(
                f"the reply's ```python block is never closed and stops parsing: {err.msg} (the reply looks cut off)",
                path=path,
                line=first + (err.lineno or 1) - 1,
                hint="generate the kernel again, or complete the module by hand",
            )
    if opened is None and _looks_cut_off(text, whole):
        return KernelError(
            f"the file stops parsing in its last statement: {whole.msg} (it looks cut off)",
            path=path,
            line=whole.lineno,
            hint="generate the kernel again, or complete the module by hand",
        )
    return KernelError(
        f"not Python and no ```python block in it parses: {whole.msg}", path=path, line=whole.lineno, hint=hint
    )


# ---------------------------------------------------------------- API drift


@dataclass(frozen=True)
class Drift:
    """A Pallas name the kernel uses that the installed JAX no longer has, and what replaces it."""

    line: int
    col: int
    name: str  # as written, e.g. "pltpu.repeat"
    replacement: str
    fixable: bool  # `fix_api` can rewrite it


# module path -> attribute -> (replacement text, fixable by `fix_api`)
_KNOWN: dict[str, dict[str, tuple[str, bool]]] = {
    "jax.experimental.pallas.tpu": {
        "repeat": ("jnp.concatenate([x] * n, axis=axis) (a broadcast when that axis has size 1)", True),
        "TPUCompilerParams": ("pltpu.CompilerParams (same fields)", True),
        "TPUMemorySpace": ("pltpu.MemorySpace", True),
        "semaphore": ("pl.semaphore", False),
        "ANY": ("pl.ANY (the memory space moved to jax.experimental.pallas)", True),
    },
    "jax.experimental.pallas": {
        "store": ("indexing: `ref[idx] = value` (pl.store was removed)", False),
        "load": ("indexing: `ref[idx]` (pl.load was removed)", False),
    },
}
_RENAMES = {"TPUCompilerParams": "CompilerParams", "TPUMemorySpace": "MemorySpace"}
_PALLAS_ALIAS = "_pallasopt_pl"  # appended `import jax.experimental.pallas as _pallasopt_pl`, for moved names
REPEAT_HELPER = "_pallasopt_repeat"


def _aliases(tree: ast.Module) -> dict[str, str]:
    """Local name -> module path, for the Pallas modules the file imports (every import form)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("jax.experimental.pallas"):
                    out[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jax.experimental"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full.startswith("jax.experimental.pallas"):
                    out[a.asname or a.name] = full
    return out


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def find_drift(code: str) -> tuple[Drift, ...]:
    """Attributes of the Pallas modules the code uses that the installed JAX does not have."""
    tree = parse_module(code)
    aliases = _aliases(tree)
    found: list[Drift] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        base = _dotted(node.value)
        if base is None or base not in aliases:
            continue
        mod_path = aliases[base]
        try:
            mod = importlib.import_module(mod_path)
        except ImportError:
            continue
        if hasattr(mod, node.attr):
            continue
        replacement, fixable = _KNOWN.get(mod_path, {}).get(node.attr, ("no known replacement", False))
        found.append(Drift(node.lineno, node.col_offset, f"{base}.{node.attr}", replacement, fixable))
    return tuple(sorted(found, key=lambda d: (d.line, d.col)))


def drift_error(drift: Drift, path: str, first_line: int = 1) -> KernelError:
    return KernelError(
        f"{drift.name} does not exist in the installed JAX (the kernel was written for an older Pallas API)",
        path=path,
        line=drift.line + first_line - 1,
        hint=f"use {drift.replacement}" + ("; `pallasopt import --fix-api` rewrites it" if drift.fixable else ""),
    )


def fix_api(code: str) -> tuple[str, tuple[Drift, ...]]:
    """Rewrite the fixable drift (names, and `pltpu.repeat` calls into a helper appended to the module)."""
    drifts = [d for d in find_drift(code) if d.fixable]
    if not drifts:
        return code, ()
    lines = code.splitlines(keepends=True)
    uses_repeat = uses_pl = False
    for d in sorted(drifts, key=lambda d: (d.line, d.col), reverse=True):
        attr = d.name.rsplit(".", 1)[1]
        if attr == "repeat":
            new = REPEAT_HELPER
        elif attr == "ANY":
            new = f"{_PALLAS_ALIAS}.ANY"
        else:
            new = d.name.rsplit(".", 1)[0] + "." + _RENAMES[attr]
        uses_repeat |= attr == "repeat"
        uses_pl |= attr == "ANY"
        raw = lines[d.line - 1].encode("utf-8")
        end = d.col + len(d.name.encode("utf-8"))
        if raw[d.col : end].decode("utf-8") != d.name:
            continue  # written across lines or with spaces: leave it, the drift check still reports it
        lines[d.line - 1] = (raw[: d.col] + new.encode("utf-8") + raw[end:]).decode("utf-8")
    out = "".join(lines)
    if uses_pl:
        out = (
            out.rstrip("\n") + f"\n\nimport jax.experimental.pallas as {_PALLAS_ALIAS}  # pallasopt import --fix-api\n"
        )
    if uses_repeat:
        out = out.rstrip("\n") + "\n\n\n" + _REPEAT_SOURCE
    return out, tuple(drifts)


_REPEAT_SOURCE = f'''def {REPEAT_HELPER}(x, repeats, axis=0):
    """What pltpu.repeat did (removed from JAX): `repeats` copies of `x` concatenated along `axis`."""
    import jax.numpy as _jnp

    axis = axis % x.ndim
    if x.shape[axis] == 1:
        return _jnp.broadcast_to(x, x.shape[:axis] + (repeats,) + x.shape[axis + 1 :])
    return _jnp.concatenate([x] * repeats, axis=axis)
'''
