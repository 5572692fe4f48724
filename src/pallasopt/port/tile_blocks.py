"""Block pointers in 2-D tile kernels (tiles.py): `tl.make_block_ptr`, `tl.advance`, `boundary_check` masks."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from .affine import IndexEnv, affine
from .exprs import Declined, call_arg, tl_name
from .source import code
from .tile_index import GRID, Axis, norm


@dataclass
class Ptr:
    """A pointer (or block pointer) into one argument: its two axes and how the K loop moves it."""

    param: str
    rows: Axis
    cols: Axis
    advance: int | None = None  # which axis the K loop advances (set on the loop's pointer increments)
    advanced_at: int = 0  # position in the loop body of the increment
    shape: tuple[str, str] | None = None  # a block pointer's `shape=` (for boundary_check)


def block_ptr(call: cst.Call, env: IndexEnv, pointers: frozenset[str], line: int) -> Ptr:
    """`tl.make_block_ptr(base, shape, strides, offsets, block_shape, order)`: each offset `tile * BLOCK` or 0."""
    names = ("base", "shape", "strides", "offsets", "block_shape")
    args = [call_arg(call, i, n) for i, n in enumerate(names)]
    base = args[0]
    if not (isinstance(base, cst.Name) and base.value in pointers):
        raise Declined(line, "tl.make_block_ptr on something other than a kernel argument")
    pairs = []
    for n, a in zip(names[1:], args[1:], strict=True):
        if not (isinstance(a, cst.Tuple) and len(a.elements) == 2):
            raise Declined(line, f"tl.make_block_ptr with a {n}= that is not a 2-tuple (2-D blocks only)")
        pairs.append(tuple(e.value for e in a.elements))
    shape, strides, offsets, block = pairs
    axes = []
    for d in (0, 1):
        size, off = code(block[d]), affine(offsets[d], env)
        if off is None or off.aranges() or off.const not in (None, "0") or len(off.terms) > 1:
            raise Declined(line, f"block pointer offset '{code(offsets[d])}' is not `tile * BLOCK` or 0")
        tile = off.terms[0] if off.terms else None
        if tile is not None and (not tile[0].startswith("t:") or norm(tile[1]) != norm(size)):
            raise Declined(line, f"block pointer offset '{code(offsets[d])}' does not move by '{size}'")
        axes.append(Axis(size, tile[0] if tile else None, code(strides[d])))
    return Ptr(base.value, axes[0], axes[1], shape=(code(shape[0]), code(shape[1])))


def boundary_dims(call: cst.Call, p: Ptr, pos: int, line: int) -> tuple[int, ...]:
    arg = call_arg(call, pos, "boundary_check")
    if arg is None:
        return ()
    if p.shape is None:
        raise Declined(line, "boundary_check on a pointer that is not a tl.make_block_ptr")
    dims = (
        tuple(int(e.value.value) for e in arg.elements if isinstance(e.value, cst.Integer))
        if isinstance(arg, (cst.Tuple, cst.List))
        else None
    )
    if dims is None or not set(dims) <= {0, 1}:
        raise Declined(line, f"boundary_check={code(arg)} is not a tuple of axes 0 and 1")
    return dims


def boundary_mask(dims: tuple[int, ...], rows: Axis, cols: Axis, shape: tuple[str, str]) -> str:
    parts = []
    for d in dims:
        a = (rows, cols)[d]
        start = {None: "0", "iter": f"{GRID[2]}"}.get(a.tile, a.tile[2:] if a.tile else "0")
        iota = f"jax.lax.broadcasted_iota(jnp.int32, {'(SIZE, 1)' if d == 0 else '(1, SIZE)'}, {d})".replace(
            "SIZE", a.size
        )
        parts.append(f"({start} * ({a.size}) + {iota} < ({shape[d]}))")
    return " & ".join(parts)


def block_advance(small: cst.BaseSmallStatement, i: int, ptrs: dict[str, Ptr], line: int) -> bool:
    """`bp = tl.advance(bp, (0, BLOCK_K))`: the block pointer steps one block along one untiled axis."""
    if not (isinstance(small, cst.Assign) and isinstance(small.value, cst.Call)):
        return False
    if tl_name(small.value.func) != "advance":
        return False
    target, src, step = (
        small.targets[0].target,
        call_arg(small.value, 0, "base"),
        call_arg(small.value, 1, "offsets"),
    )
    p = ptrs.get(src.value) if isinstance(src, cst.Name) else None
    if p is None or p.shape is None or not isinstance(target, cst.Name) or target.value != src.value:  # type: ignore[union-attr]
        raise Declined(line, "tl.advance must step a block pointer in place (`bp = tl.advance(bp, ...)`)")
    if not (isinstance(step, cst.Tuple) and len(step.elements) == 2):
        raise Declined(line, "tl.advance needs a 2-tuple of steps")
    moves = [d for d, e in enumerate(step.elements) if code(e.value) != "0"]
    axes = (p.rows, p.cols)
    if (
        len(moves) != 1
        or axes[moves[0]].tile is not None
        or norm(code(step.elements[moves[0]].value)) != norm(axes[moves[0]].size)
    ):
        raise Declined(line, f"tl.advance by {code(step)} is not one block along one untiled axis")
    p.advance, p.advanced_at = moves[0], i
    return True
