"""The KernelBench-style loader: ``class Model`` with ``forward``, module-level sizes, ``get_inputs``,
``get_init_inputs`` (JAXBench's ``jaxkernelbench/level1|2`` and the LLM kernels in ``pallas_eval/generated``).

How the format maps onto pallasopt's (read in aryatschand/JAXBench: jaxkernelbench/level2/76_Gemm_Add_ReLU.py,
pallas_eval/eval_harness.py):

- dims: module-level names bound to an integer expression of literals (``batch_size = 1024``, ``M = 16384 * 4``).
  The module is re-run per dims with those expressions rewritten to ``__pallasopt_dims__.get(name, expr)`` (same
  lines), so sizes derived from them at module level (``bias_shape = (out_features,)``) follow.
- inputs: ``get_inputs()``'s arrays (its fixed seed folded into the key, as for the other suites), then the model's
  parameters: every array attribute of ``Model(*get_init_inputs())``. The suite builds them with ``jnp.zeros`` /
  ``jnp.ones`` and its harness compares two models with those constants, so a kernel that ignores a weight passes
  there. Here each parameter is drawn from the key: normal scaled by 1/sqrt(fan-in) (fan-in: the product of all
  dims but the first, at least 1), and uniform in [0.5, 1.5) for names holding "var" (variances must be positive).
- Python scalars from ``get_inputs`` (``s = 3.14``) are static: not kernel arguments, passed to ``forward`` as is.
- the reference: the suite module's ``Model.forward`` with those parameters set by attribute name; the kernel:
  the kernel module's ``Model`` built the same way (see ``SuiteWorkload.bind_model``).
"""

from __future__ import annotations

import ast
import contextlib
import math
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import KernelError
from ..workload import exec_module
from ._common import (
    DIMS_GLOBAL,
    SuiteWorkload,
    _Bridge,
    _finish,
    _is_dim,
    _require,
    _seeded_from,
    parse_source,
    top_names,
    wrap_dim_sites,
)

KERNELBENCH_TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}  # JAXBench pallas_eval/eval_harness.py check_correctness


def _const_int(node: ast.expr) -> int | None:
    """The value of an integer expression made of literals and + - * // ** (None for anything else)."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, int) and not isinstance(node.value, bool) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _const_int(node.operand)
        return None if v is None else -v
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.FloorDiv | ast.Pow):
        a, b = _const_int(node.left), _const_int(node.right)
        if a is None or b is None or (isinstance(node.op, ast.FloorDiv) and b == 0):
            return None
        if isinstance(node.op, ast.Pow) and not 0 <= b <= 64:
            return None
        ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
        if isinstance(node.op, ast.FloorDiv):
            return a // b
        if isinstance(node.op, ast.Pow):
            return int(a**b)
        return ops[type(node.op)]
    return None


def module_dims(tree: ast.Module) -> tuple[dict[str, int], list[tuple[int, int, int, str]]]:
    """Module-level sizes (name -> value) and the single-line expression sites that bind them."""
    dims: dict[str, int] = {}
    sites: list[tuple[int, int, int, str]] = []
    for stmt in tree.body:
        if not isinstance(stmt, ast.Assign) or not isinstance(stmt.targets[0], ast.Name):
            continue
        name, value = stmt.targets[0].id, _const_int(stmt.value)
        if value is None or name.startswith("_") or not _is_dim(name, value):
            continue
        if stmt.value.end_lineno != stmt.value.lineno or stmt.value.end_col_offset is None:
            continue
        dims[name] = value  # a later assignment of the same name wins, as in Python
        sites.append((stmt.value.lineno, stmt.value.col_offset, stmt.value.end_col_offset, name))
    return dims, sites


def inline_dims(tree: ast.Module) -> tuple[dict[str, int], list[tuple[int, int, int, str]]]:
    """Sizes written inline in ``get_inputs``'s shape tuples (``x = uniform(key, (16, 32, 64))``): named
    ``<var>_<axis>`` (x_0, x_1, x_2), or ``in<i>_<axis>`` for the i-th input built in the return statement itself
    (``return [uniform(key, (16, 16, 32, 128, 128))]``: 10 of JAXBench's level-2 tasks, whose check otherwise ran at
    the full size, 134 MB of input for `13_ConvTranspose3d_...`, and died out of memory). 19 of JAXBench's KernelBench
    tasks have no module-level sizes, only these."""
    func = top_names(tree).get("get_inputs")
    dims: dict[str, int] = {}
    sites: list[tuple[int, int, int, str]] = []
    if not isinstance(func, ast.FunctionDef):
        return dims, sites
    for stmt in ast.walk(func):
        if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
            _name_shape(stmt.value, stmt.targets[0].id, dims, sites)
        elif isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.List | ast.Tuple):
            for i, elt in enumerate(stmt.value.elts):
                if not isinstance(elt, ast.Name):
                    _name_shape(elt, f"in{i}", dims, sites)
    return dims, sites


def _name_shape(value: ast.expr, var: str, dims: dict[str, int], sites: list[tuple[int, int, int, str]]) -> None:
    """The first shape tuple in `value` (two or more positive int literals), its sizes named ``<var>_<axis>``."""
    for node in ast.walk(value):
        if not isinstance(node, ast.Tuple) or len(node.elts) < 2:
            continue
        values = [_const_int(e) if isinstance(e, ast.Constant) else None for e in node.elts]
        if any(v is None or v < 1 for v in values):
            continue
        for i, (e, v) in enumerate(zip(node.elts, values, strict=True)):
            name = f"{var}_{i}"
            if v is not None and name not in dims and e.end_col_offset is not None:
                dims[name] = v
                sites.append((e.lineno, e.col_offset, e.end_col_offset, name))
        return


def _is_array(x: Any) -> bool:
    return isinstance(x, jax.Array | np.ndarray | jax.ShapeDtypeStruct) or (
        hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.generic)
    )


def param_structs(model_cls: Any, init: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """The array attributes of ``model_cls(*init)``, as shapes (the model is built abstractly: nothing allocated)."""

    names: list[str] = []

    def arrays() -> list[Any]:
        m = model_cls(*init)
        own = [(k, v) for k, v in vars(m).items() if isinstance(v, jax.Array)]
        names.extend(k for k, _ in own)
        return [v for _, v in own]

    structs = jax.eval_shape(arrays)
    return dict(zip(names, structs, strict=True))


def random_param(key: Any, name: str, s: jax.ShapeDtypeStruct) -> jax.Array:
    """A parameter drawn from `key` (see the module docstring for the distributions)."""
    if not jnp.issubdtype(s.dtype, jnp.floating):
        return jnp.zeros(s.shape, s.dtype) if not s.shape else jax.random.randint(key, s.shape, 0, 4, s.dtype)
    if "var" in name.lower():
        return jax.random.uniform(key, s.shape, s.dtype, 0.5, 1.5)
    fan_in = math.prod(s.shape[1:]) if len(s.shape) > 1 else 1
    return (jax.random.normal(key, s.shape, jnp.float32) / math.sqrt(max(fan_in, 1))).astype(s.dtype)


def kernelbench_from_source(source: str, path: str, *, name: str | None = None, survey: bool = True) -> SuiteWorkload:
    """Load a KernelBench-style task given as source text (`path` labels tracebacks and errors)."""
    tree = parse_source(source, path)
    needed = {"Model": "the reference model", "get_inputs": "the input builder", "get_init_inputs": "Model's args"}
    _require(tree, path, needed, "KernelBench task file", ("CONFIG", "workload", "JAXBench workload"))
    dims, sites = module_dims(tree)
    if not dims:
        dims, sites = inline_dims(tree)
    rewritten = wrap_dim_sites(source, sites)
    modules: dict[tuple[tuple[str, int], ...], Any] = {}

    def module_for(d: dict[str, int]) -> Any:
        k = tuple(sorted(d.items()))
        if k not in modules:
            m = exec_module(f"{DIMS_GLOBAL} = {dict(d)!r}\n" + rewritten, path)
            modules[k] = m
        return modules[k]

    forward_line = _forward_line(tree)

    def build(key: Any, d: dict[str, int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        module = module_for(d)
        with _seeded_from(key, module):
            raw = module.get_inputs()
            init = module.get_init_inputs()
        raw = list(raw) if isinstance(raw, list | tuple) else [raw]
        init = list(init) if isinstance(init, list | tuple) else [init]
        static = {i: v for i, v in enumerate(raw) if not _is_array(v)}
        dynamic = [jnp.asarray(v) if isinstance(v, np.ndarray) else v for v in raw if _is_array(v)]
        structs = param_structs(module.Model, init)
        pkeys = jax.random.split(jax.random.fold_in(key, 0x5EED), max(len(structs), 1))
        params = {n: random_param(pkeys[i], n, s) for i, (n, s) in enumerate(structs.items())}
        cfg = {"dims": dict(d), "static": static, "init": init, "n_inputs": len(raw), "params": list(params)}
        return (*dynamic, *params.values()), cfg

    def call(args: tuple[Any, ...], cfg: dict[str, Any]) -> Any:
        module = module_for(cfg["dims"])
        return run_model(module.Model, args, cfg, path)

    bridge = _Bridge(path, dims, build, call, None)
    arg_names = _arg_names(tree, bridge, path, forward_line)
    return _finish(
        bridge,
        name=name or Path(path).stem,
        source=source,
        suite="kernelbench",
        arg_names=(arg_names, False),
        hand=(None, None),
        tolerance=dict(KERNELBENCH_TOLERANCE),
        options={},
        notes=[],
        survey=survey,
    )


def run_model(model_cls: Any, args: tuple[Any, ...], cfg: dict[str, Any], path: str) -> Any:
    """``model_cls(*init)`` with its parameters set from the tail of `args`, applied to the head of `args`."""
    names: list[str] = cfg["params"]
    n_dyn = len(args) - len(names)
    model = model_cls(*cfg["init"])
    own = {k: v for k, v in vars(model).items() if isinstance(v, jax.Array)}
    for n, value in zip(names, args[n_dyn:], strict=True):
        target = n if n in own else _same_shape(own, value, names)
        if target is None:
            raise KernelError(
                f"the kernel's Model has no parameter {n!r} of shape {list(value.shape)} "
                f"(its array attributes: {', '.join(f'{k}{list(v.shape)}' for k, v in own.items()) or 'none'})",
                path=path,
                hint="name the kernel's parameters as the task's Model does",
            )
        _set_param(model, target, value, own.get(target))
    dyn = iter(args[:n_dyn])
    static: dict[int, Any] = cfg["static"]
    full = [static[i] if i in static else next(dyn) for i in range(cfg["n_inputs"])]
    return model.forward(*full)


def _set_param(model: Any, name: str, value: Any, declared: Any) -> None:
    """Set parameter `name` of the kernel's model to `value`. Where the model declares it in another shape (a bias
    kept as (1, N) for a task's (N,)) and has a `set_weights` (JAXBench's harness sets weights through it), that
    method sets it, as JAXBench does: kept if it gives the declared shape, else the value is set as it is (the
    kernel then fails on it with its own error)."""
    setter = getattr(model, "set_weights", None)
    if declared is not None and tuple(declared.shape) != tuple(value.shape) and callable(setter):
        with contextlib.suppress(Exception):
            setter({name: value})
            now = getattr(model, name, None)
            if now is not None and tuple(now.shape) == tuple(declared.shape):
                return
    setattr(model, name, value)


def _same_shape(own: dict[str, Any], value: Any, taken: list[str]) -> str | None:
    """The kernel's only unclaimed array attribute with `value`'s shape and dtype (names differ between files)."""
    options = [k for k, v in own.items() if k not in taken and v.shape == value.shape and v.dtype == value.dtype]
    return options[0] if len(options) == 1 else None


def _forward_line(tree: ast.Module) -> int:
    model = top_names(tree)["Model"]
    if isinstance(model, ast.ClassDef):
        for node in model.body:
            if isinstance(node, ast.FunctionDef) and node.name == "forward":
                return node.lineno
        raise KernelError("Model has no `forward` method", path=None, line=model.lineno)
    return model.lineno


def _arg_names(tree: ast.Module, bridge: _Bridge, path: str, line: int) -> list[str]:
    """forward's parameter names for the array inputs, then the parameter attribute names."""
    model = top_names(tree)["Model"]
    fwd = next((n for n in getattr(model, "body", []) if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if fwd is None:
        raise KernelError("Model has no `forward` method", path=path, line=line, hint="define Model.forward")
    names = [a.arg for a in fwd.args.args[1:]]
    try:
        structs = jax.eval_shape(lambda: bridge.make_inputs(jax.random.key(0)))
    except KernelError:
        raise
    except Exception:
        return []  # the survey reports why the builder fails
    cfg = bridge.params(*structs)
    static: dict[int, Any] = cfg["static"]
    inputs = [n for i, n in enumerate(names[: cfg["n_inputs"]]) if i not in static]
    out = inputs + [re.sub(r"\W", "_", p) for p in cfg["params"]]
    return out if len(out) == len(structs) and len(set(out)) == len(out) else []
