"""Validation of an LLM-written module before anything runs it: a static reading with `ast`, never an import.

A candidate is rejected (each rule gives one reason string) when it:
- is not one full module in one ```python block, or does not parse;
- changes `reference`, `make_inputs`, `hand_tuned`, `TOLERANCE`, `CHECK_DIMS` or `ENTRY` (compared as source text
  via ast node positions; adding or removing one counts), or rebinds one of those names anywhere, or changes a
  module-level name the oracle or the inputs use (a shared `EPS`, a helper, an import);
- renames the entry, or its entry no longer reaches a `pl.pallas_call` written in the file (`workload.inspect_source`);
- lets the entry reach `reference`/`hand_tuned`, or imports the kernel's own module (the oracle) or anything outside
  a short allowlist (jax, numpy, math, functools, ...) that the original did not already import;
- reads files or escapes the sandbox of plain array code (`open`, `eval`, `exec`, `__import__`, `globals`, dunder
  attributes, `np.load`, ...);
- caches results across calls: `global`, writes into or mutating calls on module-level names from a function body,
  `functools.cache`/`lru_cache`;
- sets `interpret=` or uses an interpret-mode switch.
The last three rules judge what the rewrite adds: a construct the original module already has is not held against it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

from ..errors import KernelError
from ..pyparse import parse_module
from ..workload import inspect_source

PROTECTED = ("reference", "make_inputs", "hand_tuned", "TOLERANCE", "CHECK_DIMS", "ENTRY", "OVERFLOW_CHECK")
ORACLE_NAMES = frozenset({"reference", "hand_tuned"})
ORACLE_INPUTS = ("reference", "make_inputs", "TOLERANCE", "CHECK_DIMS")  # what decides the verdict
ALLOWED_IMPORT_ROOTS = frozenset(
    {"__future__", "jax", "numpy", "math", "functools", "itertools", "operator", "typing", "dataclasses", "collections"}
)
FORBIDDEN_CALLS = frozenset(
    {
        "open",
        "eval",
        "exec",
        "compile",
        "__import__",
        "globals",
        "locals",
        "vars",
        "setattr",
        "delattr",
        "input",
        "breakpoint",
    }
)
ARRAY_MODULES = frozenset({"np", "numpy", "jnp", "onp"})
ARRAY_IO_ATTRS = frozenset({"load", "loadtxt", "genfromtxt", "fromfile", "memmap", "save", "savez", "savetxt"})
FORBIDDEN_ATTRS = frozenset({"read_text", "read_bytes", "write_text", "write_bytes", "tofile", "system", "popen"})
CACHE_DECORATORS = frozenset({"cache", "lru_cache", "cached_property"})
MUTATING_METHODS = frozenset(
    {"append", "extend", "insert", "update", "setdefault", "add", "pop", "popitem", "clear", "remove", "__setitem__"}
)
_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)


class ReplyFormatError(ValueError):
    """The reply does not hold exactly one full module in a ```python block."""


def extract_module(reply: str) -> str:
    """The module source in the reply's one ```python block; `ReplyFormatError` with the reason otherwise."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(reply)]
    python = [body for lang, body in blocks if lang in ("python", "py", "python3")]
    if not python:
        python = [body for lang, body in blocks if not lang]
    if not python:
        raise ReplyFormatError("the reply has no ```python code block: send the full module in one block")
    if len(python) > 1:
        raise ReplyFormatError(
            f"the reply has {len(python)} python code blocks: send the full module in exactly one block"
        )
    source = python[0]
    if not source.strip():
        raise ReplyFormatError("the reply's python code block is empty")
    return source if source.endswith("\n") else source + "\n"


def validate(original: str, candidate: str, path: str) -> tuple[str, ...]:
    """Every reason to reject `candidate` as a rewrite of `original` (empty when it may be traced and checked)."""
    try:
        new_tree = parse_module(candidate, filename=path)
    except SyntaxError as e:
        return (f"syntax error at line {e.lineno}: {e.msg}",)
    old_tree = parse_module(original, filename=path)
    reasons: list[str] = []
    reasons += _protected_unchanged(original, old_tree, candidate, new_tree, inspect_source(original, path).entry)
    reasons += _entry_ok(original, candidate, path, new_tree)
    reasons += _imports_ok(old_tree, new_tree, path)
    # Code rules judge what the rewrite adds: a construct the user's own module already has is not held against it.
    already = {_without_line(r) for r in _code_rules(old_tree)}
    reasons += [r for r in _code_rules(new_tree) if _without_line(r) not in already]
    return tuple(dict.fromkeys(reasons))  # unique, in order


def oracle_changes(original: str, candidate: str, entry: str, path: str = "<candidate>") -> tuple[str, ...]:
    """Why `candidate` changes what the oracle checks against `original` (empty: it does not): `reference`,
    `make_inputs`, `hand_tuned`, `TOLERANCE`, `CHECK_DIMS`, `ENTRY`, and every module-level name they use, must stay
    byte-identical. The search applies this to every candidate of every pass, not only to LLM rewrites."""
    try:
        new_tree = parse_module(candidate, filename=path)
    except SyntaxError as e:
        return (f"syntax error at line {e.lineno}: {e.msg}",)
    old_tree = parse_module(original, filename=path)
    return tuple(dict.fromkeys(_protected_unchanged(original, old_tree, candidate, new_tree, entry)))


def _code_rules(tree: ast.Module) -> list[str]:
    return _no_escape(tree) + _no_caching(tree) + _no_interpret(tree)


def _without_line(reason: str) -> str:
    return re.sub(r"^line \d+: ", "", reason)


# ------------------------------------------------------------------------------------------------------ pieces


def _segment(source: str, node: ast.stmt) -> str:
    """The exact source text of a top-level statement, decorators included."""
    lines = source.splitlines(keepends=True)
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    end = node.end_lineno or node.lineno
    return "".join(lines[start - 1 : end])


def _bound_names(node: ast.stmt) -> set[str]:
    """Names a statement binds in the scope it runs in (not inside nested functions/classes)."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    out: set[str] = set()
    if isinstance(node, ast.Import | ast.ImportFrom):
        for a in node.names:
            out.add((a.asname or a.name).split(".")[0])
        return out
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = list(node.targets)
    elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.For | ast.AsyncFor):
        targets = [node.target]
    elif isinstance(node, ast.With | ast.AsyncWith):
        targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    out |= {t.id for t in _flat_targets(targets) if isinstance(t, ast.Name)}  # x[i] = .. binds nothing
    for sub in ast.walk(node):  # walrus anywhere in the statement's own expressions
        if isinstance(sub, ast.NamedExpr) and isinstance(sub.target, ast.Name):
            out.add(sub.target.id)
    return out


def _module_statements(tree: ast.Module) -> list[ast.stmt]:
    """Top-level statements, descending into module-level if/try/with/for/while bodies (they run at import)."""
    out: list[ast.stmt] = []

    def walk(body: Iterable[ast.stmt]) -> None:
        for node in body:
            out.append(node)
            if isinstance(node, ast.If | ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith):
                walk(node.body)
                walk(getattr(node, "orelse", []))
            elif isinstance(node, ast.Try | ast.TryStar):
                walk(node.body)
                for h in node.handlers:
                    walk(h.body)
                walk(node.orelse)
                walk(node.finalbody)

    walk(tree.body)
    return out


def _definitions(source: str, tree: ast.Module, name: str) -> list[str]:
    """How `name` is defined at module level: source text of each binding statement; for an import, what it binds
    (so `import jax.experimental.pallas` added elsewhere does not count as a change of `jax`)."""
    out = []
    for n in _module_statements(tree):
        if name not in _bound_names(n):
            continue
        if isinstance(n, ast.Import | ast.ImportFrom):
            out += sorted({_import_target(n, a) for a in n.names if (a.asname or a.name).split(".")[0] == name})
        else:
            out.append(_segment(source, n))
    return sorted(set(out)) if all(o.startswith("import ") for o in out) else out


def _import_target(node: ast.Import | ast.ImportFrom, alias: ast.alias) -> str:
    if isinstance(node, ast.ImportFrom):
        return f"import {'.' * node.level}{node.module or ''}:{alias.name}"
    return f"import {alias.name if alias.asname else alias.name.split('.')[0]}"


def _module_bindings(tree: ast.Module) -> dict[str, list[ast.stmt]]:
    """Every module-level name and the statements that bind it."""
    out: dict[str, list[ast.stmt]] = {}
    for node in _module_statements(tree):
        for name in _bound_names(node):
            out.setdefault(name, []).append(node)
    return out


def _oracle_dependencies(tree: ast.Module, entry: str) -> dict[str, str]:
    """Module-level names the oracle and the inputs use (constants, helpers, imports), each with one user.

    They are protected like `reference` itself: changing a constant shared by the kernel and the reference (an `EPS`)
    would change what the oracle checks. The entry is never followed (a `hand_tuned` may call it).
    """
    bindings = _module_bindings(tree)
    out: dict[str, str] = {}
    todo = [(n, n) for n in ORACLE_INPUTS if n in bindings]
    seen: set[str] = set()
    while todo:
        name, user = todo.pop()
        if name in seen or name == entry or name not in bindings:
            continue
        seen.add(name)
        if name not in PROTECTED:
            out[name] = user
        for node in bindings[name]:
            todo.extend((n.id, user) for n in ast.walk(node) if isinstance(n, ast.Name))
    return out


def _protected_unchanged(original: str, old: ast.Module, candidate: str, new: ast.Module, entry: str) -> list[str]:
    reasons = []
    for name in PROTECTED:
        before = _definitions(original, old, name)
        after = _definitions(candidate, new, name)
        if before == after:
            continue
        if not before:
            reasons.append(f"`{name}` was added: the rewrite may change only the kernel and its entry")
        elif not after:
            reasons.append(f"`{name}` was removed: it must stay byte-identical to the original")
        else:
            reasons.append(f"`{name}` was changed: it must stay byte-identical to the original")
    for dep, user in sorted(_oracle_dependencies(old, entry).items()):
        if _definitions(original, old, dep) != _definitions(candidate, new, dep):
            reasons.append(f"`{dep}` (used by `{user}`) was changed: it must stay byte-identical to the original")
    for fn in ast.walk(new):
        if isinstance(fn, ast.Global | ast.Nonlocal):
            hit = sorted(set(fn.names) & set(PROTECTED))
            if hit:
                reasons.append(f"`{hit[0]}` is rebound through a global statement")
    return reasons


def _entry_ok(original: str, candidate: str, path: str, tree: ast.Module) -> list[str]:
    old = inspect_source(original, path)
    old_entry = old.entry
    try:
        spec = inspect_source(candidate, path)
    except KernelError as e:
        return [f"not a valid kernel module: {e.message}" + (f" ({e.hint})" if e.hint else "")]
    if old.pallas_in_file and not spec.pallas_in_file:  # the loader leaves imported kernels to the trace
        return ["not a valid kernel module: the entry no longer reaches a pl.pallas_call in this file"]
    if spec.entry != old_entry:
        return [f"the entry is now {spec.entry!r}; it must stay {old_entry!r} with the same arguments"]
    funcs = _module_bindings(tree)
    seen: set[str] = set()
    todo = [old_entry]
    while todo:
        name = todo.pop()
        if name in seen or name not in funcs:
            continue
        seen.add(name)
        for node in funcs[name]:
            todo.extend(n.id for n in ast.walk(node) if isinstance(n, ast.Name))
    used = sorted(seen & ORACLE_NAMES)
    if used:
        return [f"the entry reaches `{used[0]}`: the kernel must not call the oracle"]
    return []


def _import_roots(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return ["." * node.level + (node.module or "")] if node.level else [(node.module or "").split(".")[0]]
    return [a.name.split(".")[0] for a in node.names]


def _imports_ok(old: ast.Module, new: ast.Module, path: str) -> list[str]:
    before = {ast.dump(n) for n in ast.walk(old) if isinstance(n, ast.Import | ast.ImportFrom)}
    own = Path(path).stem
    reasons = []
    for node in ast.walk(new):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names = {a.name for a in node.names}
        if isinstance(node, ast.ImportFrom) and names & ORACLE_NAMES:
            reasons.append(f"line {node.lineno}: imports `{sorted(names & ORACLE_NAMES)[0]}`: never import the oracle")
            continue
        if ast.dump(node) in before:
            continue
        for root in _import_roots(node):
            if root == own or root.startswith("."):
                reasons.append(f"line {node.lineno}: imports {root!r}, the kernel's own module or a sibling")
            elif root not in ALLOWED_IMPORT_ROOTS:
                reasons.append(
                    f"line {node.lineno}: imports {root!r}; new imports are limited to "
                    f"{', '.join(sorted(ALLOWED_IMPORT_ROOTS - {'__future__'}))}"
                )
    return reasons


def _no_escape(tree: ast.Module) -> list[str]:
    reasons = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            reasons.append(f"line {node.lineno}: calls {node.func.id}(): no file access, eval or namespace tricks")
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__import__", "__loader__", "__spec__"):
            reasons.append(f"line {node.lineno}: uses {node.id}")
        elif isinstance(node, ast.Attribute):
            if node.attr.startswith("__") and node.attr.endswith("__"):
                reasons.append(f"line {node.lineno}: touches the dunder attribute .{node.attr}")
            elif node.attr in FORBIDDEN_ATTRS or (
                node.attr in ARRAY_IO_ATTRS and _base_name(node.value) in ARRAY_MODULES
            ):
                reasons.append(f"line {node.lineno}: uses .{node.attr}: no file access or shell from a kernel")
    return reasons


def _no_caching(tree: ast.Module) -> list[str]:
    module_names: set[str] = set()  # module-level data (not imports, functions or classes)
    for node in _module_statements(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            module_names |= _bound_names(node)
    reasons: list[str] = []

    def decorator_name(d: ast.expr) -> str:
        d = d.func if isinstance(d, ast.Call) else d
        return d.attr if isinstance(d, ast.Attribute) else d.id if isinstance(d, ast.Name) else ""

    def local_names(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
        a = fn.args
        out = {x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)}
        out |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
        if isinstance(fn, ast.Lambda):
            return out
        for stmt in _own_statements(fn.body):
            out |= _bound_names(stmt)
        return out

    def visit(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, enclosing: set[str]) -> None:
        scope = enclosing | local_names(fn)
        body = [fn.body] if isinstance(fn, ast.Lambda) else fn.body
        if not isinstance(fn, ast.Lambda):
            for d in fn.decorator_list:
                if decorator_name(d) in CACHE_DECORATORS:
                    reasons.append(f"line {d.lineno}: @{decorator_name(d)} caches results across calls")
        for node in _walk_own(body):
            if isinstance(node, ast.Global):
                reasons.append(f"line {node.lineno}: `global {', '.join(node.names)}`: no module state from a call")
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            elif isinstance(node, ast.Delete):
                targets = list(node.targets)
            line = getattr(node, "lineno", 0)
            for t in _flat_targets(targets):
                if isinstance(t, ast.Subscript | ast.Attribute):
                    base = _base_name(t)
                    if base and base in module_names and base not in scope:
                        reasons.append(
                            f"line {line}: writes into module-level `{base}` from a function: "
                            "no caching or state across calls"
                        )
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in MUTATING_METHODS
            ):
                base = _base_name(node.func.value)
                if base and base in module_names and base not in scope:
                    reasons.append(
                        f"line {node.lineno}: mutates module-level `{base}` (.{node.func.attr}) from a function: "
                        "no caching or state across calls"
                    )
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(node, scope)

    for top in _walk_own(tree.body):
        if isinstance(top, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            visit(top, set())
    return reasons


def _flat_targets(targets: Iterable[ast.expr]) -> list[ast.expr]:
    """Assignment targets with tuple/list/starred unpacking flattened."""
    out: list[ast.expr] = []
    for t in targets:
        if isinstance(t, ast.Tuple | ast.List):
            out += _flat_targets(t.elts)
        elif isinstance(t, ast.Starred):
            out += _flat_targets([t.value])
        else:
            out.append(t)
    return out


def _base_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Subscript | ast.Attribute | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _own_statements(body: Iterable[ast.stmt]) -> list[ast.stmt]:
    """Statements of a function body, through compound statements but not into nested functions or classes."""
    return [n for n in _walk_own(body) if isinstance(n, ast.stmt)]


def _walk_own(body: Iterable[ast.AST]) -> list[ast.AST]:
    """Every node under `body`, stopping at (but including) nested function, lambda and class definitions."""
    out: list[ast.AST] = []
    stack = list(body)[::-1]
    while stack:
        node = stack.pop()
        out.append(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            # decorators and defaults run in the enclosing scope
            extra: list[ast.AST] = list(getattr(node, "decorator_list", []))
            args = getattr(node, "args", None)
            if isinstance(args, ast.arguments):
                extra += [d for d in (*args.defaults, *args.kw_defaults) if d is not None]
            stack.extend(extra[::-1])
            continue
        stack.extend(list(ast.iter_child_nodes(node))[::-1])
    return out


def _no_interpret(tree: ast.Module) -> list[str]:
    reasons = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "interpret":
            reasons.append(
                f"line {node.value.lineno}: sets interpret=: pallasopt decides how the kernel runs; remove it"
            )
        elif (isinstance(node, ast.Attribute) and node.attr in ("force_tpu_interpret_mode", "InterpretParams")) or (
            isinstance(node, ast.Name) and node.id in ("force_tpu_interpret_mode", "InterpretParams")
        ):
            reasons.append(f"line {node.lineno}: uses an interpret-mode switch; remove it")
    return reasons
