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
from ..harness.check_dims import derive_check_dims, input_shapes
from ..ir.trace import arg_structs, trace_calls
from ..workload import Workload, load_source

# Integers that configure the operation rather than size it (KernelBench's module-level kernel_size, stride,
# padding...): shrinking them changes what is computed (a 1-wide max pool over padding), so the check keeps them.
HYPERPARAMETER = re.compile(r"kernel_size|stride|padding|dilation|groups|axis|reduce_dim")
FLOOR = 128  # one TPU lane row: the smallest size at which a dim still exercises a (8, 128)-tiled block
MAX_TRIES = 8  # divisor candidates tried per dim (each costs a trace and a TPU lowering)
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
    settings = _settings(workload)
    dims = _floored(workload, {k: workload.dims[k] if k in settings else v for k, v in derived.items()})
    if at_default:
        # The kernel does not lower for TPU even at its own size (e.g. an unsupported op): the check runs in
        # interpret mode all the same; only the interpreter's constraints apply to the derived dims.
        return _changed(dims, workload.dims)
    while lowers_for_tpu(workload, dims):
        grown = _grow(dims, workload.dims)
        if grown == dims:
            raise KernelError(f"no check dims lower for TPU: {lowers_for_tpu(workload, dims)}", path=path)
        dims = grown
    return _changed(_shrunk(workload, dims, floor=True), workload.dims)


def full_size_note(text: str, path: str, dims: Mapping[str, int] | None) -> str:
    """A note for an import whose check runs at the task's own dims (`dims` None: no smaller ones were found) and
    whose inputs are bigger than the oracle's budget: the check will be slow or run out of memory, and why."""
    if dims is not None:
        return ""
    workload = load_source(text, path)
    biggest = max((math.prod(s) for s in input_shapes(workload, workload.dims)), default=0)
    if biggest <= BUDGET:
        return ""
    return (
        f"the CPU check runs at the task's own dims {dict(workload.dims)} (an input of {biggest:,} elements: slow, "
        "and it may run out of memory): no smaller dims keep the kernel and the reference tracing with the same "
        "grid (a size the task fixes outside its named dims?); set CHECK_DIMS by hand where some do"
    )


def _settings(workload: Workload) -> set[str]:
    """Dims the check keeps at their defaults: the names of operation settings (HYPERPARAMETER), and any dim that
    changes no input's shape (KernelBench's `scale`, `add_value`-like ints): shrinking those saves nothing and
    changes what is computed, and an imported task cannot tell two such dims apart by the inputs' shapes."""
    base = input_shapes(workload, workload.dims)
    out = {k for k in workload.dims if HYPERPARAMETER.search(k)}
    for k, v in workload.dims.items():
        try:
            if input_shapes(workload, {**workload.dims, k: max(1, v // 2)}) == base:
                out.add(k)
        except Exception:
            continue  # a size that only works at its default drives something
    return out


def _accepted(workload: Workload, dims: dict[str, int]) -> bool:
    """The oracle takes `dims` as CHECK_DIMS (traces, covers, >= 2 grid steps per axis) and it lowers for TPU."""
    module = workload.module
    had, old = hasattr(module, "CHECK_DIMS"), getattr(module, "CHECK_DIMS", None)
    setattr(module, "CHECK_DIMS", dims)  # noqa: B010 (a module's attribute mypy cannot know)
    try:
        return derive_check_dims(workload) == dims and not lowers_for_tpu(workload, dims)
    except Exception:
        return False
    finally:
        if had:
            setattr(module, "CHECK_DIMS", old)  # noqa: B010
        else:
            del module.CHECK_DIMS


def _shrunk(workload: Workload, dims: dict[str, int], *, floor: bool) -> dict[str, int]:
    """Halving stops at a dim that is an odd multiple of its block (N = 7 x 2048 stays 14336): try the exact
    divisors of each such dim too (14336 / 7 = 2048 x 1 fails the two-step rule, 14336 / 3.5 is not whole, but
    4096 = 2 x 2048 is 14336 x 2 / 7), smallest accepted first, largest dims first. A dim with no such fraction (a
    prime-ish N = 5921 = 31 x 191, which a wrapper pads to its blocks) tries powers of two from FLOOR instead: the
    oracle's own rules (`_accepted`) turn down any the kernel cannot take."""
    out = dict(dims)
    default = workload.dims
    if max((math.prod(s) for s in _shapes(workload, out)), default=0) <= BUDGET // 16:
        return out  # already as small as the oracle's own derivation aims for
    for k in sorted(out, key=lambda k: -out[k]):
        v = out[k]
        if v < 2 * FLOOR or HYPERPARAMETER.search(k):
            continue
        options = sorted({v * a // b for b in range(2, 17) for a in range(1, b) if (v * a) % b == 0})
        lowest = min(default[k], FLOOR) if floor else 1
        if not any(lowest <= c < v for c in options):
            options = [FLOOR << i for i in range(v.bit_length()) if FLOOR << i < v]
        for cand in [c for c in options if lowest <= c < v][:MAX_TRIES]:
            trial = {**out, k: cand}
            if _accepted(workload, trial):
                out = trial
                break
    return out


def _shapes(workload: Workload, dims: Mapping[str, int]) -> list[tuple[int, ...]]:
    """Shapes of the entry's inputs and of every pallas_call operand at `dims`."""
    return [*input_shapes(workload, dims), *(tuple(o.shape) for c in trace_calls(workload, dims) for o in c.operands)]


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
