"""How two pallas_calls line up for fusion: which call reads a producer's output, and how their grids and blocks
correspond (read from the traced facts and the entry's jaxpr; nothing is rewritten here)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import KernelError, PassNotApplicable, check
from .facts import CallFacts, Operand
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
    # The consumer reads the output through a wrapper reshape to rows (`y.reshape(rows, C)`) of this shape: its
    # elementwise body runs on the producer's blocks, its per-column rows (1, C) follow the blocks' last dim.
    reshaped: tuple[int, ...] | None = None
    # Producer reduction axes the consumer walks with an axis of its own over other arrays (a row-norm kernel, then
    # one that re-reads the rows and scales them): the fused call gives each one step over the whole dim, every block
    # along it spanning its array (`whole_axes`), so the consumer runs on finished statistics at every size.
    whole: tuple[int, ...] = ()

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


@dataclass(frozen=True)
class Flow:
    """Consumer call `consumer` reads the producer's only output as its input `operand`, directly or through one
    wrapper reshape to `reshaped` (merging leading dims, the last dim kept)."""

    consumer: int
    operand: int
    reshaped: tuple[int, ...] | None = None


def dataflow(ir: KernelIR, producer: int) -> Flow:
    """How one later call reads the producer's only output: directly, or through a wrapper reshape that merges the
    leading dims and keeps the last (nothing else, no other call, wrapper op or result reads it)."""
    check(ir.workload is not None, "the kernel module is not loaded")
    assert ir.workload is not None
    top = trace_entry(ir.workload).jaxpr
    chains = find_pallas_call_chains(top)
    jaxpr = enclosing_jaxpr(top, chains[producer])
    check(jaxpr is not None, "the producer's enclosing jaxpr was not found")
    p_eqn = chains[producer][-1]
    check(len(p_eqn.outvars) == 1, "the producer has several outputs")
    out = p_eqn.outvars[0]
    reshaped: tuple[int, ...] | None = None
    readers = _readers(jaxpr, out)
    if len(readers) == 1 and readers[0].primitive.name == "reshape":
        old, new = tuple(out.aval.shape), tuple(readers[0].outvars[0].aval.shape)
        check(
            readers[0].params.get("dimensions") is None and len(new) == 2 and len(old) > 2 and new[-1] == old[-1],
            f"the producer's output is reshaped {old} -> {new} (only a merge of leading dims to rows follows it)",
        )
        out, reshaped = readers[0].outvars[0], new
        readers = _readers(jaxpr, out)
    consumer = next((i for i, ch in enumerate(chains) if len(readers) == 1 and ch[-1] is readers[0]), None)
    check(consumer is not None or len(readers) != 1, "the producer's output is read by a wrapper op, not a pallas_call")
    check(len(readers) == 1, f"the producer's output is read by {len(readers)} operations, not one pallas_call")
    assert consumer is not None
    uses = [k for k, v in enumerate(readers[0].invars) if v is out]
    check(len(uses) == 1, "the consumer reads the producer's output twice")
    return Flow(consumer, uses[0], reshaped)


def _readers(jaxpr: Any, var: Any) -> list[Any]:
    """The equations reading `var` (declines when it is also a result: it must reach HBM)."""
    check(all(v is not var for v in jaxpr.outvars), "the producer's output is also a result (it must reach HBM)")
    return [e for e in jaxpr.eqns if any(v is var for v in e.invars)]


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
    flow = dataflow(ir, producer)
    c = ir.calls[flow.consumer]
    plain_call(c, "consumer")
    h, out = c.inputs[flow.operand], p.outputs[0]
    if flow.reshaped is not None:
        return _reshaped_link(p, c, flow)
    reblock = h.block_shape != out.block_shape
    if reblock:
        why = not_elementwise(c, flow.operand, rows_ok=True)
        check(
            why is None,
            f"the consumer reads blocks {h.block_shape} of the producer's {out.block_shape} blocks and {why}: "
            "tile them alike first",
        )
    assert h.index_map.affine is not None and out.index_map.affine is not None
    sigma = pair_axes(list(zip(h.index_map.affine, out.index_map.affine, strict=True)), c.grid, p.grid)
    whole: tuple[int, ...] = ()
    if len(sigma) < len(c.grid) and not reblock:
        sigma, whole = whole_axes(p, c, sigma)
    check(len(sigma) == len(c.grid), "a consumer grid axis does not walk the producer's output")
    check(len(set(sigma.values())) == len(sigma), "two consumer axes walk one producer axis")
    for a, b in sigma.items():
        check(
            reblock or c.grid[a] == p.grid[b],
            f"consumer axis {a} has {c.grid[a]} steps, producer axis {b} has {p.grid[b]}",
        )
    inner = tuple(a for a in range(len(p.grid)) if a not in sigma.values())
    return Link(p, c, flow.operand, tuple(sigma[a] for a in range(len(c.grid))), inner, reblock, whole=whole)


def whole_axes(p: CallFacts, c: CallFacts, sigma: dict[int, int]) -> tuple[dict[int, int], tuple[int, ...]]:
    """Pair the one consumer axis that does not walk the producer's output with the producer's one reduction axis,
    when both would take one step over the whole dim (`walks_whole`): `sigma` with that pair, and the producer axis.
    Both calls walk other arrays along them (the rows a norm reduces and the rows the consumer scales): the consumer
    needs every step of the reduction before its first, which only one whole step gives. Declines otherwise."""
    c_left = [a for a in range(len(c.grid)) if a not in sigma]
    p_left = [a for a in range(len(p.grid)) if a not in sigma.values()]
    check(
        len(c_left) == 1 and len(p_left) == 1,
        "a consumer grid axis does not walk the producer's output (and no single reduction axis pairs with it)",
    )
    for call, axis, who in ((p, p_left[0], "producer"), (c, c_left[0], "consumer")):
        why = walks_whole(call, axis)
        check(why is None, f"the {who}'s grid axis {axis} does not walk the producer's output, and {why}")
    return {**sigma, c_left[0]: p_left[0]}, (p_left[0],)


def walks_whole(call: CallFacts, axis: int) -> str | None:
    """Why grid `axis` of `call` cannot become one step over whole dims (None: it can): every block the axis moves
    is moved along one dim with stride 1 and not squeezed, and some input moves along it (its array gives the dim's
    size in the wrapper)."""
    inputs = 0
    for o in call.operands:
        assert o.index_map.affine is not None
        for d, row in enumerate(o.index_map.affine):
            if row[axis] == 0:
                continue
            walked = unit_row(row)
            if walked is False or walked != axis or o.block_shape[d] is None:  # False == 0 in Python
                return f"its {o.name} block dim {d} is not indexed by that axis alone with stride 1"
            inputs += o.role == "in"
    return None if inputs else "no input walks it"


def _reshaped_link(p: CallFacts, c: CallFacts, flow: Flow) -> Link:
    """The link of an elementwise consumer reading the producer's output reshaped to rows: it runs on the producer's
    blocks, over the producer's grid with the axes the output walks outermost (in their order) and the others (its
    reductions) innermost."""
    why = not_elementwise(c, flow.operand, rows_ok=True)
    check(why is None, f"the consumer reads the producer's output reshaped to {flow.reshaped} and {why}")
    h = c.inputs[flow.operand]
    others = [o.name for o in c.inputs if o is not h and not is_column_row(o, h)]
    check(not others, f"the consumer's {', '.join(others)} are read in rows too: only (1, C) rows follow a reshape")
    check(len(c.outputs) == 1, "the consumer has several outputs")
    out = p.outputs[0]
    assert out.index_map.affine is not None
    check(out.block_shape[-1] is not None, "the producer's output block squeezes its last dim")
    walked: list[int] = []
    for d, row in enumerate(out.index_map.affine):
        axis = unit_row(row)
        check(axis is not False, f"the producer's output block dim {d} is not indexed by one axis with stride 1")
        if isinstance(axis, int) and axis not in walked:
            walked.append(axis)
    inner = tuple(a for a in range(len(p.grid)) if a not in walked)
    return Link(p, c, flow.operand, tuple(walked), inner, reblock=True, reshaped=flow.reshaped)


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


def not_elementwise(c: CallFacts, operand: int, rows_ok: bool = False) -> str | None:
    """Why consumer `c` cannot run on blocks of another shape (None: it is elementwise and can). With `rows_ok`, an
    operand may also be a per-column row (`is_column_row`): it then follows the blocks' last dim."""
    h = c.inputs[operand]
    other = sorted(set(c.body.primitives) - ELEMENTWISE)
    if other:
        return f"its body is not elementwise ({', '.join(other)})"
    if c.scratch or c.body.program_id_axes:
        return "it uses scratch or program_id"
    for o in c.operands:
        if blocked_like(o, h):
            continue
        if rows_ok and o.role == "in" and is_column_row(o, h):
            continue
        return f"its {o.name} is not blocked like the producer's output"
    return None


def blocked_like(o: Operand, h: Operand) -> bool:
    """`o` has `h`'s shape, blocks and index map."""
    return (o.shape, o.block_shape, o.index_map.affine) == (h.shape, h.block_shape, h.index_map.affine)


def is_column_row(o: Operand, h: Operand) -> bool:
    """`o` is a (1, C) row read beside (rows, C) blocks of `h`: block (1, b) walking C as `h`'s last dim does, or
    the whole row; a body broadcasting it against `h`'s blocks computes the same values against blocks of any
    shape ending in the same columns."""
    if len(o.shape) != 2 or len(h.shape) != 2 or o.shape != (1, h.shape[-1]) or o.index_map.affine is None:
        return False
    assert h.index_map.affine is not None
    row0, row1 = o.index_map.affine
    same_cols = o.block_shape[1] == h.block_shape[1] and tuple(row1) == tuple(h.index_map.affine[1])
    whole = o.block_shape[1] == o.shape[1] and not any(row1)
    return o.block_shape[0] == 1 and not any(row0) and (same_cols or whole)


def fusable(ir: KernelIR, producer: int) -> str | None:
    """Why call `producer` does not fuse with its consumer (None: it does)."""
    try:
        link(ir, producer)
    except PassNotApplicable as e:
        return e.reason
    except KernelError as e:
        return e.message
    return None
