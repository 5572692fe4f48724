"""CHECK_DIMS for an imported task: small enough for the CPU interpreter, still a faithful stand-in.

The oracle's own derivation (`harness.check_dims.derive_check_dims`: halve the dims while the kernel traces, keeps
>= 2 grid steps per axis and covers its outputs) can shrink a dim below what a TPU block allows (a head_dim of 4
where the kernel needs 128 lanes): tracing accepts it, the TPU lowering does not. Here every candidate must also
lower for TPU, and a dim that does not is given back (doubled towards its default) until it does. No dim is left
below `FLOOR` (or its default, if smaller) where it sizes an array's last (lane) axis and the arrays stay under
`BUDGET` elements: a reduction of length 1 or a 4-wide head checks nothing a real size does, while a batch of 64
images of 128x128 costs minutes to interpret.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import jax

from ..errors import KernelError, short
from ..harness.check_dims import derive_check_dims
from ..ir.trace import arg_structs, trace_calls
from ..workload import Workload, load_source

# Integers that configure the operation rather than size it (KernelBench's module-level kernel_size, stride,
# padding...): shrinking them changes what is computed (a 1-wide max pool over padding), so the check keeps them.
HYPERPARAMETER = re.compile(r"kernel_size|stride|padding|dilation|groups|axis|reduce_dim")
FLOOR = 128  # one TPU lane row: the smallest size at which a dim still exercises a (8, 128)-tiled block
BUDGET = 1 << 20  # the largest operand (elements) flooring may leave; FACTS.md: interpret cost grows with it


def lowers_for_tpu(workload: Workload, dims: Mapping[str, int]) -> str:
    """'' when the entry lowers for TPU at `dims` (no compile, no TPU needed), else why not."""
    try:
        structs = arg_structs(workload, dict(dims))
        jax.jit(workload.entry).trace(*structs).lower(lowering_platforms=("tpu",))
    except Exception as e:
        return f"{type(e).__name__}: {short(e, 200)}"
    return ""


def import_check_dims(text: str, path: str) -> dict[str, int] | None:
    """Check dims for the module `text` (labelled `path`): None when the defaults are already small."""
    workload = load_source(text, path)
    at_default = lowers_for_tpu(workload, workload.dims)
    derived = derive_check_dims(workload)
    dims = _floored(workload, {k: workload.dims[k] if HYPERPARAMETER.search(k) else v for k, v in derived.items()})
    if at_default:
        # The kernel does not lower for TPU even at its own size (e.g. an unsupported op): the check runs in
        # interpret mode all the same; only the interpreter's constraints apply to the derived dims.
        return _changed(dims, workload.dims)
    while lowers_for_tpu(workload, dims):
        grown = _grow(dims, workload.dims)
        if grown == dims:
            raise KernelError(f"no check dims lower for TPU: {lowers_for_tpu(workload, dims)}", path=path)
        dims = grown
    return _changed(dims, workload.dims)


def _shapes(workload: Workload, dims: Mapping[str, int]) -> list[tuple[int, ...]]:
    """Shapes of the entry's inputs and of every pallas_call operand at `dims`."""
    inputs = [tuple(getattr(a, "shape", ())) for a in arg_structs(workload, dict(dims))]
    return inputs + [tuple(o.shape) for c in trace_calls(workload, dims) for o in c.operands]


def _lanes(shapes: list[tuple[int, ...]]) -> list[int]:
    return [s[-1] for s in shapes if s]


def _floored(workload: Workload, dims: Mapping[str, int]) -> dict[str, int]:
    """Lane dims (those that size some array's last axis) below min(default, FLOOR) doubled back towards it,
    smallest first, while no array grows past BUDGET elements. A batch or row count stays as derived."""
    out = {k: int(v) for k, v in dims.items()}
    default = workload.dims
    for k in sorted(out, key=lambda k: out[k]):
        while 0 < out[k] < min(default[k], FLOOR):
            trial = {**out, k: min(default[k], out[k] * 2)}
            try:
                before, after = _shapes(workload, out), _shapes(workload, trial)
            except Exception:
                break
            if _lanes(before) == _lanes(after) or max(math.prod(s) for s in after) > BUDGET:
                break
            out = trial
    return out


def _grow(dims: dict[str, int], default: Mapping[str, int]) -> dict[str, int]:
    """Double every dim that was shrunk furthest below its default (ties grow together)."""
    ratios = {k: default[k] / v for k, v in dims.items() if v and v < default[k]}
    if not ratios:
        return dims
    worst = max(ratios.values())
    return {k: min(default[k], v * 2) if ratios.get(k) == worst else v for k, v in dims.items()}


def _changed(dims: Mapping[str, Any], default: Mapping[str, int]) -> dict[str, int] | None:
    small = {k: int(v) for k, v in dims.items()}
    return small if small != dict(default) else None
