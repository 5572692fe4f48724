"""tile: change the block sizes of a pallas_call coherently, wherever they are written."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import libcst as cst

from ..cost_model.hardware import Chip
from ..cost_model.roofline import estimate_call, legality_problems, vmem_footprint
from ..cost_model.ties import grid_steps, tie_order
from ..errors import KernelError, PassNotApplicable, UsageError, check
from ..ir.cst_edit import replace_integers, set_compiler_param
from ..ir.facts import BodyStats, CallFacts, Operand, Scratch
from ..ir.kernel_ir import KernelIR
from ..ir.knobs import Knob, discover_knobs, scaled_values, tied, untie
from .base import Pass
from .vmem_limit import smallest_step

SIZES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def knobs_of(ir: KernelIR) -> tuple[Knob, ...]:
    return discover_knobs(ir.source, ir.path, ir.calls, ir.digest)


@dataclass(frozen=True)
class TilePass(Pass):
    """Change the block shape of one pallas_call: every BlockSpec, the grid, scratch and derived sizes follow.

    Bigger blocks amortize the ~0.35 us per-step pipeline overhead and cut re-fetches (a matmul's x block is re-read
    once per output column tile); they cost VMEM. Parameters: `call` (which pallas_call, in trace order) and one
    `knob=size` per tile knob (see `pallasopt analyze`: a knob is named after the variable that sets it, e.g. `bm`,
    or `axis<g>` for a literal). The rewrite edits the literals that set each knob, wherever they are written
    (literal, constant, default argument, functools.partial keyword), and is verified by re-tracing. `vmem_mib`
    (offered where the call's blocks already fill half its scoped VMEM limit) also raises `vmem_limit_bytes` to
    that many MiB, for blocks past the limit: the tile and the limit that lets it compile are one move, so a search
    does not need a first step (the limit alone) that gains nothing to reach them. `untie=NAME` (offered where one
    name sets the block along several axes, `BLOCK` for a matmul's M, N and K) first replaces each read of that name
    by its value (`ir/knobs.untie`), so each axis gets a knob of its own (`axis<g>`) and the sizes name those: the
    same kind of one move as `vmem_mib`, since untying alone changes nothing.
    """

    name: ClassVar[str] = "tile"
    call: int = 0
    sizes: tuple[tuple[str, int], ...] = ()
    vmem_mib: int = 0  # > 0: also raise the call's vmem_limit_bytes to this many MiB
    untie: str = ""  # a tied knob's name, untied first; `sizes` then name the knobs of the untied module

    def params(self) -> dict[str, Any]:
        untie = {"untie": self.untie} if self.untie else {}
        return {
            "call": self.call,
            **untie,
            **dict(self.sizes),
            **({"vmem_mib": self.vmem_mib} if self.vmem_mib else {}),
        }

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Pass:
        sizes: list[tuple[str, int]] = []
        call = vmem_mib = 0
        untie = ""
        for k, v in params.items():
            if k == "untie":
                untie = v
                continue
            try:
                n = int(v)
            except ValueError:
                raise UsageError(f"pass 'tile': {k}={v!r} must be an integer") from None
            if k == "call":
                call = n
            elif k == "vmem_mib":
                vmem_mib = n
            else:
                if n <= 0:
                    raise UsageError(f"pass 'tile': {k}={n} must be positive")
                sizes.append((k, n))
        return cls(call=call, sizes=tuple(sizes), vmem_mib=vmem_mib, untie=untie)

    def _base(self, ir: KernelIR) -> KernelIR:
        """The module the sizes apply to: `ir`, or `ir` with `untie` untied."""
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call} (the module has {len(ir.calls)})")
        return untied(ir, self.call, self.untie) if self.untie else ir

    def _knobs(self, ir: KernelIR) -> list[tuple[Knob, int]]:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call} (the module has {len(ir.calls)})")
        check(self.sizes, "no tile sizes given")
        knobs = {k.name: k for k in knobs_of(ir) if k.call == self.call}
        out = []
        for name, size in self.sizes:
            check(name in knobs, f"call {self.call} has no tile knob {name!r} (knobs: {', '.join(knobs) or 'none'})")
            out.append((knobs[name], size))
        check(any(k.value != s for k, s in out), "the block sizes are already these")
        return out

    def predict(self, ir: KernelIR) -> tuple[CallFacts, ...]:
        """The facts the rewrite should produce, computed without re-tracing (for ranking many choices)."""
        ir = self._base(ir)
        chosen = self._knobs(ir)
        try:
            return predict(ir.calls, knobs_of(ir), chosen)
        except ValueError as e:
            sizes = ", ".join(f"{k.name}={s}" for k, s in chosen)
            raise PassNotApplicable(f"{sizes} does not divide the blocks or the grid evenly ({e})") from None

    def apply(self, ir: KernelIR) -> KernelIR:
        expected = self.predict(ir)
        base = self._base(ir)
        chosen = self._knobs(base)
        values: dict[tuple[int, int], int] = {}
        for knob, size in chosen:
            scaled = scaled_values(knob.sites, knob.value, size)
            check(scaled is not None, f"{knob.name}={size} does not divide the grid evenly")
            assert scaled is not None
            values.update(scaled)
        try:
            new = ir.with_module(replace_integers(base.module, values), self.spec())
        except KernelError as e:  # e.g. a library kernel that asserts block_k divides block_k_major
            raise PassNotApplicable(f"the rewritten module does not trace: {e.message}") from None
        padded = padded_axes(knobs_of(base), chosen)
        for got, want in zip(new.calls, expected, strict=True):
            # Run-time extents, and extents of arrays the wrapper pads to the block (their true size is not in the
            # facts): the re-trace has the last word on those.
            fixed = [a for a in range(len(got.grid)) if a not in got.dynamic_axes and (got.index, a) not in padded]
            check(
                len(got.grid) == len(want.grid)
                and [got.grid[a] for a in fixed] == [want.grid[a] for a in fixed]
                and all(_same_blocks(g, w) for g, w in zip(got.operands, want.operands, strict=True)),
                f"the rewrite was not coherent: call {got.index} traced to grid {got.grid} "
                f"blocks {[o.block_shape for o in got.operands]}, expected grid {want.grid}",
            )
        limit = new.calls[self.call].vmem_limit_bytes or 0
        if self.vmem_mib * 2**20 > limit:
            value = cst.parse_expression(f"{self.vmem_mib} * 1024 * 1024")
            module = set_compiler_param(new.module, new.calls[self.call], "vmem_limit_bytes", value)
            new = ir.with_module(module, self.spec())
        return new

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        out: list[Pass] = []
        knobs = knobs_of(ir)
        for call in ir.calls:
            mine = [k for k in knobs if k.call == call.index]
            if not mine:
                continue
            scored = _scored(cls, ir, call.index, mine, chip, "")
            for knob in mine:
                if not tied(knob, knobs):
                    continue
                try:
                    base = untied(ir, call.index, knob.name)
                except PassNotApplicable:
                    continue
                theirs = [k for k in knobs_of(base) if k.call == call.index]
                derived = [k for k in theirs if (k.name, k.axes) not in {(o.name, o.axes) for o in mine}]
                if len(derived) < 2:
                    continue  # still one knob after untying (a body that needs square blocks)
                scored += _scored(cls, base, call.index, theirs, chip, knob.name, apart=derived)
            scored.sort(key=lambda x: (x[0], x[2].spec()))
            # the whole space, model-best first (model ties: fewer grid steps alternate in): strategies truncate
            out.extend(p for _, _, p in tie_order(scored, lambda x: x[0], lambda x: x[1]))
        return tuple(out)


def _scored(
    cls: type[TilePass],
    ir: KernelIR,
    index: int,
    mine: list[Knob],
    chip: Chip,
    untie: str,
    apart: Sequence[Knob] = (),
) -> list[tuple[float, tuple[int, int], TilePass]]:
    """Every size combination of call `index`'s knobs `mine` with the model's time of the whole module and its grid
    steps; with `apart` (the knobs an untie made), only combinations that move them by different ratios (the others
    are the tied knob's own choices)."""
    call = ir.calls[index]
    knobs = knobs_of(ir)
    options = [_options(call, k) for k in mine]
    known = set(legality_problems(call, chip))
    scored: list[tuple[float, tuple[int, int], TilePass]] = []
    for combo in itertools.product(*options):
        if all(size == k.value for k, size in zip(mine, combo, strict=True)):
            continue
        chosen = [(k, s) for k, s in zip(mine, combo, strict=True)]
        if apart and len({s / k.value for k, s in chosen if k in apart}) < 2:
            continue
        try:
            facts = predict(ir.calls, knobs, chosen)
        except Exception:
            continue
        new_call = facts[call.index]
        if set(legality_problems(new_call, chip)) - known:
            continue  # a rule the candidate breaks (one the input already breaks is the compiler's call)
        mib = _vmem_mib(call, new_call, chip)
        if mib is None:
            continue
        if mib:
            new_call = dataclasses.replace(new_call, vmem_limit_bytes=mib * 2**20)
            facts = (*facts[: call.index], new_call, *facts[call.index + 1 :])
        t = sum(estimate_call(c, chip).time_s for c in facts)
        sizes = tuple((k.name, s) for k, s in chosen if s != k.value)
        scored.append((t, grid_steps(facts), cls(call=call.index, sizes=sizes, vmem_mib=mib, untie=untie)))
    return scored


_UNTIED: dict[tuple[str, int, str], KernelIR | str] = {}
UNTIED_CACHE = 64


def untied(ir: KernelIR, call: int, name: str) -> KernelIR:
    """`ir` with knob `name` of call `call` untied (`ir/knobs.untie`), re-traced and checked to trace to the same
    grids and blocks; cached by source digest. PassNotApplicable says why it cannot be untied."""
    key = (ir.digest, call, name)
    hit = _UNTIED.get(key)
    if hit is None:
        hit = _untie(ir, call, name)
        _UNTIED[key] = hit
        while len(_UNTIED) > UNTIED_CACHE:
            _UNTIED.pop(next(iter(_UNTIED)))
    if isinstance(hit, str):
        raise PassNotApplicable(hit)
    return hit


def _untie(ir: KernelIR, call: int, name: str) -> KernelIR | str:
    knobs = knobs_of(ir)
    found = [k for k in knobs if k.call == call and k.name == name]
    if not found:
        return f"call {call} has no tile knob {name!r} to untie"
    if not tied(found[0], knobs):
        return f"{name!r} sets one axis of one call: nothing to untie"
    try:
        base = ir.with_module(untie(ir.module, found[0]), f"untie {name}")
    except ValueError as e:
        return f"cannot untie {name!r}: {e}"
    except KernelError as e:
        return f"untying {name!r} broke the trace: {e.message}"
    shape = [(c.grid, [o.block_shape for o in c.operands]) for c in ir.calls]
    if [(c.grid, [o.block_shape for o in c.operands]) for c in base.calls] != shape:
        return f"untying {name!r} changed the traced grids or blocks"
    return base


def _vmem_mib(call: CallFacts, new: CallFacts, chip: Chip) -> int | None:
    """0 when the new blocks fit the call's scoped VMEM limit (with 10% to spare); else the smallest of
    `vmem-limit`'s steps that fits them, where the call's blocks already fill half its limit (VMEM is what binds)
    and the chip has that VMEM (GPU: never); None when no limit fits."""
    limit = call.vmem_limit_bytes or chip.default_scoped_vmem_bytes
    need = vmem_footprint(new, chip)
    if need <= limit * 0.9:
        return 0
    if chip.is_gpu or vmem_footprint(call, chip) <= limit * 0.5:
        return None
    return smallest_step(need, limit, chip)


def _sharing(all_knobs: tuple[Knob, ...], knob: Knob) -> list[Knob]:
    """The knobs (of any call) that share a literal with `knob`: they move together."""
    sites = {s.pos for s in knob.sites}
    return [k for k in all_knobs if {s.pos for s in k.sites} & sites]


def padded_axes(all_knobs: tuple[Knob, ...], chosen: Sequence[tuple[Knob, int]]) -> set[tuple[int, int]]:
    """(call, grid axis) whose extent follows an array the wrapper pads to a chosen knob's block."""
    return {(k.call, a) for knob, _ in chosen for k in _sharing(all_knobs, knob) if k.padded for a in k.axes}


def _dims_along(call: CallFacts, knob: Knob) -> list[tuple[int, int, int]]:
    """(operand, dim, array size) of every block dim that follows one of the knob's grid axes."""
    from ..ir.knobs import grid_axis_of

    out = []
    for i, op in enumerate(call.operands):
        for d, b in enumerate(op.block_shape):
            if b is not None and grid_axis_of(call, i, d) in knob.axes:
                out.append((i, d, op.shape[d]))
    return out


def _blocks_along(call: CallFacts, axis: int, operands: Sequence[Operand] | None = None) -> list[tuple[int, int]]:
    """(array size, block size) of every block dim that follows grid axis `axis`; blocks from `operands` (e.g. the
    predicted ones) when given, else the call's own."""
    from ..ir.knobs import grid_axis_of

    return [
        (op.shape[d], b)
        for i, op in enumerate(operands if operands is not None else call.operands)
        for d, b in enumerate(op.block_shape)
        if b is not None and b > 0 and grid_axis_of(call, i, d) == axis
    ]


def ragged_axis(call: CallFacts, axis: int) -> bool:
    """Whether grid axis `axis` is written as cdiv(size, block) with a partial last block already: the kernel
    handles ragged blocks along it (masking or dropped writes), so block sizes need not divide the array."""
    dims = _blocks_along(call, axis)
    g = call.grid[axis]
    return bool(dims) and all(g == -(-n // b) for n, b in dims) and any(n % b for n, b in dims)


def _options(call: CallFacts, knob: Knob) -> list[int]:
    """Sizes worth trying for a knob: powers of two near its value, and the whole axis and its halves and quarters
    (a 56- or 768-wide dim has few power-of-two divisors: blocks of 56 or 384 are the ones that fit it), each kept
    when it divides every dim the knob tiles (or, along a ragged cdiv axis, fits in it)."""
    from ..ir.knobs import grid_axis_of

    dims = _dims_along(call, knob)

    def fits(s: int) -> bool:
        if s < knob.value // 8 or s > knob.value * 32:
            return False
        for i, d, size in dims:
            b = call.operands[i].block_shape[d] or 1
            new_b = b * s // knob.value if (b * s) % knob.value == 0 else 0
            axis = grid_axis_of(call, i, d)
            ragged = axis is not None and ragged_axis(call, axis)
            # the wrapper pads that array to a multiple of the block: any size up to the array's fits
            ragged = ragged or (i, d) in knob.padded
            if new_b <= 0 or new_b > size or (size % new_b and not ragged):
                return False
        return True

    whole: set[int] = set()
    if dims:
        i, d, size = dims[0]
        b = call.operands[i].block_shape[d] or 1
        for parts in (1, 2, 4):
            if size % parts == 0 and (size // parts * knob.value) % b == 0:
                whole.add(size // parts * knob.value // b)
    return sorted({knob.value} | {s for s in (*SIZES, *whole) if s > 0 and fits(s)})


def _same_blocks(got: Operand, want: Operand) -> bool:
    """The traced block is the predicted one, but for dims that span the whole array in both (an array the wrapper
    lays out by the tile, `g.reshape(B, H, S // chunk, 1, chunk)`: the prediction keeps the old array shape)."""
    if len(got.block_shape) != len(want.block_shape):
        return False
    return all(
        b == w or (b == got.shape[d] and w == want.shape[d])
        for d, (b, w) in enumerate(zip(got.block_shape, want.block_shape, strict=True))
    )


def predict(
    calls: tuple[CallFacts, ...], all_knobs: tuple[Knob, ...], chosen: list[tuple[Knob, int]]
) -> tuple[CallFacts, ...]:
    """Scale the block dims along each chosen knob's axes (in every call that shares its literals).

    An array the wrapper pads to the block (a knob's `padded` dims) is predicted at ceil(extent / new block) blocks,
    the padded extent standing in for the true one (at most one old block over it)."""
    scale: dict[tuple[int, int], tuple[int, int]] = {}
    for knob, size in chosen:
        for k in _sharing(all_knobs, knob):
            for a in k.axes:
                scale[(k.call, a)] = (knob.value, size)
    pads = {(k.call, o, d) for knob, _ in chosen for k in _sharing(all_knobs, knob) for o, d in k.padded}
    out = []
    from ..ir.knobs import grid_axis_of

    for call in calls:
        ops = []
        padded_extent: dict[int, int] = {}
        for i, op in enumerate(call.operands):
            shape = list(op.block_shape)
            array = list(op.shape)
            for d, b in enumerate(shape):
                axis = grid_axis_of(call, i, d)
                if b is not None and axis is not None and (call.index, axis) in scale:
                    old, new = scale[(call.index, axis)]
                    if (b * new) % old:
                        raise ValueError("block size not integral")
                    nb = shape[d] = b * new // old
                    if (call.index, i, d) in pads:
                        blocks = -(-array[d] // nb)
                        array[d] = blocks * nb
                        padded_extent[axis] = max(padded_extent.get(axis, 0), blocks)
            imap = op.index_map
            if imap.affine is None and imap.fn is not None and any(k[0] == call.index for k in scale):
                # A non-affine map (a causal kv map) may bake the old block sizes into its constants: counting its
                # fetches by evaluating it would be wrong (and slow); the cost model falls back to its structure.
                imap = dataclasses.replace(imap, fn=None)
            ops.append(dataclasses.replace(op, shape=tuple(array), block_shape=tuple(shape), index_map=imap))
        grid = list(call.grid)
        ratios: list[tuple[int, int]] = []
        for a, g in enumerate(grid):
            if (call.index, a) in scale:
                old, new = scale[(call.index, a)]
                if a in call.dynamic_axes:  # sized at run time (active tiles): only approximately predictable
                    grid[a] = max(1, round(g * old / new))
                elif a in padded_extent:  # the wrapper pads the array to the new block
                    grid[a] = padded_extent[a]
                elif ragged_axis(call, a):  # cdiv grid: the extent follows the new block, not the old extent
                    extents = {-(-n // b) for n, b in _blocks_along(call, a, ops)}
                    if len(extents) != 1:
                        raise ValueError("ragged axis extents disagree")
                    grid[a] = extents.pop()
                elif (g * old) % new:
                    raise ValueError("grid extent not integral")
                else:
                    grid[a] = g * old // new
                ratios.append((old, new))
        body = _scaled_body(call.body, ratios) if ratios else call.body
        scratch = tuple(scaled_scratch(s, call.operands, ops) for s in call.scratch) if ratios else call.scratch
        out.append(dataclasses.replace(call, grid=tuple(grid), operands=tuple(ops), body=body, scratch=scratch))
    return tuple(out)


def scaled_scratch(scratch: Scratch, old_ops: Sequence[Operand], new_ops: Sequence[Operand]) -> Scratch:
    """A scratch buffer sized like a block (an accumulator `(tm, tn)`, running statistics `(bq, 1)`) follows that
    block: its dims are matched by position to the block dims (squeezed dims dropped) of the operand of the same rank
    that agrees on the most dims, outputs first, and each matched dim takes that operand's new/old ratio. A scratch
    that matches no block (a fixed-size table) keeps its shape."""
    best: tuple[int, list[int], list[int]] | None = None
    ranked = sorted(range(len(old_ops)), key=lambda i: old_ops[i].role != "out")
    for i in ranked:
        old = [b for b in old_ops[i].block_shape if b is not None]
        new = [b for b in new_ops[i].block_shape if b is not None]
        if len(old) != len(scratch.shape) or len(new) != len(old):
            continue
        agree = sum(a == b for a, b in zip(scratch.shape, old, strict=True))
        if agree and (best is None or agree > best[0]):
            best = (agree, old, new)
    if best is None:
        return scratch
    _, old, new = best
    shape = tuple(
        s * n // o if s == o and (s * n) % o == 0 else s for s, o, n in zip(scratch.shape, old, new, strict=True)
    )
    return dataclasses.replace(scratch, shape=shape)


def _scaled_body(body: BodyStats, ratios: list[tuple[int, int]]) -> BodyStats:
    """Per-step work after retiling: it grows with the block along every retiled axis (total work is unchanged).
    A dot dim equal to an old block size takes the new size (so MXU padding is re-evaluated); the rest of the
    factor goes into the dot's count."""
    factor = math.prod(new / old for old, new in ratios)
    dots = []
    for d in body.dots:
        dims = {"m": d.m, "n": d.n, "k": d.k}
        moved = 1.0
        pending = list(ratios)
        for key in ("m", "n", "k"):
            for i, (old, new) in enumerate(pending):
                if dims[key] == old:
                    dims[key] = new
                    moved *= new / old
                    pending.pop(i)
                    break
        dots.append(dataclasses.replace(d, count=d.count * factor / moved, m=dims["m"], n=dims["n"], k=dims["k"]))
    return dataclasses.replace(
        body,
        dots=tuple(dots),
        vpu_elems=round(body.vpu_elems * factor),
        transcendental_elems=round(body.transcendental_elems * factor),
        load_bytes=round(body.load_bytes * factor),
        store_bytes=round(body.store_bytes * factor),
        max_temp_bytes=round(body.max_temp_bytes * factor),
        max_reduced_bytes=round(body.max_reduced_bytes * factor),
    )
