"""What the plain-XLA ops of a kernel module's wrapper cost: the HBM traffic of the data-movement ops around its
pallas_calls (a transpose, a pad or a layout-changing reshape that a layout rewrite adds, or that was already there)
and of its elementwise work (a bias add or activation after a call: one XLA fusion that reads its inputs and writes
its results once).

The pallas_call roofline (roofline.py) sees only the calls; a rewrite that moves work into the wrapper (pre-
transposing an operand once instead of in every grid step) must pay for it here, or the search would see a free
lunch. Time = bytes read + written / HBM bandwidth, the figure XLA's own cost analysis gives for such ops on TPU
(FACTS.md: `optimal_seconds` of XLA ops is bytes / (0.9 x 820 GB/s) on v5e; we use the chip table's bandwidth).

The wrapper's other XLA ops (a matmul, a convolution, a reduction or a window done in plain JAX around the calls)
are libtpu's to schedule with the entry; where its profile cannot (`search/tiers.kernels_alone_reason`) `xla_rest`
prices them by their FLOPs and bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..ir.facts import dtype_bytes
from ..ir.kernel_ir import KernelIR
from .hardware import Chip

# Ops that copy their operand through HBM. A reshape is a copy on TPU only when it changes the minor dim (the tiled
# layout moves).
MOVES = frozenset({"transpose", "pad", "concatenate", "rev", "copy", "copy_p"})
# Elementwise primitives (and the broadcasts that feed them): XLA fuses a connected group of them into one kernel
# that reads the group's inputs from HBM and writes the results read outside it, each once.
ELEMENTWISE = frozenset(
    [
        "add",
        "sub",
        "mul",
        "div",
        "rem",
        "pow",
        "integer_pow",
        "max",
        "min",
        "neg",
        "abs",
        "sign",
        "exp",
        "exp2",
        "log",
        "log1p",
        "expm1",
        "tanh",
        "logistic",
        "sqrt",
        "rsqrt",
        "cbrt",
        "erf",
        "erf_inv",
        "sin",
        "cos",
        "tan",
        "atan2",
        "floor",
        "ceil",
        "round",
        "square",
        "reciprocal",
        "select_n",
        "clamp",
        "convert_element_type",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "and",
        "or",
        "not",
        "xor",
        "broadcast_in_dim",
        "is_finite",
        "nextafter",
    ]
)
# Wrappers around elementwise work (`jax.nn.relu` traces as a custom_jvp_call, `jnp.clip` as a pjit).
CALLS = frozenset({"pjit", "jit", "custom_jvp_call", "custom_vjp_call", "closed_call"})


@dataclass(frozen=True)
class WrapperCost:
    """HBM bytes the wrapper's data-movement ops read and write, and the ops counted."""

    bytes: int
    ops: tuple[str, ...]

    def seconds(self, chip: Chip) -> float:
        return self.bytes / chip.delivered_hbm_bw_bytes_s


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


def inner_jaxprs(eqn: Any) -> list[Any]:
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


def _elementwise(eqn: Any) -> bool:
    name = eqn.primitive.name
    if name in ELEMENTWISE:
        return True
    if name in CALLS:
        subs = inner_jaxprs(eqn)
        return bool(subs) and all(_elementwise(e) for j in subs for e in j.eqns)
    return False


def _fusions(jaxpr: Any) -> tuple[int, int]:
    """HBM bytes of the jaxpr's elementwise fusions (connected groups of elementwise equations), and their count."""
    eqns = [e for e in jaxpr.eqns if _elementwise(e)]
    group = list(range(len(eqns)))

    def root(i: int) -> int:
        while group[i] != i:
            group[i] = group[group[i]]
            i = group[i]
        return i

    made = {id(v): i for i, e in enumerate(eqns) for v in e.outvars}
    for i, e in enumerate(eqns):
        for v in e.invars:
            if id(v) in made:
                group[root(i)] = root(made[id(v)])
    read_outside = {id(v) for e in jaxpr.eqns if not _elementwise(e) for v in e.invars}
    read_outside |= {id(v) for v in jaxpr.outvars}
    total, roots = 0, set()
    for g in {root(i) for i in range(len(eqns))}:
        members = [e for i, e in enumerate(eqns) if root(i) == g]
        inside = {id(v) for e in members for v in e.outvars}
        ins = {id(v): v for e in members for v in e.invars if hasattr(v, "aval") and id(v) not in inside}
        ins = {k: v for k, v in ins.items() if type(v).__name__ != "Literal"}
        outs = [v for e in members for v in e.outvars if id(v) in read_outside and bool(getattr(v.aval, "shape", None))]
        nbytes = sum(_nbytes(v.aval) for v in ins.values()) + sum(_nbytes(v.aval) for v in outs)
        if outs:  # a fusion of scalars only is folded into its user
            total += nbytes
            roots.add(g)
    return total, len(roots)


def wrapper_cost_of_jaxpr(jaxpr: Any) -> WrapperCost:
    """The data-movement ops and elementwise fusions of an entry's jaxpr, in nested jit/custom_vjp bodies too (a
    pallas_call's own kernel body is not looked into)."""
    fused, count = _fusions(jaxpr)
    total, ops = fused, ["elementwise-fusion"] * count
    for eqn in jaxpr.eqns:
        if _elementwise(eqn):
            continue  # counted with its fusion
        if _moves(eqn):
            total += sum(_nbytes(v.aval) for v in eqn.invars) + sum(_nbytes(v.aval) for v in eqn.outvars)
            ops.append(eqn.primitive.name)
        for sub in inner_jaxprs(eqn):
            inner = wrapper_cost_of_jaxpr(sub)
            total += inner.bytes
            ops.extend(inner.ops)
    return WrapperCost(total, tuple(ops))


_CACHE: dict[str, WrapperCost] = {}
_REST: dict[str, XlaRest] = {}  # `xla_rest` by source digest


def wrapper_cost(ir: KernelIR) -> WrapperCost:
    """The wrapper cost of a loaded kernel module (zero when it is not loaded in this process, e.g. untrusted
    source); cached by source digest. Ops whose results nothing uses are left out (`ir.body.live_jaxpr`): XLA does
    not run them."""
    if ir.workload is None:
        return WrapperCost(0, ())
    if ir.digest not in _CACHE:
        from ..ir.body import live_jaxpr
        from ..ir.trace import trace_entry

        _CACHE[ir.digest] = wrapper_cost_of_jaxpr(live_jaxpr(trace_entry(ir.workload)).jaxpr)
    return _CACHE[ir.digest]


# Wrapper ops that are neither data movement nor elementwise, nor free (shape bookkeeping): XLA runs each as its own
# kernel (a contraction, a reduction, a window, a gather). `wrapper_cost` leaves them out (libtpu's profile of the
# entry schedules them); `xla_rest` prices them where that profile is missing.
BOOKKEEPING = frozenset(
    {"reshape", "squeeze", "expand_dims", "broadcast_in_dim", "iota", "slice", "dynamic_slice", "split", "pallas_call"}
)


@dataclass(frozen=True)
class XlaRest:
    """The wrapper's other XLA ops (`xla_rest`): their FLOPs (2 per multiply-add of a contraction), HBM bytes
    (operands, each array once, and results) and names."""

    flops: float
    bytes: int
    ops: tuple[str, ...]

    @property
    def kinds(self) -> tuple[str, ...]:
        """The distinct op names, sorted (for messages)."""
        return tuple(sorted(set(self.ops)))

    def seconds(self, chip: Chip, dtype: Any = "bfloat16") -> float:
        """Their time on `chip`: FLOPs at the matmul peak for `dtype` or bytes at the delivered bandwidth,
        whichever is longer (per op; XLA's fusions can move fewer bytes)."""
        return max(self.flops / chip.device_peak_flops(dtype), self.bytes / chip.delivered_hbm_bw_bytes_s)


def _contraction_flops(eqn: Any) -> float:
    name = eqn.primitive.name
    out = math.prod(getattr(eqn.outvars[0].aval, "shape", ()) or (1,))
    if name == "dot_general":
        (lc, _), _ = eqn.params["dimension_numbers"]
        lhs = eqn.invars[0].aval.shape
        return 2.0 * out * math.prod(lhs[d] for d in lc)
    if name == "conv_general_dilated":
        rhs = eqn.invars[1].aval.shape
        spec = eqn.params["dimension_numbers"]
        o_dim = spec.rhs_spec[0] if spec is not None else 0
        # every output element: one multiply-add per kernel element of its group (input features x window)
        return 2.0 * out * math.prod(rhs) / rhs[o_dim]
    return 0.0


def xla_rest_of_jaxpr(jaxpr: Any) -> XlaRest:
    """The wrapper's XLA ops `wrapper_cost_of_jaxpr` does not count, in nested jit/custom_vjp bodies too. An array
    several of them read counts once (XLA fuses a layer norm's two reductions of one input into one pass)."""
    flops, nbytes, ops = 0.0, 0, list[str]()
    read: set[int] = set()
    for eqn in jaxpr.eqns:
        subs = inner_jaxprs(eqn)
        if subs:
            for sub in subs:
                inner = xla_rest_of_jaxpr(sub)
                flops, nbytes, ops = flops + inner.flops, nbytes + inner.bytes, [*ops, *inner.ops]
            continue
        name = eqn.primitive.name
        if _elementwise(eqn) or _moves(eqn) or name in BOOKKEEPING:
            continue
        flops += _contraction_flops(eqn)
        fresh = [v for v in eqn.invars if hasattr(v, "aval") and id(v) not in read]
        read |= {id(v) for v in fresh}
        nbytes += sum(_nbytes(v.aval) for v in (*fresh, *eqn.outvars))
        ops.append(name)
    return XlaRest(flops, nbytes, tuple(ops))


def xla_rest(ir: KernelIR) -> XlaRest:
    """`xla_rest_of_jaxpr` of a loaded kernel module's live entry (zero when it is not loaded in this process);
    cached by source digest."""
    if ir.workload is None:
        return XlaRest(0.0, 0, ())
    if ir.digest not in _REST:
        from ..ir.body import live_jaxpr
        from ..ir.trace import trace_entry

        _REST[ir.digest] = xla_rest_of_jaxpr(live_jaxpr(trace_entry(ir.workload)).jaxpr)
    return _REST[ir.digest]
