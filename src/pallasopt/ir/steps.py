"""Per-grid-step evaluation of a kernel's scalar index arithmetic, vectorized over all grid points with numpy.

An index map (`lambda i, j, tbl: (i, tbl[i, j])`) or a `pl.when` predicate (`k <= q`, `mask_ref[i, j] != 0`) is a
small jaxpr over program ids, grid sizes, literals and scalar-prefetch tables. Evaluating it on arrays of every grid
point's indices at once costs one numpy op per equation, whatever the grid size, so the cost model can say which
steps skip their work and which keep their block index (no DMA) instead of assuming every step does everything.

Only scalar integer/boolean arithmetic is interpreted (the primitives in `_BINARY`, `_UNARY` and a few others); a
jaxpr that needs anything else raises `NotEvaluable` and the caller keeps its closed form.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.extend.core
import numpy as np

MAX_EVALUATED_STEPS = 1 << 22  # grids up to ~4M steps are evaluated step by step (vectorized); larger keep closed forms


class NotEvaluable(Exception):
    """A jaxpr needs something the scalar interpreter does not model (a vector op, a missing prefetch table)."""


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(np.result_type(a, b), np.integer):  # lax.div truncates toward zero
        with np.errstate(divide="ignore"):
            q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
        return np.where(b == 0, 0, q * np.sign(a) * np.sign(b))
    return np.asarray(a) / b


def _rem(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(np.result_type(a, b), np.integer):  # lax.rem takes the sign of the dividend
        return np.where(b == 0, 0, a - b * _div(a, b))
    return np.fmod(a, b)


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": _div,
    "rem": _rem,
    "max": np.maximum,
    "min": np.minimum,
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
    "shift_left": np.left_shift,
    "shift_right_arithmetic": np.right_shift,
}
_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": np.negative,
    "abs": np.abs,
    "sign": np.sign,
    "not": lambda a: np.logical_not(a) if np.asarray(a).dtype == bool else np.invert(a),
}
_IDENTITY = frozenset(
    {"squeeze", "reshape", "broadcast_in_dim", "multiple_of", "copy", "copy_p", "optimization_barrier"}
)
_CALLS = frozenset({"pjit", "jit", "closed_call", "core_call"})
SUPPORTED = frozenset(
    {*_BINARY, *_UNARY, *_IDENTITY, *_CALLS, "program_id", "num_programs", "get", "select_n", "clamp"}
    | {"convert_element_type", "integer_pow"}
)


def grid_indices(grid: Sequence[int], order: Sequence[int] | None = None) -> list[np.ndarray]:
    """For each grid axis, its index at every step, steps listed in visiting order (`order`: outermost axis first,
    default as written; the last axis moves fastest)."""
    axes = list(order) if order is not None else list(range(len(grid)))
    mesh = np.indices([grid[a] for a in axes], dtype=np.int32).reshape(len(axes), -1) if axes else np.zeros((0, 1))
    out: list[np.ndarray] = [np.zeros(mesh.shape[1], dtype=np.int32)] * len(grid)
    for row, a in enumerate(axes):
        out[a] = mesh[row]
    return out


def _closed(value: Any) -> tuple[Any, Sequence[Any]] | None:
    if hasattr(value, "jaxpr") and hasattr(value, "consts") and hasattr(value.jaxpr, "eqns"):
        return value.jaxpr, value.consts
    if hasattr(value, "eqns"):
        return value, ()
    return None


def _get(eqn: Any, ref: Any, idx: list[Any]) -> np.ndarray:
    if not isinstance(ref, np.ndarray):
        raise NotEvaluable("a ref read that is not a scalar-prefetch table")
    try:
        (indexer,) = jax.tree_util.tree_unflatten(eqn.params["tree"], idx)
        indices = list(indexer.indices)
    except Exception as e:
        raise NotEvaluable(f"unreadable ref indexer: {e}") from None
    if len(indices) != ref.ndim or any(hasattr(i, "start") for i in indices):
        raise NotEvaluable("a ref read of a slice, not one scalar")
    clipped = tuple(np.clip(np.asarray(i).astype(np.int64), 0, n - 1) for i, n in zip(indices, ref.shape, strict=True))
    return ref[clipped]


def evaluate(
    jaxpr: Any,
    consts: Sequence[Any],
    args: Sequence[Any],
    pids: Sequence[np.ndarray] = (),
    grid: Sequence[int] = (),
    wanted: Sequence[Any] | None = None,
) -> list[Any]:
    """The values of `wanted` vars (default: the jaxpr's outputs) given `args` for its invars (numpy arrays, one
    value per grid step or broadcastable; a scalar-prefetch table as a whole numpy array; None for an input that
    must not be needed). Only the equations those vars depend on run."""
    env: dict[Any, Any] = {}
    if len(consts) == len(jaxpr.constvars):
        for v, c in zip(jaxpr.constvars, consts, strict=True):
            env[v] = np.asarray(c)
    for v, a in zip(jaxpr.invars, args, strict=True):
        env[v] = a
    targets = list(jaxpr.outvars if wanted is None else wanted)
    needed: set[Any] = {t for t in targets if not isinstance(t, jax.extend.core.Literal)}
    live: list[Any] = []
    for eqn in reversed(jaxpr.eqns):
        if any(o in needed for o in eqn.outvars):
            live.append(eqn)
            needed.update(v for v in eqn.invars if not isinstance(v, jax.extend.core.Literal))
    for eqn in reversed(live):
        _run(eqn, env, pids, grid)
    return [_read(env, t) for t in targets]


def _read(env: Mapping[Any, Any], v: Any) -> Any:
    if isinstance(v, jax.extend.core.Literal):
        return np.asarray(v.val)
    if v not in env or env[v] is None:
        raise NotEvaluable("needs an input that is not available (a scalar-prefetch table not materialized)")
    return env[v]


def run_equation(eqn: Any, env: dict[Any, Any], pids: Sequence[np.ndarray] = (), grid: Sequence[int] = ()) -> None:
    """Evaluate one scalar equation into `env` (its inputs read from it); `NotEvaluable` when it cannot be."""
    _run(eqn, env, pids, grid)


def _run(eqn: Any, env: dict[Any, Any], pids: Sequence[np.ndarray], grid: Sequence[int]) -> None:
    name = eqn.primitive.name
    if name not in SUPPORTED:
        raise NotEvaluable(f"primitive {name!r}")
    if name == "program_id":
        axis = int(eqn.params["axis"])
        if axis >= len(pids):
            raise NotEvaluable("program_id outside the grid")
        env[eqn.outvars[0]] = pids[axis]
        return
    if name == "num_programs":
        env[eqn.outvars[0]] = np.asarray(grid[int(eqn.params["axis"])], dtype=np.int32)
        return
    if name in _CALLS:
        inner = _closed(eqn.params.get("jaxpr", eqn.params.get("call_jaxpr")))
        if inner is None:
            raise NotEvaluable(f"{name} without a jaxpr")
        outs = evaluate(inner[0], inner[1], [_read(env, v) for v in eqn.invars], pids, grid)
        for o, val in zip(eqn.outvars, outs, strict=True):
            env[o] = val
        return
    for o in eqn.outvars:
        if getattr(o.aval, "shape", ()) != () and name != "get":
            raise NotEvaluable(f"non-scalar value from {name!r}")
    if name == "get":
        if getattr(eqn.outvars[0].aval, "shape", ()) != ():
            raise NotEvaluable("a ref read of more than one element")
        env[eqn.outvars[0]] = _get(eqn, _read(env, eqn.invars[0]), [_read(env, v) for v in eqn.invars[1:]])
        return
    vals = [_read(env, v) for v in eqn.invars]
    if name in _BINARY:
        out = _BINARY[name](vals[0], vals[1])
    elif name in _UNARY:
        out = _UNARY[name](vals[0])
    elif name in _IDENTITY:
        out = vals[0]
    elif name == "select_n":
        which = np.asarray(vals[0]).astype(np.int64)
        out = np.choose(np.clip(which, 0, len(vals) - 2), vals[1:])
    elif name == "clamp":
        out = np.clip(vals[1], vals[0], vals[2])
    elif name == "integer_pow":
        out = np.power(vals[0], int(eqn.params["y"]))
    else:  # convert_element_type
        out = np.asarray(vals[0]).astype(np.dtype(eqn.params["new_dtype"]))
    env[eqn.outvars[0]] = out


def slice_supported(jaxpr: Any, var: Any, opaque: frozenset[Any] = frozenset()) -> bool:
    """Whether `var` is computed by interpretable scalar equations only (program ids, grid sizes, literals, ref
    reads from `opaque` refs such as scalar-prefetch tables), without evaluating anything."""
    producers = {o: e for e in jaxpr.eqns for o in e.outvars}
    seen: set[Any] = set()
    stack = [var]
    while stack:
        v = stack.pop()
        if isinstance(v, jax.extend.core.Literal) or v in seen:
            continue
        seen.add(v)
        if v in opaque or v in jaxpr.constvars:
            continue
        eqn = producers.get(v)
        if eqn is None or eqn.primitive.name not in SUPPORTED:
            return False
        if eqn.primitive.name != "get" and any(getattr(o.aval, "shape", ()) != () for o in eqn.outvars):
            return False
        stack.extend(eqn.invars)
    return True


def fetch_count(blocks: Sequence[np.ndarray]) -> int:
    """Block transfers over a visit: one at the first step, then one at each step whose block index differs from
    the previous step's (the Pallas pipeline keeps a block whose index does not change)."""
    if not blocks:
        return 1
    cols = [np.asarray(b).reshape(-1) for b in blocks]
    n = max(c.size for c in cols)
    if n <= 1:
        return 1
    changed = np.zeros(n - 1, dtype=bool)
    for c in cols:
        if c.size > 1:
            changed |= c[1:] != c[:-1]
    return 1 + int(changed.sum())


def steps_of(grid: Sequence[int]) -> int:
    return math.prod(grid) if grid else 1
