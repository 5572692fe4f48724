"""Loading a kernel module: find its entry, reference, inputs and dims, with one-line errors for bad files.

The static part (`inspect_source`) reads the file with `ast` and never runs it; `exec_module` runs a source as a
fresh module object, so the same file can be loaded many times (the original and every candidate rewrite).
"""

from __future__ import annotations

import ast
import builtins
import functools
import hashlib
import importlib
import inspect
import itertools
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import KernelError
from .pyparse import parse_module

RESERVED = ("reference", "make_inputs", "hand_tuned")
BUILTIN_NAMES = frozenset(dir(builtins))
_counter = itertools.count()


@dataclass(frozen=True)
class ModuleSpec:
    """What the static reading of a kernel module found."""

    path: str
    entry: str
    entry_line: int
    reference_line: int
    make_inputs_line: int
    has_hand_tuned: bool
    pallas_in_file: bool = True  # the entry reaches a `pallas_call` written in this file (else: a library kernel's)


def _calls_pallas_call(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            f = sub.func
            if (isinstance(f, ast.Attribute) and f.attr == "pallas_call") or (
                isinstance(f, ast.Name) and f.id == "pallas_call"
            ):
                return True
    return False


def _called_names(node: ast.AST) -> set[str]:
    """Names a function mentions (calls, partials, references): enough to follow helper chains."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _top_functions(tree: ast.Module) -> dict[str, ast.AST]:
    """Top-level functions and module-level assignments (e.g. `f = functools.partial(g, bm=128)`)."""
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out[node.name] = node
        elif (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ) and isinstance(node.value, ast.Call | ast.Lambda):
            out[node.targets[0].id] = node
    return out


def _top_classes(tree: ast.Module) -> dict[str, ast.AST]:
    """Top-level classes: a method may build the `pallas_call` (they are helpers, never entries)."""
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _call_root(func: ast.expr) -> ast.expr:
    """The innermost object a call goes through: `jnp` for `jnp.linalg.norm(...)`, `globals` for `globals().get`."""
    while True:
        if isinstance(func, ast.Attribute | ast.Subscript):
            func = func.value
        elif isinstance(func, ast.Call):
            func = func.func
        else:
            return func


def _calls_outside_code(node: ast.AST) -> bool:
    """Whether a function calls code that is not a Python builtin (an imported library kernel may hold the
    `pallas_call`: only the trace can tell)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            root = _call_root(sub.func)
            if not (isinstance(root, ast.Name) and root.id in BUILTIN_NAMES):
                return True
    return False


def _reaches(funcs: Mapping[str, ast.AST], seed: Callable[[ast.AST], bool]) -> set[str]:
    """Names of top-level functions (and classes) for which `seed` holds, or that call one of them (transitively)."""
    reach = {name for name, node in funcs.items() if seed(node)}
    changed = True
    while changed:
        changed = False
        for name, node in funcs.items():
            if name not in reach and _called_names(node) & reach:
                reach.add(name)
                changed = True
    return reach


def _module_string_constant(tree: ast.Module, name: str) -> tuple[str, int] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                return node.value.value, node.lineno
            raise KernelError(f"{name} must be a string literal", path=None, line=node.lineno)
    return None


def _defs(funcs: Mapping[str, ast.AST], names: set[str]) -> set[str]:
    """The `def`s among `names` (a module-level `x = f(...)` is a value, not an entry that calls a library)."""
    return {n for n in names if isinstance(funcs[n], ast.FunctionDef | ast.AsyncFunctionDef)}


def _pick_entry(path: str, funcs: Mapping[str, ast.AST], reach: set[str]) -> str | None:
    """The one public root among `reach` (None when there is none; an error when there are several)."""
    public = sorted(n for n in reach if not n.startswith("_") and n not in RESERVED)
    # Prefer roots: candidates that no other candidate calls (a public wrapper over a public helper).
    roots = [n for n in public if not any(n in _called_names(funcs[o]) for o in public if o != n)]
    if not public:
        return None
    if len(roots) != 1:
        names = ", ".join(f"{n} (line {getattr(funcs[n], 'lineno', '?')})" for n in (roots or public))
        raise KernelError(
            f"two or more candidate entries: {names}",
            path=path,
            line=getattr(funcs[(roots or public)[0]], "lineno", 1),
            hint='name the one to optimize with ENTRY = "function_name"',
        )
    return roots[0]


def inspect_source(source: str, path: str) -> ModuleSpec:
    """Read a kernel module without running it; raise `KernelError` naming the file and line of any problem."""
    try:
        tree = parse_module(source, filename=path)
    except SyntaxError as e:
        raise KernelError(
            f"syntax error: {e.msg}", path=path, line=e.lineno, hint="fix the Python syntax and retry"
        ) from None
    funcs = _top_functions(tree)
    for required, fix in (
        ("reference", "define `def reference(*args)`: the pure-JAX oracle with the entry's arguments"),
        ("make_inputs", "define `def make_inputs(key, **dims)` returning the entry's argument tuple"),
    ):
        if required not in funcs:
            raise KernelError(f"no `{required}` function", path=path, line=1, hint=fix)
    scope = {**_top_classes(tree), **funcs}
    reach = _reaches(scope, _calls_pallas_call).intersection(funcs)
    # An entry may also call a Pallas kernel defined in an installed library: the trace has the last word.
    may_reach = _reaches(scope, lambda n: _calls_pallas_call(n) or _calls_outside_code(n)).intersection(funcs)
    try:
        named = _module_string_constant(tree, "ENTRY")
    except KernelError as e:
        raise KernelError(e.message, path=path, line=e.line, hint='write ENTRY = "function_name"') from None
    if named is not None:
        entry, line = named
        if entry not in funcs:
            raise KernelError(
                f"ENTRY names {entry!r}, which is not a top-level function",
                path=path,
                line=line,
                hint="set ENTRY to the function that calls pl.pallas_call",
            )
        if entry not in may_reach:
            raise KernelError(
                f"entry {entry!r} never reaches a pl.pallas_call",
                path=path,
                line=getattr(funcs[entry], "lineno", line),
                hint="the entry must call pl.pallas_call, or a library kernel that does, directly or through helpers "
                "in this file",
            )
    else:
        picked = _pick_entry(path, funcs, reach) or _pick_entry(path, funcs, _defs(funcs, may_reach))
        if picked is None:
            raise KernelError(
                "no entry: no public top-level function calls pl.pallas_call or a library kernel",
                path=path,
                line=1,
                hint='define one, or name it with ENTRY = "function_name"',
            )
        entry = picked
    return ModuleSpec(
        path=path,
        entry=entry,
        entry_line=getattr(funcs[entry], "lineno", 1),
        reference_line=getattr(funcs["reference"], "lineno", 1),
        make_inputs_line=getattr(funcs["make_inputs"], "lineno", 1),
        has_hand_tuned="hand_tuned" in funcs,
        pallas_in_file=entry in reach,
    )


def package_of(path: str) -> tuple[str, Path] | None:
    """The dotted package a file sits in and the folder to import it from, as Python would see it.

    A file whose folder holds an ``__init__.py`` belongs to that package (and to every enclosing folder with one):
    ``root/pkg/sub/mod.py`` gives ``("pkg.sub", root)``. None when the folder is not a package.
    """
    folder = Path(path).resolve().parent
    parts: list[str] = []
    while (folder / "__init__.py").is_file() and folder.name.isidentifier():
        parts.append(folder.name)
        folder = folder.parent
    return (".".join(reversed(parts)), folder) if parts else None


def _import_package(package: str, root: Path, path: str) -> None:
    """Import the package a kernel file sits in from `root` (so ``from .helpers import x`` resolves)."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        pkg = importlib.import_module(package)
    except Exception as e:
        raise KernelError(
            f"importing its package {package!r} failed: {type(e).__name__}: {e}",
            path=path,
            line=1,
            hint=f"the package must import on its own from {root}",
        ) from None
    where = [str(Path(p).resolve()) for p in getattr(pkg, "__path__", ())]
    expected = str(root.joinpath(*package.split(".")))
    if expected not in where:
        raise KernelError(
            f"package {package!r} is already imported from {', '.join(where) or '?'}, not from {expected}",
            path=path,
            line=1,
            hint="rename the package folder so it does not clash with an installed package",
        )


def exec_module(source: str, path: str) -> types.ModuleType:
    """Run `source` as a fresh module whose code objects carry `path` (so traces point into the user's file).

    As Python would import the file: the module is registered in `sys.modules` under a unique name (dataclasses,
    ``from __future__ import annotations`` and pickling look their module up there) and stays registered; its
    folder is importable (sibling helper modules); and when the folder is a package (it holds ``__init__.py``),
    the package is imported from its root and the module is placed inside it, so ``from .helpers import x`` works.
    Every place that runs a user's module (this process, the check, compile and timing workers) loads it here.
    """
    digest = hashlib.sha1(source.encode()).hexdigest()[:8]
    package = package_of(path)
    stem = Path(path).stem if Path(path).stem.isidentifier() else "kernel"
    name = f"_pallasopt_{stem}_{next(_counter)}_{digest}"
    folder = str(Path(path).resolve().parent)
    if package is None and folder not in sys.path:
        sys.path.append(folder)
    if package is not None:
        _import_package(package[0], package[1], path)
        name = f"{package[0]}.{name}"
    module = types.ModuleType(name)
    module.__file__ = path
    module.__package__ = package[0] if package else ""
    sys.modules[name] = module
    try:
        code = compile(source, path, "exec")
        exec(code, module.__dict__)
    except SyntaxError as e:
        sys.modules.pop(name, None)
        raise KernelError(f"syntax error: {e.msg}", path=path, line=e.lineno, hint="fix the syntax") from None
    except SystemExit as e:  # not an Exception: it would end pallasopt (or the check's child) silently
        sys.modules.pop(name, None)
        raise KernelError(
            f"importing the module called sys.exit({e.code!r})",
            path=path,
            line=user_line(e, path),
            hint="the file must import on its own without exiting (guard scripts with `if __name__ == '__main__':`)",
        ) from None
    except Exception as e:
        sys.modules.pop(name, None)
        raise KernelError(
            f"importing the module failed: {type(e).__name__}: {e}",
            path=path,
            line=user_line(e, path),
            hint="the file must import on its own",
        ) from None
    return module


def user_line(exc: BaseException, path: str) -> int | None:
    """The innermost traceback line inside `path`, if any."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def default_dims(make_inputs: Callable[..., Any], path: str, line: int) -> dict[str, int]:
    """The keyword defaults of `make_inputs` after `key`: the size the user wants optimized."""
    try:
        sig = inspect.signature(make_inputs)
    except (TypeError, ValueError):
        return {}
    params = list(sig.parameters.values())
    if not params:
        raise KernelError(
            "make_inputs takes no arguments",
            path=path,
            line=line,
            hint="its first parameter must be the PRNG key",
        )
    dims: dict[str, int] = {}
    for p in params[1:]:
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        if p.default is p.empty:
            raise KernelError(
                f"make_inputs parameter {p.name!r} has no default",
                path=path,
                line=line,
                hint="give every dimension a default: the size to optimize",
            )
        if isinstance(p.default, bool) or not isinstance(p.default, int):
            continue  # non-integer options (dtypes, flags) are passed through untouched
        dims[p.name] = p.default
    return dims


# The TPU generation code that asks for one at trace time is traced for (`pltpu.emit_pipeline` reads the device
# kind to pick its DMA tiling) when no TPU is attached: v5e, the default target.
TRACE_DEVICE_KIND = "TPU v5 lite"


@functools.cache
def tpu_traced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` traced under an abstract one-device TPU mesh when the default device is not a TPU, so kernels that run
    `pltpu.emit_pipeline` (which asks for the TPU's kind while tracing) trace, lower and run in interpret mode on a
    CPU; `fn` itself on a TPU. One wrapper per function, so `jax.jit` caches stay warm."""
    import jax
    from jax._src.mesh import AbstractDevice
    from jax.sharding import AbstractMesh, AxisType

    if jax.devices()[0].platform == "tpu":
        return fn
    device = AbstractDevice(device_kind=TRACE_DEVICE_KIND, num_cores=1, platform="tpu")
    mesh = AbstractMesh((1,), ("_tpu",), axis_types=(AxisType.Auto,), abstract_device=device)

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        with jax.sharding.use_abstract_mesh(mesh):
            return fn(*args, **kwargs)

    return traced


@dataclass(frozen=True)
class Workload:
    """A loaded kernel module: its source, what it defines, and the live module object."""

    spec: ModuleSpec
    source: str
    module: types.ModuleType
    dims: Mapping[str, int]

    @property
    def path(self) -> str:
        return self.spec.path

    @property
    def entry(self) -> Callable[..., Any]:
        fn: Callable[..., Any] = getattr(self.module, self.spec.entry)
        return tpu_traced(fn) if "emit_pipeline" in self.source else fn

    @property
    def reference(self) -> Callable[..., Any]:
        fn: Callable[..., Any] = self.module.reference
        return fn

    @property
    def make_inputs(self) -> Callable[..., Any]:
        fn: Callable[..., Any] = self.module.make_inputs
        return fn

    @property
    def tolerance(self) -> Mapping[str, float] | None:
        tol = getattr(self.module, "TOLERANCE", None)
        return dict(tol) if isinstance(tol, Mapping) else None

    @property
    def check_dims(self) -> Mapping[str, int] | None:
        dims = getattr(self.module, "CHECK_DIMS", None)
        return dict(dims) if isinstance(dims, Mapping) else None


def load_source(source: str, path: str) -> Workload:
    """Inspect and run a kernel module given as source text."""
    spec = inspect_source(source, path)
    module = exec_module(source, path)
    for name, line in (("reference", spec.reference_line), ("make_inputs", spec.make_inputs_line)):
        if not callable(getattr(module, name, None)):
            raise KernelError(f"`{name}` is not callable after import", path=path, line=line)
    dims = default_dims(module.make_inputs, path, spec.make_inputs_line)
    return Workload(spec=spec, source=source, module=module, dims=dims)


def read_file(path: str | Path) -> str:
    """Read a kernel file, with a one-line error when it is missing or unreadable."""
    p = Path(path)
    if not p.exists():
        raise KernelError("no such file", path=str(path), hint="check the path")
    if p.is_dir():
        raise KernelError("is a folder, not a kernel module", path=str(path), hint="pass a .py file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise KernelError(f"cannot read: {e}", path=str(path), hint="save the file as UTF-8") from None
    except OSError as e:
        raise KernelError(
            f"cannot read: {e.strerror or e}", path=str(path), hint="check the file's permissions"
        ) from None


def load(path: str | Path) -> Workload:
    """Load a kernel module file."""
    return load_source(read_file(path), str(path))
