"""The TPU pipelining rules for a pallas_call's grid, shared by the grid-order pass and the correctness oracle.

On a TPU the grid runs in row-major order and each output block lives in VMEM only while consecutive steps map to
it: it is written back to HBM when the block index changes and never read back. So every output block must be
visited in one consecutive run of steps (accumulation across steps only along the trailing axes the block does not
follow), and an axis along which an output block is revisited must be "arbitrary" (a "parallel" axis is split between
the TensorCores of v4/v5p chips, which would then write the same block). Interpret mode keeps whole arrays in memory
and accepts either mistake; JAX's TPU interpreter reports the first as "Revisited block ... of output 0".

`order_keeps_outputs_consecutive` judges a permutation from the traced axis dependences (cheap, for passes);
`output_visits` evaluates every output index map over the whole grid (exact, whatever the map's form; sampled above
`EXACT_STEPS` steps for maps that are not affine) and `pipelining_problem` turns that into a verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .facts import CallFacts, Operand

EXACT_STEPS = 16_384  # up to this many grid steps, every index map is evaluated at every step
AFFINE_STEPS = 1 << 22  # affine maps are evaluated in closed form (numpy) up to this many steps
SAMPLE = 4_096  # steps evaluated at each end and at random when a non-affine map's grid is larger


def order_keeps_outputs_consecutive(call: CallFacts, order: tuple[int, ...]) -> bool:
    """Every output block's visits stay consecutive under `order` (old axes, outermost first): the axes an output
    does not follow come after those it does, and axes whose program_id carries state (a `pl.when` reset) stay
    innermost. Judged from the traced dependences of the index maps, without evaluating them."""
    pos = {a: i for i, a in enumerate(order)}
    moving = [a for a in range(len(call.grid)) if call.grid[a] > 1]
    for o in call.outputs:
        follows = [a for a in moving if a in o.index_map.axes]
        revisits = [a for a in moving if a not in o.index_map.axes]
        if follows and revisits and max(pos[a] for a in follows) > min(pos[a] for a in revisits):
            return False
    carried = set(call.body.conditional_axes)
    return not (carried and any(pos[a] < pos[b] for a in carried for b in moving if b not in carried))


@dataclass(frozen=True)
class Visits:
    """The block indices one operand's index map gives at the grid steps evaluated, in execution order."""

    steps: np.ndarray  # (n, len(grid)) grid indices, row-major order
    blocks: np.ndarray  # (n, rank) block indices at those steps
    exact: bool  # every step of the grid was evaluated (else a sample: first, last and random steps)


def _grid_points(grid: tuple[int, ...], rows: np.ndarray | None = None) -> np.ndarray:
    """Grid indices (row-major) of the flat step numbers `rows` (all steps when None)."""
    total = math.prod(grid) if grid else 1
    flat = np.arange(total, dtype=np.int64) if rows is None else rows
    if not grid:
        return np.zeros((len(flat), 0), dtype=np.int64)
    return np.stack(np.unravel_index(flat, grid), axis=1).astype(np.int64)


def _evaluate(o: Operand, points: np.ndarray) -> np.ndarray:
    im = o.index_map
    if im.fn is None:
        raise ValueError(f"{o.name}'s index map cannot be evaluated")
    if len(points) == 0:  # a grid with an axis of 0 steps (`n // block` with n < block): no block is visited
        return np.zeros((0, len(o.shape)), dtype=np.int64)
    return np.array([im.fn(tuple(int(v) for v in p)) for p in points], dtype=np.int64).reshape(len(points), -1)


def _affine(o: Operand, points: np.ndarray) -> np.ndarray:
    assert o.index_map.affine is not None
    a = np.array(o.index_map.affine, dtype=np.int64)
    return points @ a[:, :-1].T + a[:, -1]


def output_visits(call: CallFacts, o: Operand) -> Visits:
    """Evaluate `o`'s index map over `call`'s grid: at every step when there are at most EXACT_STEPS (or, for an
    affine map, AFFINE_STEPS, checked against the real map at SAMPLE steps), else at a sample of steps."""
    grid = call.grid
    total = math.prod(grid) if grid else 1
    if total <= EXACT_STEPS:
        points = _grid_points(grid)
        return Visits(points, _evaluate(o, points), True)
    rng = np.random.default_rng(0)
    rows = np.unique(np.concatenate([np.arange(SAMPLE), total - 1 - np.arange(SAMPLE), rng.integers(0, total, SAMPLE)]))
    if o.index_map.affine is not None and total <= AFFINE_STEPS:
        points = _grid_points(grid)
        blocks = _affine(o, points)
        if np.array_equal(_evaluate(o, points[rows]), blocks[rows]):
            return Visits(points, blocks, True)
    points = _grid_points(grid, rows)
    return Visits(points, _evaluate(o, points), False)


def _blocks_per_dim(o: Operand) -> tuple[int, ...]:
    return tuple(s if b is None else math.ceil(s / b) for s, b in zip(o.shape, o.block_shape, strict=True))


def revisit_problem(o: Operand, v: Visits) -> str:
    """'' unless some block of output `o` is visited in two separate runs of steps (or outside the array)."""
    if len(v.blocks) == 0:
        return ""
    nb = np.array(_blocks_per_dim(o), dtype=np.int64)
    outside = np.any((v.blocks < 0) | (v.blocks >= nb), axis=1)
    if outside.any():
        k = int(np.argmax(outside))
        return (
            f"at grid step {tuple(int(x) for x in v.steps[k])} {o.name}'s index map gives block "
            f"{tuple(int(x) for x in v.blocks[k])}, outside its {tuple(int(x) for x in nb)} blocks"
        )
    flat = (
        np.ravel_multi_index(tuple(v.blocks.T), tuple(int(x) for x in nb))
        if v.blocks.shape[1]
        else np.zeros(len(v.blocks), dtype=np.int64)
    )
    starts = np.flatnonzero(np.concatenate([[True], flat[1:] != flat[:-1]]))
    run_block = flat[starts]
    if len(np.unique(run_block)) == len(run_block):
        return ""  # one run per block
    seen: dict[int, int] = {}
    for r, b in enumerate(run_block.tolist()):
        if b in seen:
            first, again = v.steps[starts[seen[b]]], v.steps[starts[r]]
            block = tuple(int(x) for x in v.blocks[starts[r]])
            return (
                f"{o.name} block {block} is visited at grid step {tuple(int(x) for x in first)} and again at "
                f"{tuple(int(x) for x in again)} after other blocks: on a TPU the block was already written back "
                "and the second run starts from garbage (JAX's TPU interpreter: 'Revisited block'); put the axes "
                "this output does not follow innermost"
            )
        seen[b] = r
    return ""


def coverage_gap(o: Operand, v: Visits) -> str:
    """'' when the visited blocks of output `o` cover the whole array (judged only when every step was evaluated)."""
    if not v.exact:
        return ""
    nb = _blocks_per_dim(o)
    flat = set(np.ravel_multi_index(tuple(v.blocks.T), nb).tolist()) if v.blocks.shape[1] else {0}
    missing = math.prod(nb) - len(flat)
    if missing <= 0:
        return ""
    hit = np.zeros(math.prod(nb), dtype=bool)
    hit[list(flat)] = True
    first = np.unravel_index(int(np.argmin(hit)), nb)
    return (
        f"{o.name}: {missing} of its {math.prod(nb)} blocks are never visited by the grid (first: block "
        f"{tuple(int(x) for x in first)}), so those elements are never written"
    )


def parallel_revisit_problem(call: CallFacts) -> str:
    """'' unless an output block stays fixed along a grid axis marked "parallel"."""
    sem = call.dimension_semantics
    if sem is None:
        return ""
    for o in call.outputs:
        for a, kind in enumerate(sem):
            if a < len(call.grid) and call.grid[a] > 1 and kind == "parallel" and a not in o.index_map.axes:
                return (
                    f'{o.name} does not follow grid axis {a}, which is marked "parallel": on chips with two '
                    "TensorCores (v4, v5p) the two halves of that axis run on different cores and write the same "
                    'output block; mark it "arbitrary"'
                )
    return ""


def pipelining_problem(call: CallFacts) -> tuple[str, bool]:
    """Why `call`'s grid breaks the TPU pipelining rules ('' if it does not), and whether the judgement was exact
    (every grid step evaluated) for every output."""
    exact = True
    why = parallel_revisit_problem(call)
    if why:
        return why, True
    for o in call.outputs:
        if not o.is_pipelined or o.index_map.data_dependent or o.index_map.fn is None:
            continue
        v = output_visits(call, o)
        exact = exact and v.exact
        why = revisit_problem(o, v) or coverage_gap(o, v)
        if why:
            return why, exact
    return "", exact
