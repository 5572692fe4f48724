"""Adapters: a JAXBench workload file or a MaxKernel task folder as pallasopt's reference + inputs.

Both suites give an oracle and an input builder; the Pallas kernel to optimize is the one the user writes against
them (`to_kernel_module_template` writes the kernel-module skeleton, `import_main` is `pallasopt import`).

The formats, as read in the public repositories:

- JAXBench (github.com/AI-Hypercomputer/accelerator-agents: JAXBench/README.md, JAXBench/harness/evaluator.py,
  JAXBench/harness/loader.py, JAXBench/benchmark/level2/8p_GEMM/baseline.py; github.com/aryatschand/JAXBench:
  README.md, benchmark/12p_RMSNorm/baseline.py, benchmark/19k_Matmul_Subtract_Multiply_ReLU/baseline.py,
  benchmark/11p_Megablox_GMM/baseline.py, real_workloads/qwen3/qwen3_8b_gqa.py,
  real_workloads/llama3/llama3_8b_token_embed.py, tokamax/gated_linear_unit/llama3_8b_swiglu.py).
  A workload file (``benchmark/<name>/baseline.py``, with a hand-written Pallas ``optimized.py`` beside some) has a
  module-level ``CONFIG`` dict (metadata, sizes, sometimes ``atol``/``rtol``), ``create_inputs(dtype=...)`` taking
  no key and no CONFIG (it reads the global CONFIG and seeds itself: ``jax.random.PRNGKey(42)`` or
  ``jax.random.key(0)``), and ``workload(*inputs)`` taking the inputs unpacked (it may read CONFIG too). The harness
  calls ``create_inputs(dtype=jnp.bfloat16)`` when there is a ``dtype`` parameter, wraps a lone array in a tuple,
  runs ``workload`` eagerly when the module sets ``_skip_jit``, and compares with atol = rtol = 1e-2.
- MaxKernel (same accelerator-agents repository: MaxCode/MaxKernel/evaluation/jaxbench_adapted_dataset/{12p_RMSNorm,
  1p_Flash_Attention,11p_Megablox_GMM,7p_Ragged_Paged_Attention}/reference.py and kernel_task.yaml,
  MaxCode/MaxKernel/tools/test_harness_template.py, tools/assemble_test_run.py, v2/tools/assemble_test_harness.py,
  subagents/generate_test_file_agent.md). A task folder holds ``reference.py`` with ``get_inputs(dtype=...)``
  (sizes are literals or a ``CONFIG`` dict *local* to it; fixed ``jax.random.key(42)`` seed) returning
  ``(dynamic_args, static_args)`` or a list of such pairs, and ``computation(*dynamic_args, *static_args)``, the
  static args being jit ``static_argnums``; ``kernel_task.yaml`` repeats ``get_inputs`` as ``input_gen_code``. A
  kernel file is another module with a module-level ``computation`` of the same signature. No ``get_init_inputs``
  appeared there (that is KernelBench's ``Model`` format); this module does not use it.

How the suites map onto pallasopt's format:

- dims: JAXBench's integer ``CONFIG`` entries; MaxKernel's integer literals assigned to names (or to keys of a dict
  literal) at the top of ``get_inputs``, which are rewritten in place to ``__pallasopt_dims__.get(name, literal)``
  (same lines, so tracebacks stay right). ``make_inputs(key, **dims)`` runs the builder with those sizes.
- the key: the builders ignore any key, so while they run ``jax.random.key(s)`` / ``jax.random.PRNGKey(s)`` return
  ``jax.random.fold_in(key, s)`` (same key flavour as asked for), and numpy's generators are seeded with a hash of
  the key's bits mixed with the seed they ask for (``np.random.seed``/``default_rng``/``RandomState``; the global
  numpy state is seeded too and restored afterwards). Distinct keys give distinct inputs and the suite's own
  distributions are kept. Under ``jax.eval_shape`` the key has no bits, so numpy keeps its own seed (only shapes
  matter there).
- the reference: ``workload`` (with CONFIG set to the dims that built the inputs) or ``computation(*args,
  *static_args)`` with the static args that ``get_inputs`` returned for those inputs. The adapter remembers which
  dims built inputs of which shapes; inputs of the same shapes built from dims that differ only in non-shape
  integers share the last record.
- static args and CONFIG values are not kernel arguments: the entry takes the dynamic args only, and
  ``SuiteWorkload.params(*args)`` gives them for a given input tuple.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import inspect
import keyword
import os
import re
import sys
import threading
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .errors import ExitCode, KernelError, UsageError, UserError, short
from .workload import exec_module, read_file, user_line

Signature = tuple[tuple[Any, ...], ...]
DIMS_GLOBAL = "__pallasopt_dims__"
JAXBENCH_TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}  # JAXBench/harness/correctness.py per its README
MAXKERNEL_TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}  # MaxKernel/tools/test_harness_template.py ATOL/RTOL


@dataclass(frozen=True)
class SuiteWorkload:
    """A suite's workload seen as pallasopt's reference + inputs (the kernel is still to be written)."""

    name: str
    path: str
    reference: Callable[..., Any]
    make_inputs: Callable[..., tuple[Any, ...]]  # make_inputs(key, **dims) -> the dynamic arguments
    dims: dict[str, int]
    source: str
    suite: str = "jaxbench"  # "jaxbench" or "maxkernel"
    arg_names: tuple[str, ...] = ()
    params: Callable[..., dict[str, Any]] | None = None  # params(*args): CONFIG / static args for these inputs
    hand_tuned: Callable[..., Any] | None = None  # the suite's own Pallas kernel, when the folder has one
    hand_tuned_path: str | None = None
    hand_tuned_source: str | None = None
    tolerance: dict[str, float] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # loader keywords the template repeats (dtype, case)
    notes: tuple[str, ...] = ()  # what the import noticed and the user should know


# ---------------------------------------------------------------- keys: fixed seeds become functions of the key

_ROUTING = threading.RLock()


def _is_typed(key: Any) -> bool:
    return bool(jnp.issubdtype(key.dtype, jax.dtypes.prng_key))


def _u32(seed: Any) -> Any:
    return int(seed) % (1 << 32) if isinstance(seed, int | np.integer) else seed


def _mix(base: int, seed: object) -> int:
    return int.from_bytes(hashlib.sha256(f"{base}:{seed!r}".encode()).digest()[:4], "little")


def _concrete_seed(key: Any) -> int | None:
    """A 32-bit seed from the key's bits; None for an abstract key (under eval_shape or jit)."""
    try:
        bits = np.asarray(jax.random.key_data(key) if _is_typed(key) else key)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None
    return int.from_bytes(hashlib.sha256(bits.tobytes()).digest()[:4], "little")


@contextlib.contextmanager
def _seeded_from(key: Any, module: types.ModuleType) -> Iterator[None]:
    """While the suite's builder runs in this thread, its fixed seeds are folded into `key` (see module docstring)."""
    owner = threading.get_ident()
    typed = _is_typed(key)
    orig_key, orig_prng = jax.random.key, jax.random.PRNGKey

    def new_key(seed: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != owner:
            return orig_key(seed, *args, **kwargs)
        k = jax.random.fold_in(key, _u32(seed))
        return k if typed else jax.random.wrap_key_data(k)

    def new_prng(seed: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != owner:
            return orig_prng(seed, *args, **kwargs)
        k = jax.random.fold_in(key, _u32(seed))
        return jax.random.key_data(k) if typed else k

    swaps: list[tuple[Any, str, Any]] = [(jax.random, "key", new_key), (jax.random, "PRNGKey", new_prng)]
    swaps += [(module, n, new_key) for n, v in vars(module).items() if v is orig_key]
    swaps += [(module, n, new_prng) for n, v in vars(module).items() if v is orig_prng]
    np_seed = _concrete_seed(key)
    with _ROUTING:
        np_state = None
        if np_seed is not None:
            swaps += _numpy_swaps(np_seed, owner)
            np_state = np.random.get_state()
            np.random.seed(np_seed)
        saved = [(obj, name, getattr(obj, name)) for obj, name, _ in swaps]
        try:
            for obj, name, value in swaps:
                setattr(obj, name, value)
            yield
        finally:
            for obj, name, value in reversed(saved):
                setattr(obj, name, value)
            if np_state is not None:
                np.random.set_state(np_state)


def _numpy_swaps(base: int, owner: int) -> list[tuple[Any, str, Any]]:
    orig_seed, orig_rng, orig_rs = np.random.seed, np.random.default_rng, np.random.RandomState

    def seed(s: Any = None) -> None:
        orig_seed(_mix(base, s) if threading.get_ident() == owner else s)

    def default_rng(s: Any = None) -> np.random.Generator:
        return orig_rng(_mix(base, s) if threading.get_ident() == owner else s)

    class RandomState(orig_rs):  # type: ignore[misc,valid-type]
        def __init__(self, s: Any = None) -> None:
            super().__init__(_mix(base, s) if threading.get_ident() == owner else s)

    return [(np.random, "seed", seed), (np.random, "default_rng", default_rng), (np.random, "RandomState", RandomState)]


# ---------------------------------------------------------------- dims and suite parameters


@contextlib.contextmanager
def _module_global(module: types.ModuleType, name: str, value: Any) -> Iterator[None]:
    had, old = hasattr(module, name), getattr(module, name, None)
    setattr(module, name, value)
    try:
        yield
    finally:
        if had:
            setattr(module, name, old)
        else:
            delattr(module, name)


def _is_dim(name: object, value: object) -> bool:
    return (
        isinstance(name, str)
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and name not in ("key", "dtype", "atol", "rtol")
        and "seed" not in name.lower()
        and isinstance(value, int)
        and not isinstance(value, bool)
    )


def _signature(args: Sequence[Any]) -> Signature:
    out: list[tuple[Any, ...]] = []
    for a in jax.tree.leaves(args):
        shape = getattr(a, "shape", None)
        out.append((tuple(shape), str(a.dtype)) if shape is not None else ("value", repr(a)))
    return tuple(out)


Build = Callable[[Any, dict[str, int]], tuple[tuple[Any, ...], dict[str, Any]]]
Call = Callable[[tuple[Any, ...], dict[str, Any]], Any]


class _Bridge:
    """make_inputs/reference for one suite module; remembers which parameters built inputs of which shapes."""

    def __init__(self, path: str, dims: dict[str, int], build: Build, call: Call, hand: Call | None) -> None:
        self.path, self.dims, self._build, self._call, self._hand = path, dims, build, call, hand
        self._seen: dict[Signature, dict[str, Any]] = {}

    def make_inputs(self, key: Any, **dims: int) -> tuple[Any, ...]:
        unknown = sorted(set(dims) - set(self.dims))
        if unknown:
            raise KernelError(
                f"make_inputs got unknown dims {unknown}", path=self.path, hint=f"its dims are {sorted(self.dims)}"
            )
        args, params = self._build(key, {**self.dims, **{k: int(v) for k, v in dims.items()}})
        self._seen[_signature(args)] = params
        return args

    def params(self, *args: Any) -> dict[str, Any]:
        sig = _signature(args)
        if sig not in self._seen:
            jax.eval_shape(lambda: self.make_inputs(jax.random.key(0)))  # records the default dims' shapes
        if sig not in self._seen:
            shapes = ", ".join(f"{s[1]}{list(s[0])}" if s[0] != "value" else s[1] for s in sig)
            raise KernelError(
                f"the reference got inputs ({shapes}) that make_inputs did not build in this process",
                path=self.path,
                hint="build them with make_inputs(key, **dims): the suite's parameters follow the dims",
            )
        return dict(self._seen[sig])

    def reference(self, *args: Any) -> Any:
        return self._call(args, self.params(*args))

    def hand_tuned(self, *args: Any) -> Any:
        assert self._hand is not None
        return self._hand(args, self.params(*args))


# ---------------------------------------------------------------- reading suite files


def _parse(source: str, path: str) -> ast.Module:
    try:
        return ast.parse(source, filename=path)
    except SyntaxError as e:
        raise KernelError(f"syntax error: {e.msg}", path=path, line=e.lineno, hint="fix the Python syntax") from None


def _top_names(tree: ast.Module) -> dict[str, ast.stmt]:
    out: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            out.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def _require(
    tree: ast.Module, path: str, needed: Mapping[str, str], fmt: str, other: tuple[str, str, str] | None = None
) -> None:
    """Each needed top-level name exists, else a one-line error (which names a look-alike of the other suite)."""
    names = _top_names(tree)
    for name, what in needed.items():
        if name not in names:
            looks_other = other is not None and other[0] in names and other[1] in names
            hint = (
                f"this looks like a {other[2]} file"
                if other and looks_other
                else f"a {fmt} defines {', '.join(needed)}"
            )
            raise KernelError(f"no `{name}` ({what})", path=path, line=1, hint=hint)


def _positional_names(fn: Callable[..., Any]) -> tuple[list[str], bool]:
    """Positional parameter names and whether the function also takes *args."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [], True
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names, any(p.kind == p.VAR_POSITIONAL for p in params)


def _dtype_option(dtype: str | None) -> Any:
    return None if dtype is None else jnp.dtype(dtype)


def _builder_kwargs(fn: Callable[..., Any], key: Any, dtype: str | None) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {}
    if dtype is not None and "dtype" in params:
        kwargs["dtype"] = _dtype_option(dtype)
    for name in ("key", "rng", "prng_key"):  # none of the real files takes one; if a builder does, give it the key
        if name in params:
            kwargs[name] = key
    return kwargs


# ---------------------------------------------------------------- JAXBench


def load_jaxbench(path: str | Path, *, dtype: str | None = "bfloat16", survey: bool = True) -> SuiteWorkload:
    """Load a JAXBench workload file, or a benchmark folder holding ``baseline.py`` (and maybe ``optimized.py``).

    ``dtype`` is what JAXBench's harness passes to ``create_inputs`` (bfloat16); None keeps the file's default.
    """
    p = Path(path)
    if p.is_dir():
        if not (p / "baseline.py").is_file():
            raise KernelError(
                "no baseline.py in this folder", path=str(p), hint="pass a JAXBench workload file or benchmark folder"
            )
        p = p / "baseline.py"
    source = read_file(p)
    hand = p.parent / "optimized.py" if p.name == "baseline.py" else None
    hand_ok = hand is not None and hand.is_file()
    return jaxbench_from_source(
        source,
        str(p),
        dtype=dtype,
        hand_tuned_source=read_file(hand) if hand_ok and hand else None,
        hand_tuned_path=str(hand) if hand_ok else None,
        survey=survey,
    )


def jaxbench_from_source(
    source: str,
    path: str,
    *,
    dtype: str | None = "bfloat16",
    hand_tuned_source: str | None = None,
    hand_tuned_path: str | None = None,
    survey: bool = True,
) -> SuiteWorkload:
    """Load a JAXBench workload given as source text (`path` labels tracebacks and errors)."""
    needed = {"CONFIG": "the sizes dict", "create_inputs": "the input builder", "workload": "the reference"}
    _require(_parse(source, path), path, needed, "JAXBench workload file", ("get_inputs", "computation", "MaxKernel"))
    module = exec_module(source, path)
    config = module.CONFIG
    if not isinstance(config, dict):
        raise KernelError("CONFIG is not a dict", path=path, hint="JAXBench's CONFIG is a dict of sizes and metadata")
    for name in ("create_inputs", "workload"):
        if not callable(getattr(module, name)):
            raise KernelError(f"`{name}` is not callable", path=path)
    base = dict(config)
    dims = {k: v for k, v in base.items() if _is_dim(k, v)}

    def build(key: Any, d: dict[str, int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        cfg = {**base, **d}
        with _module_global(module, "CONFIG", cfg), _seeded_from(key, module):
            out = module.create_inputs(**_builder_kwargs(module.create_inputs, key, dtype))
        return (tuple(out) if isinstance(out, tuple | list) else (out,)), cfg

    def call(args: tuple[Any, ...], cfg: dict[str, Any]) -> Any:
        with _module_global(module, "CONFIG", cfg):
            return module.workload(*args)

    hand_call, hpath = None, None
    if hand_tuned_source is not None:
        hpath = hand_tuned_path or str(Path(path).with_name("optimized.py"))
        hand_call = _jaxbench_hand(hand_tuned_source, hpath, dims)
    bridge = _Bridge(path, dims, build, call, hand_call)
    stem = Path(path).parent.name if Path(path).name == "baseline.py" else Path(path).stem
    name = base["name"] if isinstance(base.get("name"), str) else stem
    tol = {k: float(base[k]) for k in ("rtol", "atol") if isinstance(base.get(k), float | int)}
    names, star = _positional_names(module.workload)
    notes = [] if not getattr(module, "_skip_jit", False) else ["the workload is not jit-compatible (_skip_jit)"]
    return _finish(
        bridge,
        name=str(name),
        source=source,
        suite="jaxbench",
        arg_names=(names, star),
        hand=(hand_tuned_source, hpath),
        tolerance={**JAXBENCH_TOLERANCE, **tol},
        options={"dtype": dtype},
        notes=notes,
        survey=survey,
    )


def _jaxbench_hand(source: str, path: str, dims: Mapping[str, int]) -> Call:
    _require(_parse(source, path), path, {"workload": "the kernel"}, "JAXBench kernel file")
    hand = exec_module(source, path)

    def call(args: tuple[Any, ...], cfg: dict[str, Any]) -> Any:
        own = getattr(hand, "CONFIG", None)
        if not isinstance(own, dict):
            return hand.workload(*args)
        with _module_global(hand, "CONFIG", {**own, **{k: cfg[k] for k in dims if k in own}}):
            return hand.workload(*args)

    return call


# ---------------------------------------------------------------- MaxKernel


def load_maxkernel(
    task_dir: str | Path, *, dtype: str | None = None, case: int = 0, survey: bool = True
) -> SuiteWorkload:
    """Load a MaxKernel task folder (``reference.py``; a sibling module defining ``computation`` is the kernel file).

    A path to a ``reference.py``-style file works too. ``case`` picks one pair when ``get_inputs`` returns a list.
    """
    p = Path(task_dir)
    if not p.exists():
        raise KernelError("no such file or folder", path=str(p), hint="pass a MaxKernel task folder")
    ref = p / "reference.py" if p.is_dir() else p
    if not ref.is_file():
        raise KernelError(
            "no reference.py in the task folder",
            path=str(p),
            hint="a MaxKernel task folder holds reference.py with get_inputs() and computation(...)",
        )
    kernels = [f for f in sorted(ref.parent.glob("*.py")) if f != ref and _defines_computation(f)]
    hand = kernels[0] if len(kernels) == 1 else None
    sw = maxkernel_from_source(
        read_file(ref),
        str(ref),
        name=ref.parent.name if ref.name == "reference.py" else ref.stem,
        dtype=dtype,
        case=case,
        hand_tuned_source=read_file(hand) if hand else None,
        hand_tuned_path=str(hand) if hand else None,
        survey=survey,
    )
    if len(kernels) > 1:
        listed = ", ".join(k.name for k in kernels)
        note = f"several kernel files define computation ({listed}); none was taken as hand_tuned"
        sw = _with_notes(sw, (note,))
    return sw


def _defines_computation(path: Path) -> bool:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return False
    return "computation" in _top_names(tree)


def _literal_dims(func: ast.FunctionDef) -> tuple[dict[str, int], list[tuple[int, int, int, str]]]:
    """Integer literals assigned at the top of `func` (to names or dict-literal keys), and where each one sits."""
    dims: dict[str, int] = {}
    sites: list[tuple[int, int, int, str]] = []

    def take(name: str, node: ast.expr) -> None:
        value = node.value if isinstance(node, ast.Constant) else None
        if isinstance(value, int) and _is_dim(name, value) and node.end_col_offset is not None:
            dims.setdefault(name, value)
            sites.append((node.lineno, node.col_offset, node.end_col_offset, name))

    for stmt in func.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        for target in targets:
            if isinstance(target, ast.Name) and isinstance(value, ast.Dict):
                for k, v in zip(value.keys, value.values, strict=True):
                    if isinstance(k, ast.Constant) and isinstance(k.value, str):
                        take(k.value, v)
            elif isinstance(target, ast.Name) and value is not None:
                take(target.id, value)
            elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                for t, v in zip(target.elts, value.elts, strict=True):
                    if isinstance(t, ast.Name):
                        take(t.id, v)
    return dims, sites


def _rewrite(source: str, sites: list[tuple[int, int, int, str]]) -> str:
    """Wrap each literal site in ``__pallasopt_dims__.get(name, literal)`` without moving any line."""
    lines = source.splitlines(keepends=True)
    for lineno, c0, c1, name in sorted(sites, reverse=True):
        raw = lines[lineno - 1].encode("utf-8")  # ast column offsets count UTF-8 bytes
        wrapped = f"{DIMS_GLOBAL}.get({name!r}, ".encode() + raw[c0:c1] + b")"
        lines[lineno - 1] = (raw[:c0] + wrapped + raw[c1:]).decode("utf-8")
    return "".join(lines)


def maxkernel_from_source(
    source: str,
    path: str,
    *,
    name: str | None = None,
    dtype: str | None = None,
    case: int = 0,
    hand_tuned_source: str | None = None,
    hand_tuned_path: str | None = None,
    survey: bool = True,
) -> SuiteWorkload:
    """Load a MaxKernel ``reference.py`` given as source text (`path` labels tracebacks and errors)."""
    tree = _parse(source, path)
    needed = {"get_inputs": "the input builder", "computation": "the reference"}
    _require(tree, path, needed, "MaxKernel reference.py", ("create_inputs", "workload", "JAXBench workload"))
    func = _top_names(tree)["get_inputs"]
    if not isinstance(func, ast.FunctionDef):
        raise KernelError("`get_inputs` is not a function", path=path, line=func.lineno)
    dims, sites = _literal_dims(func)
    module = exec_module(_rewrite(source, sites), path)
    setattr(module, DIMS_GLOBAL, {})
    names, star = _positional_names(module.computation)
    line = func.lineno

    def build(key: Any, d: dict[str, int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        with _module_global(module, DIMS_GLOBAL, dict(d)), _seeded_from(key, module):
            out = module.get_inputs(**_builder_kwargs(module.get_inputs, key, dtype))
        dynamic, static = _one_case(out, case, path, line)
        static_names = names[len(dynamic) :] if not star else []
        keys = [static_names[i] if i < len(static_names) else f"static_{i}" for i in range(len(static))]
        return tuple(dynamic), dict(zip(keys, static, strict=True))

    def call(args: tuple[Any, ...], params: dict[str, Any]) -> Any:
        return module.computation(*args, *params.values())

    hand_call, hpath = None, None
    if hand_tuned_source is not None:
        hpath = hand_tuned_path or str(Path(path).with_name("kernel.py"))
        _require(_parse(hand_tuned_source, hpath), hpath, {"computation": "the kernel"}, "kernel file")
        hand_mod = exec_module(hand_tuned_source, hpath)

        def hand_call(args: tuple[Any, ...], params: dict[str, Any]) -> Any:
            return hand_mod.computation(*args, *params.values())

    bridge = _Bridge(path, dims, build, call, hand_call)
    return _finish(
        bridge,
        name=name or Path(path).parent.name,
        source=source,
        suite="maxkernel",
        arg_names=(names, star),
        hand=(hand_tuned_source, hpath),
        tolerance=dict(MAXKERNEL_TOLERANCE),
        options={"dtype": dtype, "case": case},
        notes=[],
        survey=survey,
    )


def _one_case(out: Any, case: int, path: str, line: int) -> tuple[Sequence[Any], Sequence[Any]]:
    def is_pair(x: Any) -> bool:
        return isinstance(x, tuple) and len(x) == 2 and all(isinstance(p, tuple | list) for p in x)

    # The MaxKernel harness's rule: a list is a list of cases, a 2-tuple is one (dynamic_args, static_args) case.
    if isinstance(out, list) and out and all(is_pair(c) for c in out):
        cases = out
    elif is_pair(out):
        cases = [out]
    else:
        raise KernelError(
            f"get_inputs() returned {type(out).__name__}, not (dynamic_args, static_args)",
            path=path,
            line=line,
            hint="return ([arrays...], [static values...]) or a list of such pairs",
        )
    if not 0 <= case < len(cases):
        raise KernelError(f"get_inputs() has {len(cases)} case(s); case {case} asked for", path=path, line=line)
    dynamic, static = cases[case]
    return dynamic, static


# ---------------------------------------------------------------- shared finish: validation and notes


def _finish(
    bridge: _Bridge,
    *,
    name: str,
    source: str,
    suite: str,
    arg_names: tuple[list[str], bool],
    hand: tuple[str | None, str | None],
    tolerance: dict[str, float],
    options: dict[str, Any],
    notes: list[str],
    survey: bool,
) -> SuiteWorkload:
    builder = "create_inputs" if suite == "jaxbench" else "get_inputs"
    count = None
    if survey:
        count = _survey(bridge, source, builder, notes)
    names, star = arg_names
    if count is None:
        count = len(names) if not star else 0
    args = tuple(names[:count]) if not star and len(names) >= count else tuple(f"arg{i}" for i in range(count))
    return SuiteWorkload(
        name=name,
        path=bridge.path,
        reference=bridge.reference,
        make_inputs=bridge.make_inputs,
        dims=dict(bridge.dims),
        source=source,
        suite=suite,
        arg_names=args,
        params=bridge.params,
        hand_tuned=bridge.hand_tuned if hand[1] is not None else None,
        hand_tuned_path=hand[1],
        hand_tuned_source=hand[0] if hand[1] is not None else None,
        tolerance=tolerance,
        options=options,
        notes=tuple(notes),
    )


def _survey(bridge: _Bridge, source: str, builder: str, notes: list[str]) -> int | None:
    """Check the builder at the default dims (abstractly) and note what the user should know; the input count."""
    path = bridge.path
    if re.search(r"\b(np|numpy)\.random\b", source):
        notes.append(f"{builder} uses numpy's random generator: make_inputs reseeds it from the key's bits")
        return None  # numpy materializes even under eval_shape: do not build the default size here
    key = jax.random.key(0)
    try:
        structs = jax.eval_shape(lambda: bridge.make_inputs(key))
    except KernelError:
        raise
    except Exception as e:
        raise KernelError(
            f"{builder}() failed at the default dims: {type(e).__name__}: {short(e, 240)}",
            path=path,
            line=user_line(e, path),
            hint=f"make_inputs runs {builder} under jax.eval_shape at the default dims",
        ) from None
    closed = jax.make_jaxpr(lambda k: bridge.make_inputs(k))(key)
    dependent = set(closed.jaxpr.invars)
    for eqn in closed.jaxpr.eqns:
        if any(not hasattr(v, "val") and v in dependent for v in eqn.invars):
            dependent.update(eqn.outvars)
    for i, (v, s) in enumerate(zip(closed.jaxpr.outvars, structs, strict=True)):
        if hasattr(v, "val") or v not in dependent:
            notes.append(
                f"input {i} ({s.dtype}{list(s.shape)}) does not depend on the key: every seed gives the same values"
            )
    base = _signature(structs)
    for d, value in bridge.dims.items():
        try:
            probe = jax.eval_shape(lambda d=d, value=value: bridge.make_inputs(key, **{d: 2 * value}))
        except Exception:
            continue  # a size that only works at its default (divisibility, asserts): it does drive something
        if _signature(probe) == base:
            notes.append(f"dim {d!r} does not change any input's shape ({builder} may hardcode its sizes)")
    jax.eval_shape(lambda: bridge.make_inputs(key))  # the default dims are the ones remembered for these shapes
    try:
        jax.eval_shape(bridge.reference, *structs)
    except Exception as e:
        notes.append(f"the reference does not trace at the default dims: {type(e).__name__}: {short(e, 120)}")
    calls = (n.func for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call))
    if any(
        (isinstance(f, ast.Attribute) and f.attr == "pallas_call")
        or (isinstance(f, ast.Name) and f.id == "pallas_call")
        for f in calls
    ):
        notes.append("the suite's reference itself calls pallas_call: on the CPU it needs interpret mode")
    return len(structs)


def _with_notes(sw: SuiteWorkload, extra: tuple[str, ...]) -> SuiteWorkload:
    return replace(sw, notes=sw.notes + extra)


# ---------------------------------------------------------------- the kernel-module template


def _literal(text: str) -> str:
    """`text` as a Python literal that reads well: a raw triple-quoted string when that round-trips."""
    body = text if text.endswith("\n") else text + "\n"
    candidate = "r'''" + body + "'''"
    try:
        if "'''" not in body and ast.literal_eval(candidate) == body:
            return candidate
    except (SyntaxError, ValueError):
        pass
    return repr(body)


def _identifier(name: str) -> str:
    ident = re.sub(r"\W+", "_", name).strip("_").lower() or "workload"
    return f"pallas_{ident}"


def _safe(text: str) -> str:
    return text.replace("\\", "/").replace('"""', "'''")


def to_kernel_module_template(sw: SuiteWorkload, *, embed: bool = True, out_dir: str | Path | None = None) -> str:
    """A kernel-module source (docs/kernel-format.md) around `sw`: reference, make_inputs, a stub entry to fill.

    ``embed`` puts the suite's file (and kernel file) in the module as text, so it stands alone; otherwise it loads
    them from their path at import time (relative to the module when ``out_dir`` is given).
    """
    entry = _identifier(sw.name)
    args = ", ".join(sw.arg_names) if sw.arg_names else "*args"
    fmt = "JAXBench workload" if sw.suite == "jaxbench" else "MaxKernel task"
    pieces = [
        f'"""pallasopt kernel module for the {fmt} {_safe(sw.name)}.',
        "",
        f"Imported from {_safe(sw.path)}.",
        "Generated by `pallasopt import`. `reference` and `make_inputs` run the suite's own code through",
        "pallasopt.adapters: the suite's fixed seeds are folded into the key, its sizes are the dims below, and",
        "its scalar parameters (CONFIG values, static args) follow the dims that built the inputs.",
        f"TODO: write the Pallas kernel in `{entry}`.",
    ]
    if sw.notes:
        pieces += ["", "Notes from the import:"] + [f"- {_safe(n)}" for n in sw.notes]
    pieces += [
        '"""',
        "",
        "import jax",
        "import jax.numpy as jnp",
        "from jax.experimental import pallas as pl",
        "from jax.experimental.pallas import tpu as pltpu",
        "",
    ]
    options = ", ".join(f"{k}={v!r}" for k, v in sw.options.items())
    if embed:
        loader = "jaxbench_from_source" if sw.suite == "jaxbench" else "maxkernel_from_source"
        pieces += [f"from pallasopt.adapters import {loader}", "", f"# The suite's file, verbatim from {sw.path}."]
        pieces += [f"_SUITE_SOURCE = {_literal(sw.source)}"]
        call = f"{loader}(_SUITE_SOURCE, {sw.path!r}, {options}, survey=False"
        if sw.suite == "maxkernel":
            call += f", name={sw.name!r}"
        if sw.hand_tuned_source is not None:
            pieces += [f"# The suite's kernel file, verbatim from {sw.hand_tuned_path}."]
            pieces += [f"_HAND_TUNED_SOURCE = {_literal(sw.hand_tuned_source)}"]
            call += f", hand_tuned_source=_HAND_TUNED_SOURCE, hand_tuned_path={sw.hand_tuned_path!r}"
        pieces += [f"_SUITE = {call})"]
    else:
        loader = "load_jaxbench" if sw.suite == "jaxbench" else "load_maxkernel"
        target = Path(sw.path) if sw.suite == "jaxbench" else Path(sw.path).parent
        if sw.suite == "maxkernel" and Path(sw.path).name != "reference.py":
            target = Path(sw.path)
        pieces += ["from pathlib import Path", "", f"from pallasopt.adapters import {loader}", ""]
        if out_dir is not None:
            rel = Path(_relpath(target.resolve(), Path(out_dir).resolve())).as_posix()
            pieces += [f"_SUITE = {loader}(Path(__file__).resolve().parent / {rel!r}, {options}, survey=False)"]
        else:
            pieces += [f"_SUITE = {loader}({target.resolve().as_posix()!r}, {options}, survey=False)"]
    pieces += [
        "",
        f"ENTRY = {entry!r}",
        f"TOLERANCE = {sw.tolerance!r}  # the suite's own correctness check",
        "",
        "",
        f"def {entry}({args}):",
        f'    """TODO(pallasopt import): compute what `reference({args})` computes, with pl.pallas_call.',
        "",
        f"    The suite's parameters for these inputs: `_SUITE.params({args})` (a dict, known at trace time).",
        "    Dims: " + (", ".join(f"{k}={v}" for k, v in sw.dims.items()) or "none") + ".",
        '    """',
        f"    raise NotImplementedError(f\"{entry} in {{globals().get('__file__', 'this module')}} is a stub: \"",
        '                              "write its Pallas kernel (see the TODO in its docstring)")',
        "",
        "",
        f"def reference({args}):",
        f'    """The suite\'s {"workload" if sw.suite == "jaxbench" else "computation"}: the oracle."""',
        f"    return _SUITE.reference({args})",
        "",
        "",
    ]
    dim_params = "".join(f", {k}={v}" for k, v in sw.dims.items())
    dim_args = ", ".join(f"{k}={k}" for k in sw.dims)
    builder = "create_inputs" if sw.suite == "jaxbench" else "get_inputs"
    head, body = (
        f"def make_inputs(key{dim_params}):",
        f"    return _SUITE.make_inputs(key{', ' + dim_args if dim_args else ''})",
    )
    if len(head) > 120:
        head = "def make_inputs(\n    key,\n" + "".join(f"    {k}={v},\n" for k, v in sw.dims.items()) + "):"
    if len(body) > 120:
        body = (
            "    return _SUITE.make_inputs(\n        key,\n" + "".join(f"        {k}={k},\n" for k in sw.dims) + "    )"
        )
    pieces += [head, f'    """The suite\'s {builder} at these dims, its fixed seeds folded into `key`."""', body]
    if sw.hand_tuned is not None:
        pieces += [
            "",
            "",
            f"def hand_tuned({args}):",
            f'    """The suite\'s own kernel ({_safe(Path(sw.hand_tuned_path or "").name)}), for comparison."""',
            f"    return _SUITE.hand_tuned({args})",
        ]
    return "\n".join(pieces) + "\n"


def _relpath(target: Path, start: Path) -> str:
    return os.path.relpath(target, start)


# ---------------------------------------------------------------- `pallasopt import`


def import_main(argv: Sequence[str] | None = None) -> int:
    """``pallasopt import (--jaxbench FILE | --maxkernel DIR) -o OUT.py [--force] [--link]``: write the template."""
    parser = argparse.ArgumentParser(
        prog="pallasopt import", description="Write a kernel module around a JAXBench workload or a MaxKernel task."
    )
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--jaxbench", metavar="FILE", help="a JAXBench workload file (or benchmark folder)")
    src.add_argument("--maxkernel", metavar="DIR", help="a MaxKernel task folder (holding reference.py)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.py", help="the kernel module to write")
    parser.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    parser.add_argument("--link", action="store_true", help="load the suite's file by path instead of embedding it")
    parser.add_argument("--dtype", default=None, help="input dtype passed to the builder (JAXBench: bfloat16)")
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else int(ExitCode.USAGE)
    out = Path(args.output)
    try:
        if out.exists() and not args.force:
            raise UsageError("already exists", path=str(out), hint="pass --force to overwrite it")
        if not out.parent.is_dir():
            raise UsageError("no such folder", path=str(out.parent), hint="create it first")
        if args.jaxbench:
            sw = load_jaxbench(args.jaxbench, dtype=args.dtype or "bfloat16")
        else:
            sw = load_maxkernel(args.maxkernel, dtype=args.dtype)
        text = to_kernel_module_template(sw, embed=not args.link, out_dir=out.parent if args.link else None)
        with out.open("w" if args.force else "x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        print(f"{out}: already exists (pass --force to overwrite it)", file=sys.stderr)
        return int(ExitCode.USAGE)
    except UserError as e:
        print(str(e), file=sys.stderr)
        return int(e.exit_code)
    entry = _identifier(sw.name)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if s.startswith(f"def {entry}("))
    print(f"wrote {out}: write the Pallas kernel in `{entry}` ({out}:{line}), then run `pallasopt check {out}`")
    for note in sw.notes:
        print(f"note: {note}")
    return int(ExitCode.OK)
