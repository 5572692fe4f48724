"""Tile knobs: the integer literals that set each pallas_call's block sizes, found by tracing, not by spelling.

Every int literal whose value is a block size or grid extent is perturbed in turn (halved, or doubled) and the module
re-traced; the literals whose change moves a block dimension or grid extent along grid axis g of call c control (c, g).
Literals that control a shared axis are tied into one knob (they must move together to stay coherent): a knob is
named after the Python name the literal is bound to (`bm`, `BLOCK_M`, a partial keyword), else `axis<g>`.
This works for literals, module constants, defaults, `functools.partial` keywords and locals alike.

A knob can also move array extents: a wrapper that pads its input to a multiple of the block
(`M_pad = cdiv(M, bm) * bm; jnp.pad(x, ...)`) hands the pallas_call an array whose size follows the block. Such
(operand, dim) pairs are recorded as the knob's `padded` dims: the tile pass may then pick sizes that do not divide
the array (the wrapper pads for them) and takes the grid along that axis from the re-trace.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from ..workload import load_source
from .cst_edit import replace_integers
from .facts import CallFacts, Operand
from .matchers import (
    Located,
    Pos,
    enclosing_function,
    find_call_node,
    free_names,
    is_blockspec,
    kernel_function,
    spec_list,
)
from .trace import trace_calls

PROTECTED_FUNCTIONS = ("reference", "make_inputs", "hand_tuned")
PROTECTED_NAMES = ("TOLERANCE", "CHECK_DIMS", "ENTRY", "OVERFLOW_CHECK")


@dataclass(frozen=True)
class Site:
    """One integer literal in the source that a knob rewrites."""

    pos: Pos
    value: int
    kind: str  # "block" (sets a block dim), "divisor" (divides a grid extent: moves with the block), "extent"
    bound_name: str | None


@dataclass(frozen=True)
class Knob:
    """A tile size of one pallas_call: the literals that set the block along `axes` (tied together)."""

    name: str
    call: int
    axes: tuple[int, ...]
    value: int  # the block-site literal's current value
    sites: tuple[Site, ...]
    # (operand, dim) of `call` whose array extent the wrapper pads to a multiple of the block
    padded: tuple[tuple[int, int], ...] = ()


def _bound_name(loc: Located, node: cst.Integer) -> str | None:
    """The Python name an int literal is bound to: assignment target, parameter default, keyword, dict key."""
    child: cst.CSTNode = node
    parent = loc.parent(node)
    while isinstance(parent, cst.UnaryOperation):
        child, parent = parent, loc.parent(parent)
    if isinstance(parent, cst.Param) and parent.default is child:
        return parent.name.value
    if isinstance(parent, cst.Arg) and parent.keyword is not None:
        return parent.keyword.value
    if isinstance(parent, cst.DictElement) and isinstance(parent.key, cst.SimpleString):
        return parent.key.evaluated_value if isinstance(parent.key.evaluated_value, str) else None
    if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
        t = parent.targets[0].target
        return t.value if isinstance(t, cst.Name) else None
    if isinstance(parent, cst.Element):
        tup = loc.parent(parent)
        holder = loc.parent(tup) if tup is not None else None
        if not isinstance(tup, cst.Tuple | cst.List):
            return None
        idx = list(tup.elements).index(parent)
        if isinstance(holder, cst.Assign) and len(holder.targets) == 1:
            target = holder.targets[0].target
            if isinstance(target, cst.Tuple) and len(target.elements) == len(tup.elements):
                el = target.elements[idx].value
                return el.value if isinstance(el, cst.Name) else None
            if isinstance(target, cst.Name):  # TILING = (128, 256, 512): TILING0, TILING1, ...
                return f"{target.value}{idx}"
        if isinstance(holder, cst.Arg) and holder.keyword is not None:  # tiling=(128, 128, 128): tiling0, ...
            return f"{holder.keyword.value}{idx}"
    if isinstance(parent, cst.AnnAssign) and isinstance(parent.target, cst.Name):
        return parent.target.value
    return None


def reference_reads(module: cst.Module) -> set[str]:
    """The module-level names the protected functions (`reference`, `make_inputs`, `hand_tuned`) read, directly or
    through module-level functions they call: a constant among them is part of the problem, not of the kernel.
    (fused_11's `GROUP_SIZE` sets both the kernel's tile and the reference's group norm; tuning it as a tile changed
    the reference with the kernel, so the check compared the rewrite against a different problem.)"""
    functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
    todo = [functions[n] for n in PROTECTED_FUNCTIONS if n in functions]
    seen: set[str] = set()
    reads: set[str] = set()
    while todo:
        fn = todo.pop()
        if fn.name.value in seen:
            continue
        seen.add(fn.name.value)
        names = set().union(*(free_names(stmt) for stmt in fn.body.body if not _imports_only(stmt)))
        reads |= names
        todo += [functions[n] for n in names if n in functions and n not in seen]
    return reads


def _imports_only(stmt: cst.CSTNode) -> bool:
    """An `import` line (in `hand_tuned`, the library kernel's import names a function, not a module name it reads)."""
    return isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(x, cst.Import | cst.ImportFrom) for x in stmt.body
    )


def _protected(loc: Located, node: cst.CSTNode, reads: set[str]) -> bool:
    cur = loc.parent(node)
    while cur is not None:
        if isinstance(cur, cst.FunctionDef) and cur.name.value in PROTECTED_FUNCTIONS:
            return True
        if isinstance(cur, cst.Assign):
            for t in cur.targets:
                if isinstance(t.target, cst.Name) and t.target.value in PROTECTED_NAMES:
                    return True
                if isinstance(t.target, cst.Name) and t.target.value in reads and loc.parent(cur) is not None:
                    line = loc.parent(cur)
                    if isinstance(line, cst.SimpleStatementLine) and loc.parent(line) is loc.wrapper.module:
                        return True  # a module-level constant the reference reads
        cur = loc.parent(cur)
    return False


def candidate_literals(module: cst.Module, values: set[int]) -> list[tuple[Pos, int, str | None]]:
    """Int literals outside the protected interface whose value is one of `values`."""
    loc = Located.of(module)
    reads = reference_reads(loc.wrapper.module)
    out: list[tuple[Pos, int, str | None]] = []

    class Finder(cst.CSTVisitor):
        def visit_Integer(self, node: cst.Integer) -> None:
            try:
                v = int(node.evaluated_value)
            except ValueError:
                return
            if v in values and not _protected(loc, node, reads):
                out.append((loc.start(node), v, _bound_name(loc, node)))

    loc.wrapper.module.visit(Finder())
    return out


def grid_axis_of(call: CallFacts, operand: int, dim: int) -> int | None:
    """The grid axis a block dim walks: the single axis it depends on, or, when it depends on several (a causal kv
    map), the one whose index it takes at most grid points; None when it is fixed or no axis clearly leads."""
    imap = call.operands[operand].index_map
    deps = imap.depends_on[dim] if dim < len(imap.depends_on) else ()
    if len(deps) == 1:
        return deps[0]
    return imap.walks[dim] if dim < len(imap.walks) else None


def interesting_values(calls: tuple[CallFacts, ...]) -> set[int]:
    vals: set[int] = set()
    for c in calls:
        vals.update(g for g in c.grid if g > 1)
        for i, op in enumerate(c.operands):
            if not op.is_pipelined:
                continue
            for d, b in enumerate(op.block_shape):
                if b is not None and b > 1 and grid_axis_of(c, i, d) is not None:
                    vals.add(b)
    return vals


def _effects(
    before: tuple[CallFacts, ...], after: tuple[CallFacts, ...], shrunk: bool = True
) -> set[tuple[int, int, str]] | None:
    """Which (call, axis, kind) a perturbation moved; None when it changed something no knob may change."""
    if len(before) != len(after):
        return None
    found: set[tuple[int, int, str]] = set()
    for c0, c1 in zip(before, after, strict=True):
        if len(c0.grid) != len(c1.grid) or len(c0.operands) != len(c1.operands):
            return None
        block_axes: set[int] = set()
        for i, (o0, o1) in enumerate(zip(c0.operands, c1.operands, strict=True)):
            for d, (b0, b1) in enumerate(zip(o0.block_shape, o1.block_shape, strict=True)):
                if b0 != b1:
                    axis = grid_axis_of(c0, i, d)
                    if axis is None and _whole_dim_reshape(o0, o1, d):
                        continue  # the wrapper reshapes by the tile (chunk-major rows, (nc, 1, chunk)): no effect
                    if axis is None:
                        return None  # moved a block dim that no grid axis walks: not a tile size
                    block_axes.add(axis)
        for a in block_axes:
            found.add((c0.index, a, "block"))
        # A literal that resizes VMEM scratch and divides a grid extent sets the tile a manual DMA fills per step
        # (paged attention's pages_per_compute_block): it is that axis's block size.
        scratch_moved = [s.shape for s in c0.scratch] != [s.shape for s in c1.scratch]
        for a, (g0, g1) in enumerate(zip(c0.grid, c1.grid, strict=True)):
            if g0 != g1 and a not in block_axes:
                # The literal was halved (or doubled): an extent moves the same way, a divisor the other way.
                kind = "extent" if (g1 < g0) == shrunk else "divisor"
                found.add((c0.index, a, "block" if kind == "divisor" and scratch_moved else kind))
    return found


def _whole_dim_reshape(o0: Operand, o1: Operand, d: int) -> bool:
    """Block dim `d` spans its whole array dim before and after, and the array kept its element count: the wrapper
    laid the array out by the tile (gated delta rule's per-chunk rows, `g.reshape(B, H, S // chunk, 1, chunk)`), so
    the dim follows the tile without being one."""
    return (
        len(o0.shape) == len(o1.shape)
        and o0.block_shape[d] == o0.shape[d]
        and o1.block_shape[d] == o1.shape[d]
        and math.prod(o0.shape) == math.prod(o1.shape)
    )


def padded_dims(before: tuple[CallFacts, ...], after: tuple[CallFacts, ...]) -> set[tuple[int, int, int]]:
    """(call, operand, dim) whose block AND array extent a perturbation moved: the wrapper pads to the block."""
    out: set[tuple[int, int, int]] = set()
    for c0, c1 in zip(before, after, strict=False):
        for i, (o0, o1) in enumerate(zip(c0.operands, c1.operands, strict=False)):
            if len(o0.shape) != len(o1.shape) or len(o0.block_shape) != len(o1.block_shape):
                continue
            for d, (n0, n1) in enumerate(zip(o0.shape, o1.shape, strict=True)):
                if n0 != n1 and o0.block_shape[d] != o1.block_shape[d]:
                    out.add((c0.index, i, d))
    return out


def _perturbed_calls(
    path: str, values: Mapping[Pos, int], module: cst.Module
) -> tuple[tuple[CallFacts, ...], bool] | None:
    """Re-trace with the literals at `values` halved (else doubled); the new facts and whether they shrank."""
    halved = {p: v // 2 for p, v in values.items()}
    doubled = {p: v * 2 for p, v in values.items()}
    trials = ([(halved, True)] if all(v % 2 == 0 and v >= 2 for v in values.values()) else []) + [(doubled, False)]
    for trial, shrunk in trials:
        new = replace_integers(module, trial).code
        try:
            return trace_calls(load_source(new, path)), shrunk
        except Exception:
            continue
    return None


_CACHE: dict[str, tuple[Knob, ...]] = {}


def discover_knobs(source: str, path: str, calls: tuple[CallFacts, ...], digest: str) -> tuple[Knob, ...]:
    """All tile knobs of a module (cached by source digest)."""
    if digest in _CACHE:
        return _CACHE[digest]
    module = cst.parse_module(source)
    controls: dict[Pos, set[tuple[int, int, str]]] = {}
    info: dict[Pos, tuple[int, str | None]] = {}
    names: dict[Pos, str | None] = {}
    pads: dict[Pos, set[tuple[int, int, int]]] = {}
    lone: dict[Pos, int] = {}  # literals whose perturbation alone broke the trace
    for pos, value, name in candidate_literals(module, interesting_values(calls)):
        names[pos] = name
        res = _perturbed_calls(path, {pos: value}, module)
        if res is None:
            lone[pos] = value
            continue
        effects = _effects(calls, res[0], res[1])
        if effects:
            controls[pos] = effects
            info[pos] = (value, name)
            pads[pos] = padded_dims(calls, res[0])
    _add_structural(module, path, calls, controls, info, names, pads)
    _add_tied(module, path, calls, controls, info, names, pads, lone)
    _probe_padding(module, path, calls, controls, info, pads)
    knobs = _group(controls, info, calls, pads)
    _CACHE[digest] = knobs
    return knobs


def _add_structural(
    module: cst.Module,
    path: str,
    calls: tuple[CallFacts, ...],
    controls: dict[Pos, set[tuple[int, int, str]]],
    info: dict[Pos, tuple[int, str | None]],
    names: Mapping[Pos, str | None],
    pads: dict[Pos, set[tuple[int, int, int]]],
) -> None:
    """Add literal groups the single-literal perturbation could not resolve, after a joint re-trace confirms them."""
    covered = {(c, a) for eff in controls.values() for c, a, k in eff if k == "block"}
    for call in calls:
        for axis, sites in structural_sites(module, call).items():
            if (call.index, axis) in covered or not any(k == "block" for _, _, k in sites):
                continue
            res = _perturbed_calls(path, {p: v for p, v, _ in sites}, module)
            if res is None:
                continue
            effects = _effects(calls, res[0], res[1])
            if effects is None or {(c, a) for c, a, _ in effects} != {(call.index, axis)}:
                continue
            for pos, value, kind in sites:
                controls[pos] = {(call.index, axis, kind)}
                info[pos] = (value, names.get(pos))
                pads[pos] = padded_dims(calls, res[0])


def _add_tied(
    module: cst.Module,
    path: str,
    calls: tuple[CallFacts, ...],
    controls: dict[Pos, set[tuple[int, int, str]]],
    info: dict[Pos, tuple[int, str | None]],
    names: Mapping[Pos, str | None],
    pads: dict[Pos, set[tuple[int, int, int]]],
    lone: Mapping[Pos, int],
) -> None:
    """One square tile over several grid axes: literals of one value that break the trace alone, re-traced together
    with the grid's literals of that value that only move the grid. llm_triangle_multiplication writes its block once,
    in a helper every operand's spec calls (`pl.BlockSpec((None, 128, 128), index_map)`), and its grid as
    `(C, N // 128, N // 128, N // 128)`: one block literal alone mismatches the body's dot and the accumulator, a grid
    divisor alone moves only the grid, and no BlockSpec in the call holds a literal tuple (`_add_structural`). The
    group is kept only if the joint re-trace moves blocks and nothing else, on exactly the grid literals' axes."""
    covered = {(c, a) for eff in controls.values() for c, a, k in eff if k == "block"}
    by_value: dict[int, list[Pos]] = {}
    for pos, value in lone.items():
        by_value.setdefault(value, []).append(pos)
    for value, blocks in sorted(by_value.items()):
        grid = [
            p
            for p, eff in controls.items()
            if info[p][0] == value and eff and all(k != "block" and (c, a) not in covered for c, a, k in eff)
        ]
        if not grid:
            continue
        res = _perturbed_calls(path, {p: value for p in blocks + grid}, module)
        if res is None:
            continue
        effects = _effects(calls, res[0], res[1])
        if not effects or any(k != "block" for _, _, k in effects):
            continue
        if {(c, a) for c, a, _ in effects} != {(c, a) for p in grid for c, a, _ in controls[p]}:
            continue
        if [[o.shape for o in c.operands] for c in calls] != [[o.shape for o in c.operands] for c in res[0]]:
            continue  # a literal of the same value that also sizes an array: not only a tile
        for p in blocks:
            controls[p] = set(effects)
            info[p] = (value, names.get(p))
            pads[p] = padded_dims(calls, res[0])


def _probe_padding(
    module: cst.Module,
    path: str,
    calls: tuple[CallFacts, ...],
    controls: Mapping[Pos, set[tuple[int, int, str]]],
    info: Mapping[Pos, tuple[int, str | None]],
    pads: dict[Pos, set[tuple[int, int, int]]],
) -> None:
    """Halving a block often leaves a padded array's size unchanged (1000 rows pad to 1024 at 128 and at 64), so
    once per (call, axis) not yet seen padded, one block literal is re-traced at 5/4 (then 3/2) of its value: a
    wrapper that pads to the block then hands over a different array size (1000 rows: 1120 at 160). The probe costs
    a re-trace or two per axis (megablox's gmm: 11 s -> 32 s of discovery), so it runs only on modules that call a
    `pad(` (jnp.pad, lax.pad); padding written another way is still seen when the halving trace moves the array."""
    if "pad(" not in module.code:
        return
    seen = {(c, a) for p, eff in controls.items() for c, a, _ in eff if any(pc == c for pc, _, _ in pads.get(p, ()))}
    for pos, effects in sorted(controls.items()):
        value = info[pos][0]
        axes = {(c, a) for c, a, k in effects if k == "block"}
        if not axes or axes <= seen or value % 4 or value < 16:
            continue
        seen |= axes
        for probe in (value * 5 // 4, value * 3 // 2):
            try:
                probed = trace_calls(load_source(replace_integers(module, {pos: probe}).code, path))
            except Exception:
                continue
            found = padded_dims(calls, probed) if len(probed) == len(calls) else set()
            if found:
                pads[pos] = pads.get(pos, set()) | found
                break


def _group(
    controls: Mapping[Pos, set[tuple[int, int, str]]],
    info: Mapping[Pos, tuple[int, str | None]],
    calls: tuple[CallFacts, ...],
    pads: Mapping[Pos, set[tuple[int, int, int]]],
) -> tuple[Knob, ...]:
    """Tie literals that control a common (call, axis) into knobs (union-find over shared axes)."""
    parent: dict[Pos, Pos] = {p: p for p in controls}

    def find(p: Pos) -> Pos:
        while parent[p] != p:
            parent[p] = parent[parent[p]]
            p = parent[p]
        return p

    owner: dict[tuple[int, int], Pos] = {}
    for p, effects in controls.items():
        for c, a, _kind in effects:
            if (c, a) in owner:
                parent[find(p)] = find(owner[(c, a)])
            else:
                owner[(c, a)] = p
    groups: dict[Pos, list[Pos]] = {}
    for p in controls:
        groups.setdefault(find(p), []).append(p)
    knobs: list[Knob] = []
    for members in groups.values():
        members.sort()
        axes_by_call: dict[int, set[int]] = {}
        for p in members:
            for c, a, _ in controls[p]:
                axes_by_call.setdefault(c, set()).add(a)
        sites = tuple(
            Site(
                pos=p,
                value=info[p][0],
                kind=_site_kind({k for _, _, k in controls[p]}),
                bound_name=info[p][1],
            )
            for p in members
        )
        block_sites = [s for s in sites if s.kind == "block"]
        if not block_sites:
            continue  # only grid extents: nothing to tile
        names = sorted({s.bound_name for s in block_sites if s.bound_name})
        for c, axes in sorted(axes_by_call.items()):
            name = "_".join(names) if names else f"axis{min(axes)}"
            padded = tuple(sorted({(o, d) for p in members for cc, o, d in pads.get(p, ()) if cc == c}))
            knobs.append(
                Knob(
                    name=name,
                    call=c,
                    axes=tuple(sorted(axes)),
                    value=block_sites[0].value,
                    sites=sites,
                    padded=padded,
                )
            )
    return _unique_names(knobs)


def _site_kind(kinds: set[str]) -> str:
    for k in ("block", "divisor", "extent"):
        if k in kinds:
            return k
    return "block"


def _unique_names(knobs: list[Knob]) -> tuple[Knob, ...]:
    seen: dict[tuple[int, str], int] = {}
    out: list[Knob] = []
    for k in sorted(knobs, key=lambda k: (k.call, k.axes)):
        key = (k.call, k.name)
        if key in seen:
            seen[key] += 1
            k = dataclasses.replace(k, name=f"{k.name}{seen[key]}")
        else:
            seen[key] = 0
        out.append(k)
    return tuple(out)


# --- Structural fallback: literals written in place (`pl.BlockSpec((128, 128), ...)`, `grid=(M // 128, ...)`) are
# coupled through the kernel body, so perturbing one alone breaks the trace. Read the BlockSpecs of the pallas_call
# instead, map each literal to (operand, dim) -> grid axis, and verify the tied group by one joint re-trace.


def _block_tuple(spec: cst.BaseExpression | None) -> list[cst.BaseExpression] | None:
    if not is_blockspec(spec) or spec is None:
        return None
    assert isinstance(spec, cst.Call)
    shape: cst.BaseExpression | None = None
    for a in spec.args:
        if (a.keyword is None and shape is None) or (a.keyword is not None and a.keyword.value == "block_shape"):
            shape = a.value
            if a.keyword is not None:
                break
    if isinstance(shape, cst.Tuple | cst.List):
        return [e.value for e in shape.elements]
    return None


def structural_sites(module: cst.Module, call: CallFacts) -> dict[int, list[tuple[Pos, int, str]]]:
    """Literal sites per grid axis of one call: {axis: [(pos, value, kind)]}, kind "block" or "extent"."""
    loc = Located.of(module)
    try:
        node = find_call_node(loc, call)
    except Exception:
        return {}
    specs = spec_list(loc, node, "in_specs") + spec_list(loc, node, "out_specs")
    pipelined = [i for i, o in enumerate(call.operands)]
    out: dict[int, list[tuple[Pos, int, str]]] = {}
    if len(specs) == len(pipelined) - call.num_scalar_prefetch or len(specs) == len(call.operands):
        for i, spec in enumerate(specs):
            elems = _block_tuple(spec)
            op = call.operands[i]
            if elems is None or len(elems) != len(op.block_shape):
                continue
            for d, e in enumerate(elems):
                axis = grid_axis_of(call, i, d)
                if axis is not None and isinstance(e, cst.Integer) and int(e.evaluated_value) == op.block_shape[d]:
                    out.setdefault(axis, []).append((loc.start(e), int(e.evaluated_value), "block"))
    grid = spec_list(loc, node, "grid")
    if grid and isinstance(grid[0], cst.Tuple):
        for g, el in enumerate(grid[0].elements):
            if g >= len(call.grid):
                break
            v = el.value
            if isinstance(v, cst.Integer):
                out.setdefault(g, []).append((loc.start(v), int(v.evaluated_value), "extent"))
            elif isinstance(v, cst.BinaryOperation) and isinstance(v.right, cst.Integer):
                out.setdefault(g, []).append((loc.start(v.right), int(v.right.evaluated_value), "divisor"))
            elif isinstance(v, cst.Call) and len(v.args) == 2 and isinstance(v.args[1].value, cst.Integer):
                lit = v.args[1].value
                assert isinstance(lit, cst.Integer)
                out.setdefault(g, []).append((loc.start(lit), int(lit.evaluated_value), "divisor"))
    return out


def scaled_values(sites: tuple[Site, ...], old: int, new: int) -> dict[Pos, int] | None:
    """New literal values when the block along a knob goes from `old` to `new` (None: not integral)."""
    values: dict[Pos, int] = {}
    for s in sites:
        if s.kind == "extent":
            if (s.value * old) % new:
                return None
            values[s.pos] = s.value * old // new
        else:
            if (s.value * new) % old:
                return None
            values[s.pos] = s.value * new // old
    return values


# --- untying a knob ------------------------------------------------------------------------------------------------


def tied(knob: Knob, all_knobs: tuple[Knob, ...]) -> bool:
    """A knob one name sets along several grid axes (`BLOCK` for a matmul's M, N and K) or in several calls: the
    tile pass can only move those together unless the name is untied first (`untie`)."""
    named = any(site.bound_name == knob.name for site in knob.sites)
    return named and (len(knob.axes) > 1 or any(k.name == knob.name and k.call != knob.call for k in all_knobs))


def untie(module: cst.Module, knob: Knob) -> cst.Module:
    """The module with every read of the name that binds `knob`'s literal replaced by the literal itself, so each
    read becomes a literal of its own that knob discovery can place on its own axis (`tile{untie=BLOCK,...}`).

    The name is a module-level constant (`BLOCK = 128`) or a parameter default (`def _matmul(x, w, block=128)`);
    reads are found by scope analysis (a local that shadows it is not touched). The binding stays. Raises ValueError
    with the reason when it cannot be done: no such binding, or the name is read in a kernel body (the body would
    keep the old size while its blocks moved) or in the protected functions."""
    from libcst.metadata import ScopeProvider

    loc = Located.of(module)
    owner = _binding_owner(loc, _binding(loc, knob))
    scope = loc.wrapper.resolve(ScopeProvider).get(owner) if owner is not None else None
    if scope is None:
        raise ValueError(f"{knob.name!r} is not a module constant or a parameter default")
    assignments = [a for a in scope.assignments[knob.name] if getattr(a, "node", None) is owner]
    if len(assignments) != 1 or len(scope.assignments[knob.name]) != 1:
        raise ValueError(f"{knob.name!r} is bound more than once in its scope")
    reads = [r.node for r in assignments[0].references if isinstance(r.node, cst.Name)]
    if not reads:
        raise ValueError(f"{knob.name!r} is never read")
    kernels = {k for c in loc.calls if (k := kernel_function(loc, c)) is not None}
    for node in reads:
        fn = enclosing_function(loc, node)
        while fn is not None:
            if fn in kernels:
                raise ValueError(f"{knob.name!r} is read in the kernel body {fn.name.value!r}")
            if fn.name.value in PROTECTED_FUNCTIONS:
                raise ValueError(f"{knob.name!r} is read in {fn.name.value!r}")
            fn = enclosing_function(loc, fn)
    value = cst.Integer(str(knob.value))
    targets = {id(n) for n in reads}

    class Inline(cst.CSTTransformer):
        def leave_Name(self, original: cst.Name, updated: cst.Name) -> cst.BaseExpression:
            return value if id(original) in targets else updated

    return module.visit(Inline())


def _binding(loc: Located, knob: Knob) -> cst.Integer:
    """The literal whose bound name is the knob's name."""
    for site in knob.sites:
        if site.bound_name != knob.name:
            continue
        for node in m.findall(loc.wrapper.module, m.Integer()):
            if isinstance(node, cst.Integer) and loc.start(node) == site.pos:
                return node
    raise ValueError(f"no literal is bound to {knob.name!r}")


def _binding_owner(loc: Located, literal: cst.Integer) -> cst.CSTNode | None:
    """The node libcst's scope analysis records as the assignment of the literal's name: the target `Name` of
    `NAME = 128` / `NAME: int = 128`, or the `Param` of a default."""
    cur = loc.parent(literal)
    while isinstance(cur, cst.UnaryOperation):
        cur = loc.parent(cur)
    if isinstance(cur, cst.Param):
        return cur
    if isinstance(cur, cst.Assign) and len(cur.targets) == 1 and isinstance(cur.targets[0].target, cst.Name):
        return cur.targets[0].target
    if isinstance(cur, cst.AnnAssign) and isinstance(cur.target, cst.Name):
        return cur.target
    return None
