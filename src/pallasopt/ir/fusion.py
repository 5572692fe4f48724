"""How two pallas_calls line up for fusion: which call reads a producer's output, and how their grids and blocks
correspond (read from the traced facts and the entry's jaxpr; nothing is rewritten here)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import KernelError, PassNotApplicable, check
from .facts import CallFacts
from .kernel_ir import KernelIR
from .trace import enclosing_jaxpr, find_pallas_call_chains, trace_entry


@dataclass(frozen=True)
class Link:
    """How consumer `consumer` reads producer `producer`'s only output: as its input `operand`, with consumer grid
    axis c walking the producer's axis `sigma[c]`; `inner` are the producer's reduction axes (they go innermost)."""

    producer: CallFacts
    consumer: CallFacts
    operand: int
    sigma: tuple[int, ...]
    inner: tuple[int, ...]
    reblock: bool = False  # an elementwise consumer adopts the producer's blocks (and grid extents)

    @property
    def order(self) -> tuple[int, ...]:
        """The fused grid in producer axes: the consumer's order, then the producer's reductions."""
        return (*self.sigma, *self.inner)


def unit_row(row: Sequence[int]) -> int | bool | None:
    """The grid axis an affine index-map row walks with stride 1 (None: constant 0; False: anything else)."""
    coefs, const = row[:-1], row[-1]
    nonzero = [a for a, c in enumerate(coefs) if c != 0]
    if not nonzero:
        return None if const == 0 else False
    if len(nonzero) == 1 and coefs[nonzero[0]] == 1 and const == 0:
        return nonzero[0]
    return False


def plain_call(call: CallFacts, who: str) -> None:
    check(call.library_site is None, f"the {who} is a library kernel")
    check(call.num_scalar_prefetch == 0, f"the {who} uses scalar prefetch")
    check(not call.body.has_dma and not call.body.has_semaphore, f"the {who} does manual DMA")
    check(not call.input_output_aliases, f"the {who} aliases an input to an output")
    check(not call.dynamic_axes, f"the {who} has a grid extent known only at run time")
    for o in call.operands:
        check(o.is_pipelined, f"the {who}'s {o.name} is not a blocked VMEM operand")
        check(o.index_map.affine is not None, f"the {who}'s {o.name} index map is not affine")


def dataflow(ir: KernelIR, producer: int) -> tuple[int, int]:
    """(consumer call, its operand) reading the producer's only output, when that output feeds one later call
    directly and nothing else (no other call, wrapper op or result reads it)."""
    check(ir.workload is not None, "the kernel module is not loaded")
    assert ir.workload is not None
    top = trace_entry(ir.workload).jaxpr
    chains = find_pallas_call_chains(top)
    jaxpr = enclosing_jaxpr(top, chains[producer])
    check(jaxpr is not None, "the producer's enclosing jaxpr was not found")
    p_eqn = chains[producer][-1]
    check(len(p_eqn.outvars) == 1, "the producer has several outputs")
    out = p_eqn.outvars[0]
    readers = [e for e in jaxpr.eqns if any(v is out for v in e.invars)]
    check(all(v is not out for v in jaxpr.outvars), "the producer's output is also a result (it must reach HBM)")
    check(len(readers) == 1, f"the producer's output is read by {len(readers)} operations, not one pallas_call")
    consumer = next((i for i, ch in enumerate(chains) if ch[-1] is readers[0]), None)
    check(consumer is not None, "the producer's output is read by a wrapper op, not a pallas_call")
    assert consumer is not None
    uses = [k for k, v in enumerate(readers[0].invars) if v is out]
    check(len(uses) == 1, "the consumer reads the producer's output twice")
    return consumer, uses[0]


def pair_axes(
    rows: Sequence[tuple[Sequence[int], Sequence[int]]], c_grid: Sequence[int], p_grid: Sequence[int]
) -> dict[int, int]:
    """Consumer grid axis -> producer grid axis, from the index-map rows of the block they share. An axis with one
    step traces as a constant row; it pairs with the one row left over on the other side."""
    sigma: dict[int, int] = {}
    c_left: list[int] = []
    p_left: list[int] = []
    for d, (rc, rp) in enumerate(rows):
        ac, ap = unit_row(rc), unit_row(rp)
        check(ac is not False and ap is not False, f"block dim {d} is not indexed by one grid axis with stride 1")
        if isinstance(ac, int) and isinstance(ap, int):
            check(sigma.get(ac, ap) == ap, f"consumer axis {ac} walks two producer axes")
            sigma[ac] = ap
        elif isinstance(ap, int):
            p_left.append(ap)
        elif isinstance(ac, int):
            c_left.append(ac)
    c_free = [a for a in range(len(c_grid)) if a not in sigma and a not in c_left and c_grid[a] == 1]
    p_free = [a for a in range(len(p_grid)) if a not in sigma.values() and a not in p_left and p_grid[a] == 1]
    if len(p_left) == 1 and len(c_free) == 1:
        sigma[c_free[0]] = p_left.pop()
    if len(c_left) == 1 and len(p_free) == 1:
        sigma[c_left.pop()] = p_free[0]
    check(not p_left and not c_left, "a block dim walks a grid axis in one call only")
    return sigma


def link(ir: KernelIR, producer: int) -> Link:
    """Check that call `producer` and the call reading its output fuse, and how their grids line up (declines with
    the reason)."""
    check(0 <= producer < len(ir.calls) - 1, f"no pallas_call #{producer} followed by another")
    p = ir.calls[producer]
    plain_call(p, "producer")
    check(len(p.outputs) == 1, "the producer has several outputs")
    consumer, operand = dataflow(ir, producer)
    c = ir.calls[consumer]
    plain_call(c, "consumer")
    h, out = c.inputs[operand], p.outputs[0]
    reblock = h.block_shape != out.block_shape
    if reblock:
        why = not_elementwise(c, operand)
        check(
            why is None,
            f"the consumer reads blocks {h.block_shape} of the producer's {out.block_shape} blocks and {why}: "
            "tile them alike first",
        )
    assert h.index_map.affine is not None and out.index_map.affine is not None
    sigma = pair_axes(list(zip(h.index_map.affine, out.index_map.affine, strict=True)), c.grid, p.grid)
    check(len(sigma) == len(c.grid), "a consumer grid axis does not walk the producer's output")
    check(len(set(sigma.values())) == len(sigma), "two consumer axes walk one producer axis")
    for a, b in sigma.items():
        check(
            reblock or c.grid[a] == p.grid[b],
            f"consumer axis {a} has {c.grid[a]} steps, producer axis {b} has {p.grid[b]}",
        )
    inner = tuple(a for a in range(len(p.grid)) if a not in sigma.values())
    return Link(p, c, operand, tuple(sigma[a] for a in range(len(c.grid))), inner, reblock)


# Primitives whose result at an element depends only on the operands at that element: a body made of these alone
# computes the same values whatever block it is given. `get`/`swap` are the ref reads and writes.
ELEMENTWISE = frozenset(
    [
        "abs",
        "add",
        "and",
        "atan2",
        "broadcast_in_dim",
        "cbrt",
        "ceil",
        "clamp",
        "convert_element_type",
        "copy",
        "cos",
        "div",
        "eq",
        "erf",
        "erf_inv",
        "exp",
        "exp2",
        "expm1",
        "floor",
        "ge",
        "get",
        "gt",
        "integer_pow",
        "le",
        "log",
        "log1p",
        "logistic",
        "lt",
        "max",
        "min",
        "mul",
        "ne",
        "neg",
        "not",
        "or",
        "pow",
        "rem",
        "round",
        "rsqrt",
        "select_n",
        "sign",
        "sin",
        "sqrt",
        "square",
        "sub",
        "swap",
        "tan",
        "tanh",
        "xor",
    ]
)


def not_elementwise(c: CallFacts, operand: int) -> str | None:
    """Why consumer `c` cannot run on blocks of another shape (None: it is elementwise and can)."""
    h = c.inputs[operand]
    other = sorted(set(c.body.primitives) - ELEMENTWISE)
    if other:
        return f"its body is not elementwise ({', '.join(other)})"
    if c.scratch or c.body.program_id_axes:
        return "it uses scratch or program_id"
    for o in c.operands:
        if (o.shape, o.block_shape, o.index_map.affine) != (h.shape, h.block_shape, h.index_map.affine):
            return f"its {o.name} is not blocked like the producer's output"
    return None


def fusable(ir: KernelIR, producer: int) -> str | None:
    """Why call `producer` does not fuse with its consumer (None: it does)."""
    try:
        link(ir, producer)
    except PassNotApplicable as e:
        return e.reason
    except KernelError as e:
        return e.message
    return None
