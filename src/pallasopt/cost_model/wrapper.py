"""What the plain-XLA ops of a kernel module's wrapper cost: the HBM traffic of the data-movement ops around its
pallas_calls (a transpose, a pad or a layout-changing reshape that a layout rewrite adds, or that was already there).

The pallas_call roofline (roofline.py) sees only the calls; a rewrite that moves work into the wrapper (pre-
transposing an operand once instead of in every grid step) must pay for it here, or the search would see a free
lunch. Time = bytes read + written / HBM bandwidth, the figure XLA's own cost analysis gives for such ops on TPU
(FACTS.md: `optimal_seconds` of XLA ops is bytes / (0.9 x 820 GB/s) on v5e; we use the chip table's bandwidth).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..ir.facts import dtype_bytes
from ..ir.kernel_ir import KernelIR
from .hardware import Chip

# Ops that copy their operand through HBM. A reshape is a copy on TPU only when it changes the minor dim (the tiled
# layout moves); elementwise ops are not counted here (they are the wrapper's own math, charged nowhere today).
MOVES = frozenset({"transpose", "pad", "concatenate", "rev", "copy", "copy_p"})


@dataclass(frozen=True)
class WrapperCost:
    """HBM bytes the wrapper's data-movement ops read and write, and the ops counted."""

    bytes: int
    ops: tuple[str, ...]

    def seconds(self, chip: Chip) -> float:
        return self.bytes / chip.device_hbm_bw_bytes_s


def _nbytes(aval: Any) -> int:
    shape = getattr(aval, "shape", None)
    if shape is None:
        return 0
    return math.prod(shape) * dtype_bytes(str(getattr(aval, "dtype", "float32")))


def _moves(eqn: Any) -> bool:
    name = eqn.primitive.name
    if name in MOVES:
        return True
    if name == "reshape":
        src, dst = eqn.invars[0].aval.shape, eqn.outvars[0].aval.shape
        return bool(src) and bool(dst) and src[-1] != dst[-1]
    return False


def _inner(eqn: Any) -> list[Any]:
    """The jaxprs a wrapper equation runs (`jnp.pad` traces as a `pjit` around `pad`); none for a pallas_call."""
    if eqn.primitive.name == "pallas_call":
        return []
    out = []
    for v in eqn.params.values():
        for item in v if isinstance(v, tuple | list) else (v,):
            j = getattr(item, "jaxpr", item)
            if hasattr(j, "eqns"):
                out.append(j)
    return out


def wrapper_cost_of_jaxpr(jaxpr: Any) -> WrapperCost:
    """The data-movement ops of an entry's jaxpr, in nested jit/custom_vjp bodies too (a pallas_call's own kernel
    body is not looked into)."""
    total, ops = 0, []
    for eqn in jaxpr.eqns:
        if _moves(eqn):
            total += sum(_nbytes(v.aval) for v in eqn.invars) + sum(_nbytes(v.aval) for v in eqn.outvars)
            ops.append(eqn.primitive.name)
        for sub in _inner(eqn):
            inner = wrapper_cost_of_jaxpr(sub)
            total += inner.bytes
            ops.extend(inner.ops)
    return WrapperCost(total, tuple(ops))


_CACHE: dict[str, WrapperCost] = {}


def wrapper_cost(ir: KernelIR) -> WrapperCost:
    """The wrapper cost of a loaded kernel module (zero when it is not loaded in this process, e.g. untrusted
    source); cached by source digest."""
    if ir.workload is None:
        return WrapperCost(0, ())
    if ir.digest not in _CACHE:
        from ..ir.trace import trace_entry

        _CACHE[ir.digest] = wrapper_cost_of_jaxpr(trace_entry(ir.workload).jaxpr)
    return _CACHE[ir.digest]
