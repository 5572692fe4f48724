"""stream-chunks: an in-kernel loop over chunks of a whole VMEM block streams the chunks from HBM instead."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from ..cost_model.hardware import Chip
from ..errors import PassNotApplicable, check
from ..ir.cst_edit import ensure_pltpu, replace_many
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import (
    Located,
    bound_in_nested,
    call_kernel,
    code,
    enclosing_function,
    find_call_node,
    grid_spec_keyword,
    is_call_to,
    keyword,
    module_names,
    pl_alias,
    used_names,
)
from ..ir.scope import STREAM_LOOP, Scope, fori_loops, loop_body_def, params, statements
from .base import Pass

SHAPE_ATTRS = frozenset({"shape", "dtype", "ndim"})  # what the kernel may still read of a streamed ref

# The module-level helpers the rewrite calls (added once per module). `{pl}` / `{pltpu}` are the module's aliases.
# The streamed inputs stay in HBM (`memory_space=ANY`); `_stream_kernel` hands the kernel the HBM window its old
# block covered (same shape, squeezed dims indexed away), and `_stream_fori_loop` runs the loop with a two-slot VMEM
# ring per streamed ref, chunk j + 1 fetched while chunk j is computed on.
HELPERS = '''

def _stream_hbm(in_specs, positions):
    """The call's in_specs with the inputs at `positions` left in HBM (the kernel fetches their chunks itself)."""
    specs = list(in_specs) if isinstance(in_specs, (list, tuple)) else [in_specs]
    return [{pl}.BlockSpec(memory_space={pl}.ANY) if i in positions else s for i, s in enumerate(specs)]


def _stream_kernel(kernel, in_specs, positions, n_grid, n_prefetch):
    """`kernel` whose inputs at `positions` arrive as the HBM windows their blocks covered at this grid step."""
    specs = list(in_specs) if isinstance(in_specs, (list, tuple)) else [in_specs]

    def window(ref, spec, head):
        idx = spec.index_map(*[{pl}.program_id(a) for a in range(n_grid)], *head)
        dims = []
        for i, b in zip(idx, spec.block_shape):
            if isinstance(b, int):
                dims.append({pl}.ds(i * b, b))
            elif b is None or isinstance(b, {pl}.Squeezed):
                dims.append(i)
            else:
                raise ValueError(f"stream-chunks: block dim {{b!r}} is not a plain size")
        return ref.at[tuple(dims)]

    def run(*refs):
        head = refs[:n_prefetch]
        full = list(refs)
        for p in positions:
            full[n_prefetch + p] = window(full[n_prefetch + p], specs[p], head)
        kernel(*full)

    return run


def _stream_fori_loop(lower, upper, body, init, refs, chunk, axes, unroll=1):
    """`jax.lax.fori_loop(lower, upper, body, init)` whose iteration j reads rows [j * chunk, (j + 1) * chunk) along
    `axes[i]` of each HBM ref `refs[i]` from a two-slot VMEM ring filled by DMA one iteration ahead; the body is
    called as `body(j, carry, *chunks)`."""
    import jax

    def window(ref, axis, j):
        return ref.at[tuple({pl}.ds(j * chunk, chunk) if d == axis else slice(None) for d in range(len(ref.shape)))]

    rings = [
        {pltpu}.VMEM((2, *(chunk if d == axis else n for d, n in enumerate(r.shape))), r.dtype)
        for r, axis in zip(refs, axes)
    ]

    def scoped(*scratch):
        bufs, sems = scratch[:-1], scratch[-1]

        def copies(j, slot):
            return [
                {pltpu}.make_async_copy(window(r, axis, j), buf.at[slot], sems.at[i, slot])
                for i, (r, axis, buf) in enumerate(zip(refs, axes, bufs))
            ]

        @{pl}.when(lower < upper)
        def _():
            for c in copies(lower, jax.lax.rem(lower, 2)):
                c.start()

        def step(j, carry):
            slot = jax.lax.rem(j, 2)
            for c in copies(j, slot):
                c.wait()

            @{pl}.when(j + 1 < upper)
            def _():
                for c in copies(j + 1, 1 - slot):
                    c.start()

            return body(j, carry, *[buf.at[slot] for buf in bufs])

        return jax.lax.fori_loop(lower, upper, step, init, unroll=unroll)

    return {pl}.run_scoped(scoped, *rings, {pltpu}.SemaphoreType.DMA((len(refs), 2)))
'''


def decline_reason(call: CallFacts) -> str:
    """Why no loop of the call's kernel can stream (the call-level screens; "" when one may)."""
    if call.library_site is not None:
        return "a library's kernel: only the values this file passes to it can change"
    if not set(call.body.primitives) & {"scan", "while"}:
        return "the kernel has no loop"
    if call.body.has_dma:
        return "the kernel already does manual DMA"
    return ""


@dataclass(frozen=True)
class _Read:
    """One read of a streamed ref in the loop body: `ref[..., pl.ds(j * chunk, chunk), ...]`."""

    node: cst.Subscript
    axis: int  # which subscript element is the chunk's pl.ds (= the ref dim it walks)
    size: str  # the pl.ds size's source text (the chunk)


@dataclass(frozen=True)
class _Plan:
    """What one streaming rewrite changes: the loop, its body, and per streamed input its ref name, position and
    the reads that become reads of the chunk."""

    loop: cst.Call
    body: cst.FunctionDef
    refs: tuple[str, ...]
    positions: tuple[int, ...]
    axes: tuple[int, ...]
    chunk: str
    reads: tuple[tuple[_Read, ...], ...]


def _bare(e: cst.BaseExpression) -> cst.BaseExpression:
    """`e` without its parentheses."""
    return e.with_changes(lpar=[], rpar=[]) if getattr(e, "lpar", None) else e


def _start_is_chunk(start: cst.BaseExpression, counter: str, size: str, env: dict[str, cst.BaseExpression]) -> bool:
    """`start` is `counter * size` (or `size * counter`), maybe under `pl.multiple_of(..., k)` or through a body
    local bound once to it."""
    for _ in range(3):
        start = _bare(start)
        if isinstance(start, cst.Name) and start.value in env:
            start = env[start.value]
        elif isinstance(start, cst.Call) and is_call_to(start, "multiple_of") and start.args:
            start = start.args[0].value
        else:
            break
    if not (isinstance(start, cst.BinaryOperation) and isinstance(start.operator, cst.Multiply)):
        return False
    sides = {code(_bare(start.left)), code(_bare(start.right))}
    return sides == {counter, size}


def _read(sub: cst.Subscript, counter: str, env: dict[str, cst.BaseExpression]) -> tuple[_Read | None, str]:
    """The read `sub` as a chunk read, or None and why it is not one."""
    elems = list(sub.slice)
    found: list[tuple[int, str]] = []
    for d, e in enumerate(elems):
        if not isinstance(e.slice, cst.Index):
            continue
        v = e.slice.value
        if isinstance(v, cst.Ellipsis):
            if not found:
                return None, f"`{code(sub)}` has `...` before the chunk's index"
            continue
        if (
            isinstance(v, cst.Call)
            and (is_call_to(v, "ds") or is_call_to(v, "dslice"))
            and len(v.args) == 2
            and all(a.keyword is None for a in v.args)
        ):
            size = code(v.args[1].value)
            if _start_is_chunk(v.args[0].value, counter, size, env):
                found.append((d, size))
    if len(found) != 1:
        return None, f"`{code(sub)}` does not read one `pl.ds({counter} * size, size)` chunk"
    return _Read(sub, found[0][0], found[0][1]), ""


def _ref_uses(kernel: cst.FunctionDef, body: cst.FunctionDef, ref: str, counter: str) -> tuple[tuple[_Read, ...], str]:
    """The chunk reads of kernel ref `ref` in the loop body, or () and why the ref cannot stream: every other use
    in the kernel must be `ref.shape` / `.dtype` / `.ndim`."""
    if bound_in_nested(kernel, ref) or ref in Scope.of(statements(kernel)).bound:
        return (), f"`{ref}` is rebound in the kernel"
    env = dict(Scope.of(statements(body)).env)
    in_body = {id(n) for n in m.findall(body, m.Name(ref))}
    reads: list[_Read] = []
    allowed: set[int] = set()
    for a in m.findall(kernel, m.Attribute(value=m.Name(ref))):
        assert isinstance(a, cst.Attribute)
        if a.attr.value in SHAPE_ATTRS:
            allowed.add(id(a.value))
    for sub in m.findall(body, m.Subscript(value=m.Name(ref))):
        assert isinstance(sub, cst.Subscript)
        r, why = _read(sub, counter, env)
        if r is None:
            return (), why
        reads.append(r)
        allowed.add(id(sub.value))
    targets = {
        id(t.target.value)
        for t in m.findall(kernel, m.AssignTarget(target=m.Subscript(value=m.Name(ref))))
        if isinstance(t, cst.AssignTarget) and isinstance(t.target, cst.Subscript)
    }
    targets |= {
        id(s.target.value)
        for s in m.findall(kernel, m.AugAssign(target=m.Subscript(value=m.Name(ref))))
        if isinstance(s, cst.AugAssign) and isinstance(s.target, cst.Subscript)
    }
    if targets:
        return (), f"`{ref}` is written in the kernel"
    param_ids = {id(p.name) for p in params(kernel)}
    other = [n for n in m.findall(kernel, m.Name(ref)) if id(n) not in allowed | param_ids]
    if other:
        where = "in the loop body" if any(id(n) in in_body for n in other) else "outside the loop body"
        return (), f"`{ref}` is used {where} other than as `{ref}[..., pl.ds({counter} * size, size), ...]` or `.shape`"
    if not reads:
        return (), f"`{ref}` is not read in the loop body"
    return tuple(reads), ""


def _operand_reason(call: CallFacts, position: int) -> str:
    """Why input `position`'s block cannot become an HBM window ("" when it can)."""
    op = next((o for o in call.inputs if o.position == position), None)
    if op is None or not op.is_pipelined:
        return "not a blocked VMEM input"
    if any(position == i for i, _ in call.input_output_aliases):
        return "aliased to an output"
    if len(op.block_shape) != len(op.shape):
        return "its block has another rank than its array"
    for n, b in zip(op.shape, op.block_shape, strict=True):
        if b is not None and n % b:
            return f"its block ({b}) does not divide its array dim ({n}): the last window would run past the end"
    return ""


def plan(module: cst.Module, facts: CallFacts, loop_index: int) -> _Plan:
    """The streaming rewrite of the `loop_index`-th top-level fori_loop of the kernel of the call `facts` describes
    (declines with the reason)."""
    why = decline_reason(facts)
    check(not why, why)
    loc = Located.of(module)
    n_in = len(facts.inputs)
    _, kernel, refs = call_kernel(loc, facts, facts.num_scalar_prefetch + n_in)
    loops = fori_loops(kernel)
    check(
        0 <= loop_index < len(loops),
        f"no loop #{loop_index}: the kernel has {len(loops)} fori_loop(s) in its top-level statements",
    )
    loop = loops[loop_index]
    body = loop_body_def(kernel, loop, unroll=True)
    counter = params(body)[0].name.value
    streamed: list[tuple[str, int, tuple[_Read, ...]]] = []
    reasons: list[str] = []
    for pos in range(n_in):
        name = refs[facts.num_scalar_prefetch + pos]
        if not any(True for _ in m.findall(body, m.Name(name))):
            continue
        reads, why = _ref_uses(kernel, body, name, counter)
        why = why or _operand_reason(facts, pos)
        if why:
            reasons.append(f"`{name}`: {why}")
        else:
            streamed.append((name, pos, reads))
    check(bool(streamed), "no input the loop reads chunk by chunk" + (f" ({'; '.join(reasons)})" if reasons else ""))
    sizes = {r.size for _, _, reads in streamed for r in reads}
    check(len(sizes) == 1, f"the loop reads chunks of different sizes {sorted(sizes)}")
    chunk = sizes.pop()
    body_bound = Scope.of(statements(body)).bound | {p.name.value for p in params(body)}
    check(
        not (used_names(cst.parse_expression(chunk)) & body_bound),
        f"the chunk size `{chunk}` is computed in the loop body (it must be known where the loop starts)",
    )
    axes = []
    for name, _, reads in streamed:
        ax = {r.axis for r in reads}
        check(len(ax) == 1, f"`{name}` is read in chunks along different dims")
        axes.append(ax.pop())
    return _Plan(
        loop=loop,
        body=body,
        refs=tuple(n for n, _, _ in streamed),
        positions=tuple(p for _, p, _ in streamed),
        axes=tuple(axes),
        chunk=chunk,
        reads=tuple(r for _, _, r in streamed),
    )


@dataclass(frozen=True)
class StreamChunksPass(Pass):
    """Stream the chunks an in-kernel `jax.lax.fori_loop` reads from HBM instead of holding the whole block in
    VMEM. A kernel that gets a whole (S, D) block per grid step and walks it in chunks
    (`k = k_ref[pl.ds(j * C, C), :]` in the loop body, the online-softmax or recurrence state in the carry) keeps
    its grid and its loop, but the input stays in HBM (`memory_space=ANY`) and each iteration reads its chunk from
    a two-slot VMEM ring that DMA fills one iteration ahead (`run_scoped` buffers and semaphores). The loop's
    carry, bounds and body are unchanged but for the chunk reads; the kernel sees a ref of the old block's shape.

    The VMEM the input needs drops from two whole blocks to two chunks, so sequences too long for VMEM run. It costs
    traffic where the old block stayed resident across grid steps (a K/V block reused by every query tile is
    fetched again per tile): the model charges that, so the search takes the rewrite only where it pays or where the
    whole block does not fit. Declines where the ref is used other than by chunk reads and `.shape`, written,
    aliased, of a block that does not divide its array, or the kernel already does manual DMA. Parameters: `call`,
    `loop` (which top-level fori_loop of the kernel, in source order).
    """

    name: ClassVar[str] = "stream-chunks"
    call: int = 0
    loop: int = 0

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        if chip.is_gpu:
            return ()
        out: list[Pass] = []
        for c in ir.calls:
            if decline_reason(c):
                continue
            for i in range(_loop_count(ir.module, c)):
                try:
                    plan(ir.module, c, i)
                except PassNotApplicable:  # a loop that cannot stream is not offered (`apply` says why)
                    continue
                out.append(cls(call=c.index, loop=i))
        return tuple(out)

    def apply(self, ir: KernelIR) -> KernelIR:
        check(0 <= self.call < len(ir.calls), f"no pallas_call #{self.call}")
        facts = ir.calls[self.call]
        p = plan(ir.module, facts, self.loop)
        loc = Located.of(ir.module)
        out = replace_many(ir.module, {**_call_edits(loc, facts, p), **_kernel_edits(loc, p)})
        out, pltpu = ensure_pltpu(out)  # after the edits: it moves the lines the call's span names
        pl = pl_alias(out)
        if STREAM_LOOP not in module_names(out):
            helpers = list(cst.parse_module(HELPERS.format(pl=pl, pltpu=pltpu)).body)
            helpers[0] = helpers[0].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
            out = out.with_changes(body=[*out.body, *helpers])  # at the end: the user's lines keep their numbers
        return ir.with_module(out, self.spec())


def _loop_count(module: cst.Module, call: CallFacts) -> int:
    """How many top-level fori_loops the call's kernel has (0 when its kernel cannot be found)."""
    try:
        _, kernel, _ = call_kernel(Located.of(module), call, 0)
        return len(fori_loops(kernel))
    except PassNotApplicable:
        return 0


def _tuple(items: Iterable[str]) -> str:
    """A tuple display: `(a,)`, `(a, b)`."""
    xs = list(items)
    return f"({xs[0]},)" if len(xs) == 1 else f"({', '.join(xs)})"


def _chunk_name(taken: set[str], ref: str) -> str:
    name = f"{ref.removesuffix('_ref')}_chunk"
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _kernel_edits(loc: Located, p: _Plan) -> dict[cst.CSTNode, cst.CSTNode]:
    """The loop body takes the chunks as parameters and reads them; the loop becomes `_stream_fori_loop`."""
    taken = used_names(loc.wrapper.module)
    names = [_chunk_name(taken, r) for r in p.refs]
    subs: dict[cst.CSTNode, cst.CSTNode] = {}
    for name, reads in zip(names, p.reads, strict=True):
        for r in reads:
            elems = list(r.node.slice)
            elems[r.axis] = elems[r.axis].with_changes(slice=cst.Slice(lower=None, upper=None))
            subs[r.node] = r.node.with_changes(value=cst.Name(name), slice=elems)
    body = replace_many(cst.Module(body=[p.body]), subs).body[0]
    assert isinstance(body, cst.FunctionDef)
    extra = [cst.Param(cst.Name(n)) for n in names]
    body = body.with_changes(params=body.params.with_changes(params=[*body.params.params, *extra]))
    args = [code(a.value) for a in p.loop.args if a.keyword is None]
    args += [f"{a.keyword.value}={code(a.value)}" for a in p.loop.args if a.keyword is not None]
    streams = f"{_tuple(p.refs)}, {p.chunk}, {_tuple(str(a) for a in p.axes)}"
    loop = cst.parse_expression(f"{STREAM_LOOP}({', '.join(args[:4])}, {streams}{''.join(', ' + a for a in args[4:])})")
    return {p.body: body, p.loop: loop}


def _call_edits(loc: Located, facts: CallFacts, p: _Plan) -> dict[cst.CSTNode, cst.CSTNode]:
    """Kernel -> `_stream_kernel(kernel, in_specs, ...)`, in_specs -> `_stream_hbm(in_specs, positions)`."""
    node = find_call_node(loc, facts)
    kernel = node.args[0] if node.args and node.args[0].keyword is None else keyword(node, "kernel")
    check(kernel is not None, "cannot find the pallas_call's kernel argument")
    assert kernel is not None
    holder, ins = grid_spec_keyword(loc, node, "in_specs")
    check(ins is not None, "the call's in_specs are not written at the call or its grid spec")
    assert ins is not None
    check(
        holder is node or enclosing_function(loc, holder) is enclosing_function(loc, node),
        "the grid spec is built in another function",
    )
    positions = _tuple(str(q) for q in p.positions)
    text = (
        f"_stream_kernel({code(kernel.value)}, {code(ins.value)}, {positions}, {len(facts.grid)}, "
        f"{facts.num_scalar_prefetch})"
    )
    return {
        kernel.value: cst.parse_expression(text),
        ins.value: cst.parse_expression(f"_stream_hbm({code(ins.value)}, {positions})"),
    }
