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
    end_line: int | None = None  # where the file's own code ends, once `fix_api` appended helpers to `code`

    @property
    def last_line(self) -> int:
        """The line of the original file where its code ends."""
        return self.end_line or self.first_line + self.code.rstrip("\n").count("\n")

    def notes(self) -> tuple[str, ...]:
        """What a user should know about where the code came from (one line each)."""
        if not self.cut_off:
            return ()
        return (
            f"the reply's ```python block (line {self.first_line}) is never closed: the reply looks cut off after "
            f"line {self.last_line}; its code parses and is used as it stands (`pallasopt check` tells whether it is "
            "whole)",
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
    """A Pallas name the kernel uses that the installed JAX no longer has, or a use of the API it never took (a ref
    sliced at a run-time offset), and what replaces it."""

    line: int
    col: int
    name: str  # as written, e.g. "pltpu.repeat"
    replacement: str
    fixable: bool  # `fix_api` can rewrite it
    what: str = ""  # what the text is, when not a removed name

    def describe(self, first_line: int = 1) -> str:
        """`name (line N) -> replacement`, with what it is when not a removed name."""
        what = f" ({self.what})" if self.what else ""
        return f"{self.name}{what} (line {self.line + first_line - 1}) -> {self.replacement}"


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


def _kernel_refs(tree: ast.Module) -> set[str]:
    """Names that stand for refs in the module's kernels: the parameters of functions a `pallas_call` runs (by name,
    through `functools.partial` or a forwarding lambda), and any parameter named `*_ref`."""
    kernels: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (_dotted(node.func) or "").rpartition(".")[2] == "pallas_call":
            first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "kernel"), None)
            while isinstance(first, ast.Call) and first.args:  # functools.partial(kernel, ...)
                first = first.args[0]
            if isinstance(first, ast.Lambda) and isinstance(first.body, ast.Call):
                first = first.body.func
            if isinstance(first, ast.Name):
                kernels.add(first.id)
    refs: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.Lambda):
            params = [*node.args.posonlyargs, *node.args.args]
            if isinstance(node, ast.FunctionDef) and node.name in kernels:
                refs.update(a.arg for a in params)
            refs.update(a.arg for a in params if a.arg.endswith("_ref"))
    return refs


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _slice_size(sl: ast.Slice) -> ast.AST | None:
    """The size of a slice `lo:hi` written as `a : a + n` or `i * n : (i + 1) * n` (either operand order) with a
    start that is not a literal: `n`; None for any other slice."""
    lo, hi = sl.lower, sl.upper
    if lo is None or hi is None or sl.step is not None or isinstance(lo, ast.Constant):
        return None
    if isinstance(hi, ast.BinOp) and isinstance(hi.op, ast.Add):
        if _same(hi.left, lo):
            return hi.right
        if _same(hi.right, lo):
            return hi.left
    if (
        isinstance(lo, ast.BinOp)
        and isinstance(lo.op, ast.Mult)
        and isinstance(hi, ast.BinOp)
        and isinstance(hi.op, ast.Mult)
    ):
        for i, n in ((lo.left, lo.right), (lo.right, lo.left)):
            for inc, m in ((hi.left, hi.right), (hi.right, hi.left)):
                one = ast.Constant(1)
                if (
                    _same(m, n)
                    and isinstance(inc, ast.BinOp)
                    and isinstance(inc.op, ast.Add)
                    and (
                        (_same(inc.left, i) and _same(inc.right, one)) or (_same(inc.right, i) and _same(inc.left, one))
                    )
                ):
                    return n
    return None


def find_ref_slices(code: str) -> tuple[Drift, ...]:
    """Slices of refs at run-time offsets (`x_ref[:, k0:k0 + bk]`, `w_ref[k * BK:(k + 1) * BK, :]`): Pallas
    indexes a ref only with static Python slices or `pl.ds(start, size)`, and tracing such a slice fails
    (TracerBoolConversionError): 6 of JAXBench's gemini3 and gpt53 kernels slice refs so (two more slice loaded
    arrays, which this leaves alone). Each becomes `pl.ds(start, size)`, which means the same for a static start."""
    tree = parse_module(code)
    refs = _kernel_refs(tree)
    pl = module_alias_ast(tree)
    found: list[Drift] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in refs):
            continue
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for part in parts:
            size = _slice_size(part) if isinstance(part, ast.Slice) else None
            if size is None or part.end_lineno != part.lineno or part.end_col_offset is None:
                continue
            assert isinstance(part, ast.Slice) and part.lower is not None
            text = ast.get_source_segment(code, part) or ""
            new = f"{pl}.ds({ast.unparse(part.lower)}, {ast.unparse(size)})"
            found.append(
                Drift(part.lineno, part.col_offset, text, new, True, f"{node.value.id} sliced at a run-time offset")
            )
    return tuple(sorted(found, key=lambda d: (d.line, d.col)))


def module_alias_ast(tree: ast.Module) -> str:
    """The name the module binds `jax.experimental.pallas` to (`_pallasopt_pl`, appended by `fix_api`, if none)."""
    for name, path in _aliases(tree).items():
        if path == "jax.experimental.pallas":
            return name
    return _PALLAS_ALIAS


SCALAR_HELPER = "_pallasopt_scalar"
_ARRAY_MAKERS = ("asarray", "array")


def _jnp_prefixes(tree: ast.Module) -> set[str]:
    """The dotted prefixes the module reaches `jax.numpy` by (`jnp`, `jax.numpy`, ...), every import form."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "jax.numpy":
                    out.add(a.asname or "jax.numpy")
                elif a.name == "jax":
                    out.add(f"{a.asname or 'jax'}.numpy")
        elif isinstance(node, ast.ImportFrom) and node.module == "jax":
            out |= {a.asname or a.name for a in node.names if a.name == "numpy"}
    return out


def _free_reads(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """Names a nested function reads that it neither takes nor binds itself (what it closes over)."""
    args = fn.args
    params = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a}
    reads: set[str] = set()
    stores: set[str] = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Name):
            (reads if isinstance(n.ctx, ast.Load) else stores).add(n.id)
    return reads - params - stores


def find_captured_scalars(code: str) -> tuple[Drift, ...]:
    """`name = jnp.asarray(value[, dtype])` / `jnp.array(...)` in a function whose nested function (a kernel body)
    reads `name`: Pallas refuses a kernel that closes over a jax array ("captures constants": JAXBench gemini3
    `31_ELU`'s `alpha = jnp.asarray(self.alpha, dtype=x.dtype)`, `34_InstanceNorm`'s `eps_val`). Not where the name
    is also handed to a call's call (`pl.pallas_call(...)(x, alpha)`: an operand must stay an array)."""
    tree = parse_module(code)
    makers = {f"{p}.{m}" for p in _jnp_prefixes(tree) for m in _ARRAY_MAKERS}
    found: dict[tuple[int, int], Drift] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        nested = [n for n in ast.walk(fn) if n is not fn and isinstance(n, ast.FunctionDef | ast.Lambda)]
        inner = {id(n) for f in nested for n in ast.walk(f)}
        closed = set().union(*(_free_reads(f) for f in nested))
        operands = {
            a.id
            for n in ast.walk(fn)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Call)
            for a in n.args
            if isinstance(a, ast.Name)
        }
        for node in ast.walk(fn):
            if id(node) in inner or not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target, value = node.targets[0], node.value
            if not (isinstance(target, ast.Name) and target.id in closed and target.id not in operands):
                continue
            if not isinstance(value, ast.Call) or _dotted(value.func) not in makers or len(value.args) > 2:
                continue
            if any(k.arg != "dtype" for k in value.keywords) or value.func.end_lineno != value.func.lineno:
                continue
            name = ast.get_source_segment(code, value.func) or ""
            what = f"`{target.id}`, a jax scalar a kernel closes over"
            at = (value.func.lineno, value.func.col_offset)
            found[at] = Drift(*at, name, SCALAR_HELPER, True, what)
    return tuple(found[k] for k in sorted(found))


# jax.numpy keywords removed since the suites' tasks were written: function -> old keyword -> new keyword
_TASK_KEYWORDS = {"clip": {"a_min": "min", "a_max": "max"}}


def find_task_drift(code: str) -> tuple[Drift, ...]:
    """jax.numpy keywords a task's reference passes that the installed JAX no longer takes (JAXBench's level-1
    `28_HardSigmoid`: `jnp.clip(x + 3.0, a_min=0.0)`, "clip() got an unexpected keyword argument 'a_min'")."""
    tree = parse_module(code)
    prefixes = _jnp_prefixes(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        renames = _TASK_KEYWORDS.get(node.func.attr, {})
        if not renames or _dotted(node.func.value) not in prefixes:
            continue
        for k in node.keywords:
            if k.arg in renames:
                what = f"jnp.{node.func.attr}'s removed keyword"
                found.append(Drift(k.lineno, k.col_offset, k.arg, renames[k.arg], True, what))
    return tuple(sorted(found, key=lambda d: (d.line, d.col)))


def fix_task_api(code: str) -> tuple[str, tuple[Drift, ...]]:
    """`code` with `find_task_drift`'s keywords renamed (what `pallasopt import --fix-api` does to a task)."""
    return _apply(code, find_task_drift(code))


def fix_api(code: str) -> tuple[str, tuple[Drift, ...]]:
    """Rewrite the fixable drift (names, and `pltpu.repeat` calls into a helper appended to the module), ref
    slices at run-time offsets (`find_ref_slices`) and jax scalars a kernel closes over (`find_captured_scalars`:
    made Python numbers where they are concrete, by a helper appended to the module)."""
    code, captured = _fix_captured_scalars(code)
    code, sliced = _fix_ref_slices(code)
    sliced = (*captured, *sliced)
    drifts = [d for d in find_drift(code) if d.fixable]
    if not drifts:
        return code, sliced
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
        _replace_at(lines, d, new)  # written across lines or with spaces: left, the drift check still reports it
    out = "".join(lines)
    if uses_pl:
        out = _with_pallas_alias(out)
    if uses_repeat:
        out = out.rstrip("\n") + "\n\n\n" + _REPEAT_SOURCE
    return out, (*sliced, *drifts)


def _apply(code: str, found: tuple[Drift, ...]) -> tuple[str, tuple[Drift, ...]]:
    """`code` with each of `found` replaced by its `replacement` where the text is still there (`_replace_at`), and
    the ones done, in order."""
    lines = code.splitlines(keepends=True)
    done = [
        d for d in sorted(found, key=lambda d: (d.line, d.col), reverse=True) if _replace_at(lines, d, d.replacement)
    ]
    return "".join(lines), tuple(reversed(done))


def _fix_captured_scalars(code: str) -> tuple[str, tuple[Drift, ...]]:
    out, done = _apply(code, find_captured_scalars(code))
    return (out.rstrip("\n") + "\n\n\n" + _SCALAR_SOURCE if done else out), done


def _fix_ref_slices(code: str) -> tuple[str, tuple[Drift, ...]]:
    out, done = _apply(code, find_ref_slices(code))
    if any(d.replacement.startswith(f"{_PALLAS_ALIAS}.") for d in done):
        out = _with_pallas_alias(out)
    return out, done


def _replace_at(lines: list[str], d: Drift, new: str) -> bool:
    """Replace `d.name` where `d` found it (line, byte column) by `new`, in place; False (nothing done) where the
    text there is not `d.name` (written across lines)."""
    raw = lines[d.line - 1].encode("utf-8")
    end = d.col + len(d.name.encode("utf-8"))
    if raw[d.col : end].decode("utf-8") != d.name:
        return False
    lines[d.line - 1] = (raw[: d.col] + new.encode("utf-8") + raw[end:]).decode("utf-8")
    return True


def _with_pallas_alias(code: str) -> str:
    """`code` importing `jax.experimental.pallas` as `_PALLAS_ALIAS` (appended once), for what `fix_api` writes."""
    line = f"import jax.experimental.pallas as {_PALLAS_ALIAS}  # pallasopt import --fix-api"
    return code if line in code else code.rstrip("\n") + f"\n\n{line}\n"


_REPEAT_SOURCE = f'''def {REPEAT_HELPER}(x, repeats, axis=0):
    """What pltpu.repeat did (removed from JAX): `repeats` copies of `x` concatenated along `axis`."""
    import jax.numpy as _jnp

    axis = axis % x.ndim
    if x.shape[axis] == 1:
        return _jnp.broadcast_to(x, x.shape[:axis] + (repeats,) + x.shape[axis + 1 :])
    return _jnp.concatenate([x] * repeats, axis=axis)
'''


_SCALAR_SOURCE = f'''def {SCALAR_HELPER}(value, dtype=None):
    """`jnp.asarray(value, dtype)` as a Python number where `value` is concrete and 0-d (pallasopt import --fix-api):
    a Pallas kernel may close over a number, not a jax array ("captures constants"); a traced or non-scalar value
    stays an array."""
    import jax.numpy as _jnp
    import numpy as _np

    try:
        arr = _np.asarray(value)
    except Exception:  # a tracer: only an array will do
        return _jnp.asarray(value, dtype=dtype)
    if arr.ndim != 0:
        return _jnp.asarray(value, dtype=dtype)
    return _np.asarray(arr, dtype=dtype if dtype is not None else arr.dtype).item()
'''
