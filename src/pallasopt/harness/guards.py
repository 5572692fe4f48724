"""Guards of the oracle against kernels that pass without computing the answer (docs/errors.md, "The oracle's guards").

`reference_disabled`: while kernel code runs, `reference` raises, under every name and in every copy of its code
(aliases, `types.FunctionType` clones, a saved `reference.__code__`). `inputs_problem`: the inputs must be real
random data: every float input changes with the key, is not constant and not all zeros.
"""

from __future__ import annotations

import gc
import itertools
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np


class ReferenceCalled(Exception):
    """Kernel code called `reference` while the oracle had it disabled."""


@dataclass
class ReferenceGuard:
    original: Callable[..., Any]  # the working reference, for the oracle's own calls
    calls: int = 0  # times kernel code called the disabled one


_TRIP = "_pallasopt_reference_disabled_"


def _tripping_code() -> types.CodeType:
    """A code object that calls `_TRIP` from the globals of the function it is put into."""
    ns: dict[str, Any] = {}
    exec(f"def reference(*args, **kwargs):\n    return {_TRIP}()\n", ns)
    code: types.CodeType = ns["reference"].__code__
    return code


def _holders_of(code: types.CodeType) -> tuple[list[types.FunctionType], list[dict[Any, Any]], list[Any]]:
    """Every live function running `code` (or an equal copy of it), and the dicts and cells that hold the code
    object itself (`_saved = reference.__code__`), found through the garbage collector's object graph."""
    funcs = [f for f in gc.get_objects() if isinstance(f, types.FunctionType) and f.__code__ == code]
    dicts: list[dict[Any, Any]] = []
    cells: list[Any] = []
    for holder in gc.get_referrers(code):
        if isinstance(holder, dict):
            dicts.append(holder)
        elif isinstance(holder, types.CellType):
            cells.append(holder)
    return funcs, dicts, cells


@contextmanager
def reference_disabled(module: types.ModuleType) -> Iterator[ReferenceGuard]:
    """Make `reference` raise `ReferenceCalled` for kernel code: an entry that returns (or peeks at) the reference's
    output cannot pass. The module attribute is replaced and, for a plain function, the code object of every function
    running that code (aliases, clones made with `types.FunctionType`) too; stored copies of the code object itself are
    swapped in dicts and cells. The oracle calls `guard.original`."""
    ref = module.reference
    guard = ReferenceGuard(original=ref)

    def trip(*_args: Any, **_kwargs: Any) -> Any:
        guard.calls += 1
        raise ReferenceCalled("the kernel called `reference`")

    swap = isinstance(ref, types.FunctionType) and not ref.__code__.co_freevars
    code = ref.__code__ if swap else None
    scopes: list[dict[str, Any]] = [module.__dict__]
    swapped: list[tuple[types.FunctionType, types.CodeType]] = []
    stored: list[tuple[Any, Any]] = []  # (dict or cell, key) holding the code object
    if swap and code is not None:
        copy = types.FunctionType(ref.__code__, ref.__globals__, ref.__name__, ref.__defaults__, ref.__closure__)
        copy.__kwdefaults__ = ref.__kwdefaults__
        guard.original = copy
        trip_code = _tripping_code()
        funcs, dicts, cells = _holders_of(code)
        for f in funcs:
            if f is copy or f.__code__.co_freevars:
                continue
            swapped.append((f, f.__code__))
            f.__code__ = trip_code
            if all(f.__globals__ is not s for s in scopes):
                scopes.append(f.__globals__)
        for d in dicts:
            for k, v in list(d.items()):
                if v is code:
                    stored.append((d, k))
                    d[k] = trip_code
        for c in cells:
            stored.append((c, None))
            c.cell_contents = trip_code
    for scope in scopes:
        scope[_TRIP] = trip
    setattr(module, "reference", trip)  # noqa: B010  (mypy: ModuleType has no attribute `reference`)
    try:
        yield guard
    finally:
        setattr(module, "reference", ref)  # noqa: B010
        for f, old in swapped:
            f.__code__ = old
        for holder, key in stored:
            if isinstance(holder, dict):
                holder[key] = code
            else:
                holder.cell_contents = code
        for scope in scopes:
            scope.pop(_TRIP, None)


def _floats(args: Sequence[np.ndarray]) -> list[tuple[int, np.ndarray]]:
    return [(i, a) for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating)]


def inputs_problem(per_seed: Sequence[tuple[int, Sequence[np.ndarray]]]) -> str:
    """'' when `make_inputs` gave real random data for every seed: each float input with more than one element is
    neither all zeros nor constant, and changes from seed to seed (integer inputs, often lengths or indices, may stay
    fixed, but some input must change). `per_seed`: (seed, input leaves) pairs."""
    for seed, args in per_seed:
        for i, a in _floats(args):
            if a.size > 1 and not np.any(a):
                return f"seed {seed}: input {i} is all zeros (a kernel that ignores it, or writes zeros, would pass)"
            flat = a.reshape(-1)
            if a.size > 1 and np.all(flat == flat[0]):
                return (
                    f"seed {seed}: input {i} is constant ({float(flat[0]):g} everywhere): use jax.random from the key"
                )
    for (s0, a0), (s1, a1) in itertools.pairwise(per_seed):
        for i, (x, y) in enumerate(zip(a0, a1, strict=True)):
            if x.size > 1 and jnp.issubdtype(x.dtype, jnp.floating) and np.array_equal(x, y, equal_nan=True):
                return (
                    f"input {i} is the same for seeds {s0} and {s1}: make_inputs must draw every float input from "
                    "its key"
                )
        if all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a0, a1, strict=True)):
            return f"make_inputs gives the same inputs for seeds {s0} and {s1}: it must use its key"
    return ""


def extend_seeds(seeds: Sequence[int], at_least: int = 3) -> tuple[int, ...]:
    """`seeds` without repeats, extended with fresh ones (max + 101, ...) to at least `at_least` distinct seeds."""
    out = list(dict.fromkeys(int(s) for s in seeds))
    while len(out) < at_least:
        out.append(max(out, default=0) + 101)
    return tuple(out)
