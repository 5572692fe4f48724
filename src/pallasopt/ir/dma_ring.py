"""Manual HBM copies served by a ring of k VMEM slots: the rewrite `dma-overlap` (k = 2) and `multi-buffer` share.

A kernel that copies by hand (`make_async_copy(src_hbm.at[idx], buf, sem)`), then starts and waits on each copy with
no compute between, serializes every transfer with the compute. The ring gives `buf` and `sem` a leading dimension of
k; step t waits on slot t % k, whose copy was started k - 1 steps earlier, and starts the copy of step t + k - 1 into
the slot step t - 1 has just finished with. The first step starts the first k - 1 copies (the prologue).

The copy's source is re-evaluated for a future step by a helper: the statements before the copy that compute its
index from the grid step (`page = page_table[b, p]`) are repeated inside the helper with the future step's indices.
They may read scalar-prefetch tables (constant for the whole call) but no other ref, since a ref the kernel writes
could hold a different value k - 1 steps later.

Two scopes: `axis` runs one ring along the innermost grid axis with more than one step and restarts it wherever that
axis is at 0 (outer axes may be "parallel"); `grid` runs one ring over the whole grid in row-major order, so the
copies of the next row start before the current row ends (every moving axis must be sequential).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from ..errors import check
from .builders import rename_names
from .facts import CallFacts
from .matchers import Located, bound_names, code, free_names, grid_spec_keyword, is_call_to, program_id_axes, used_names

SCOPES = ("axis", "grid")


@dataclass(frozen=True)
class CopySite:
    var: str  # the local bound to the copy descriptor
    func: str  # `pltpu.make_async_copy` as the kernel spells it
    src: cst.BaseExpression
    dst: str
    sem: str


@dataclass(frozen=True)
class CopyBlock:
    """Consecutive top-level statements that only make, start and wait on copies, each copy waited on within."""

    first: int  # index of the block's first statement in the kernel body
    end: int  # index after its last statement
    sites: tuple[CopySite, ...]


def statements(kernel: cst.FunctionDef) -> list[cst.BaseStatement]:
    """The kernel's top-level statements."""
    return [s for s in kernel.body.body if isinstance(s, cst.BaseStatement)]


def _single(stmt: cst.CSTNode) -> cst.BaseSmallStatement | None:
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        return stmt.body[0]
    return None


def _method_of(stmt: cst.CSTNode) -> tuple[str, str] | None:
    """`(var, method)` for a statement `var.method()`."""
    small = _single(stmt)
    if isinstance(small, cst.Expr) and m.matches(
        small.value, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name()), args=[])
    ):
        func = small.value.func  # type: ignore[attr-defined]
        return func.value.value, func.attr.value
    return None


def _copy_assign(stmt: cst.CSTNode) -> CopySite | None:
    small = _single(stmt)
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return None
    target, call = small.targets[0].target, small.value
    if not isinstance(target, cst.Name) or not is_call_to(call, "make_async_copy"):
        return None
    assert isinstance(call, cst.Call)
    args = [a.value for a in call.args]
    if len(args) != 3 or any(a.keyword is not None for a in call.args):
        return None
    if not isinstance(args[1], cst.Name) or not isinstance(args[2], cst.Name):
        return None
    return CopySite(target.value, code(call.func), args[0], args[1].value, args[2].value)


def serialized_copy_blocks(kernel: cst.FunctionDef) -> list[CopyBlock]:
    """Blocks of copies started and waited on at once (no compute between a copy's start and its wait)."""
    body = statements(kernel)
    out: list[CopyBlock] = []
    i = 0
    while i < len(body):
        made: dict[str, CopySite] = {}
        state: dict[str, str] = {}
        j = i
        while j < len(body):
            site = _copy_assign(body[j])
            meth = _method_of(body[j])
            if site is not None and site.var not in made:
                made[site.var], state[site.var] = site, "made"
            elif (
                meth is not None
                and meth[0] in state
                and (state[meth[0]], meth[1])
                in (
                    ("made", "start"),
                    ("started", "wait"),
                )
            ):
                state[meth[0]] = "started" if meth[1] == "start" else "waited"
            else:
                break
            j += 1
        if made and all(s == "waited" for s in state.values()):
            out.append(CopyBlock(i, j, tuple(made.values())))
        i = max(j, i + 1)
    return out


def program_id_locals(kernel: cst.FunctionDef) -> dict[int, str]:
    """Grid axis -> the top-level local bound to `pl.program_id(axis)` (`i = pl.program_id(0)` or
    `b, p = pl.program_id(0), pl.program_id(2)`); an axis bound twice keeps its first name."""
    out: dict[int, str] = {}
    for stmt in kernel.body.body:
        small = _single(stmt)
        if not isinstance(small, cst.Assign) or len(small.targets) != 1:
            continue
        target, value = small.targets[0].target, small.value
        pairs: list[tuple[cst.BaseExpression, cst.BaseExpression]] = []
        if isinstance(target, cst.Name):
            pairs = [(target, value)]
        elif (
            isinstance(target, cst.Tuple)
            and isinstance(value, cst.Tuple)
            and len(target.elements) == len(value.elements)
        ):
            pairs = [(t.value, v.value) for t, v in zip(target.elements, value.elements, strict=True)]
        for t, v in pairs:
            if isinstance(t, cst.Name) and is_call_to(v, "program_id"):
                assert isinstance(v, cst.Call)
                arg = v.args[0].value if v.args else None
                if isinstance(arg, cst.Integer):
                    out.setdefault(int(arg.evaluated_value), t.value)
    return out


@dataclass(frozen=True)
class Ring:
    """Where the ring runs: `axes` (grid axis, its local), outermost first; `sizes` the grid's extents."""

    depth: int
    axes: tuple[tuple[int, str], ...]
    sizes: tuple[int, ...]


def ring_for(call: CallFacts, kernel: cst.FunctionDef, depth: int, scope: str) -> Ring:
    """The ring's axes for `scope`, or a decline saying why the grid does not allow it."""
    check(2 <= depth <= 8, f"depth {depth} is not between 2 and 8")
    check(scope in SCOPES, f"scope {scope!r} is not one of {', '.join(SCOPES)}")
    moving = [a for a, g in enumerate(call.grid) if g > 1]
    check(bool(moving), "the grid has no axis with more than one step")
    sem = call.dimension_semantics or ()
    ring_axes = moving[-1:] if scope == "axis" else moving
    for a in ring_axes:
        check(
            not (len(sem) > a and sem[a] in ("parallel", "core_parallel")),
            f"grid axis {a} is marked {sem[a] if len(sem) > a else ''}: a prefetch chain along it must run in order",
        )
    locals_ = program_id_locals(kernel)
    for a in ring_axes:
        check(a in locals_, f"the kernel binds no local `= pl.program_id({a})` for the ring's axis")
    return Ring(depth, tuple((a, locals_[a]) for a in ring_axes), tuple(call.grid))


def _step_statements(
    kernel: cst.FunctionDef, block: CopyBlock, ring: Ring, allowed_refs: set[str]
) -> tuple[list[cst.BaseStatement], set[str]]:
    """The statements before the block that the copies' sources need and that depend on the ring's steps (to be
    repeated for a future step), in order, with the names they bind; checked to read no ref but `allowed_refs` and
    no `pl.program_id` of a ring axis."""
    body = statements(kernel)
    steps = {name for _a, name in ring.axes}
    assigned: dict[str, tuple[int, cst.BaseStatement, set[str]]] = {}
    twice: set[str] = set()
    for k, stmt in enumerate(body[: block.first]):
        small = _single(stmt)
        target = small.targets[0].target if isinstance(small, cst.Assign) and len(small.targets) == 1 else None
        if isinstance(target, cst.Name) or (
            isinstance(target, cst.Tuple) and all(isinstance(e.value, cst.Name) for e in target.elements)
        ):
            assert isinstance(small, cst.Assign)
            for name in used_names(target):
                if name in assigned:
                    twice.add(name)
                assigned[name] = (k, stmt, free_names(small.value))
    other_bound: set[str] = set()  # names bound before the block other than by a plain `name = value`
    for stmt in body[: block.first]:
        if not any(entry[1] is stmt for entry in assigned.values()):
            other_bound |= bound_names(stmt)
    other_bound -= {p.name.value for p in kernel.params.params}  # `ref[...] = v` writes a ref, binds no local
    depends = set(steps)
    for name, (_k, _stmt, reads) in sorted(assigned.items(), key=lambda kv: kv[1][0]):
        if reads & depends and name not in steps:
            depends.add(name)
    need: set[str] = set()
    todo = [n for site in block.sites for n in free_names(site.src)]
    while todo:
        n = todo.pop()
        check(n not in other_bound or n in assigned, f"`{n}`, which the copy's index uses, is bound in a nested block")
        if n in need or n in steps or n not in depends:
            continue
        check(n not in twice, f"`{n}`, which the copy's index uses, is assigned more than once")
        need.add(n)
        todo.extend(assigned[n][2])
    stmts = list(dict.fromkeys(assigned[n][1] for n in sorted(need, key=lambda n: assigned[n][0])))
    ring_axes = {a for a, _n in ring.axes}
    for node in [*stmts, *(s.src for s in block.sites)]:
        axes = program_id_axes(node)
        check(axes is not None and not axes & ring_axes, "the copy's index calls pl.program_id of the ring's axis")
    params = {p.name.value for p in kernel.params.params}
    reads = set().union(*(free_names(s) for s in stmts), *(free_names(s.src) for s in block.sites))
    bad = sorted((reads & params) - allowed_refs)
    check(not bad, f"the copy's index reads {', '.join(bad)}: a ref that may change before the step it is fetched for")
    for site in block.sites:
        check(bool(free_names(site.src) & (need | steps)), "the copy's source does not depend on the grid step")
    return stmts, need


def rewrite_kernel(
    kernel: cst.FunctionDef, block: CopyBlock, ring: Ring, pl: str, allowed_refs: set[str]
) -> cst.FunctionDef:
    """The kernel with the block's copies served by the ring (its scratch is resized by `ring_scratch`)."""
    body = statements(kernel)
    later = set().union(*(used_names(s) for s in body[block.end :]))
    before = set().union(*(used_names(s) for s in body[: block.first]))
    for site in block.sites:
        check(site.var not in later, f"`{site.var}` is used again after its wait")
        check(site.sem not in later and site.sem not in before, f"the semaphore `{site.sem}` is used besides the copy")
        check(site.dst not in before, f"`{site.dst}` is used before it is copied into")
    stmts, _need = _step_statements(kernel, block, ring, allowed_refs)
    k = ring.depth
    names = [n for _a, n in ring.axes]
    sizes = [f"{pl}.num_programs({a})" for a, _n in ring.axes]
    pre: list[str] = []
    gap = [cst.EmptyLine(indent=False)]
    new: list[cst.BaseStatement] = []
    if len(names) == 1:
        t = names[0]
    else:  # one linear step over the ring's axes, row-major; `_ring_at` turns a future one back into indices
        t = "_ring_t"
        linear = f"{names[0]} * {sizes[1]} + {names[1]}"
        for size, n in zip(sizes[2:], names[2:], strict=True):
            linear = f"({linear}) * {size} + {n}"
        pre.append(f"{t} = {linear}\n")
        decode: list[str] = []
        rest = "_t"
        for idx in range(len(names) - 1, 0, -1):
            decode.insert(0, f"{names[idx]} = {rest} % {sizes[idx]}")
            rest = f"({rest}) // {sizes[idx]}" if rest != "_t" else f"{rest} // {sizes[idx]}"
        decode.insert(0, f"{names[0]} = {rest}")
        at_body = "".join(f"    {line}\n" for line in decode)
        at = cst.parse_statement(f"def _ring_at(_t):\n{at_body}    return {', '.join(names)}\n")
        new.append(at.with_changes(leading_lines=gap))
    total = " * ".join(sizes)
    lines = [code(s).strip() for s in stmts]
    for site in block.sites:
        helper_body = "".join(f"    {line}\n" for line in lines)
        helper = cst.parse_statement(
            f"def _{site.var}_for({', '.join(names)}, slot):\n{helper_body}"
            f"    return {site.func}({code(site.src)}, {site.dst}.at[slot], {site.sem}.at[slot])\n"
        )
        new.append(helper.with_changes(leading_lines=gap))
    slot = f"_{block.sites[0].var}_slot"
    pre.append(f"{slot} = {t} % {k}\n")
    new += [cst.parse_statement(p).with_changes(leading_lines=gap if i == 0 else []) for i, p in enumerate(pre)]

    def starts(step_expr: str, slot_expr: str, indent: str) -> str:
        if len(names) == 1:
            args = step_expr
            head = ""
        elif step_expr.isdigit() and int(step_expr) == 0:
            args, head = ", ".join("0" for _ in names), ""
        else:
            args, head = "*_at", f"{indent}_at = _ring_at({step_expr})\n"
        return head + "".join(f"{indent}_{s.var}_for({args}, {slot_expr}).start()\n" for s in block.sites)

    prime = f"@{pl}.when({t} == 0)\ndef _prime():\n" + starts("0", "0", "    ")
    for j in range(1, k - 1):
        prime += f"\n    @{pl}.when({j} < {total})\n    def _prime_{j}():\n" + starts(str(j), str(j), "        ")
    ahead = f"{t} + {k - 1}"
    prefetch = f"@{pl}.when({ahead} < {total})\ndef _prefetch_ahead():\n" + starts(ahead, f"({ahead}) % {k}", "    ")
    new.append(cst.parse_statement(prime).with_changes(leading_lines=gap))
    new.append(cst.parse_statement(prefetch).with_changes(leading_lines=gap))
    for i, s in enumerate(block.sites):
        wait = cst.parse_statement(f"_{s.var}_for({', '.join(names)}, {slot}).wait()\n")
        new.append(wait.with_changes(leading_lines=gap) if i == 0 else wait)
    renames = {}
    for s in block.sites:
        renames[s.dst] = f"_{s.var}_buf"
        new.append(cst.parse_statement(f"{renames[s.dst]} = {s.dst}.at[{slot}]\n"))
    rest_body = [rename_names(s, renames) for s in body[block.end :]]
    return kernel.with_changes(body=kernel.body.with_changes(body=body[: block.first] + new + rest_body))


def ring_scratch(
    loc: Located,
    call: cst.Call,
    facts: CallFacts,
    kernel: cst.FunctionDef,
    sites: Sequence[CopySite],
    depth: int,
    edits: dict[cst.CSTNode, cst.CSTNode],
) -> None:
    """Give each copy's VMEM buffer and DMA semaphore scratch a leading dimension of `depth`."""
    params = [p.name.value for p in kernel.params.params]
    n_scratch = len(facts.scratch)
    check(n_scratch >= 2 and len(params) >= n_scratch, "the kernel's scratch parameters do not match")
    scratch_params = params[len(params) - n_scratch :]
    _holder, arg = grid_spec_keyword(loc, call, "scratch_shapes")
    holder_val = arg.value if arg is not None else None
    check(isinstance(holder_val, cst.List | cst.Tuple), "scratch_shapes is not a literal list")
    assert isinstance(holder_val, cst.List | cst.Tuple)
    elems = [e.value for e in holder_val.elements]
    check(len(elems) == n_scratch, "scratch_shapes does not list every scratch buffer")
    seen: set[str] = set()
    for site in sites:
        check(
            site.dst in scratch_params and site.sem in scratch_params, "the copy's buffer or semaphore is not scratch"
        )
        check(site.dst not in seen and site.sem not in seen, "two copies share a buffer or a semaphore")
        seen |= {site.dst, site.sem}
        buf = elems[scratch_params.index(site.dst)]
        sem = elems[scratch_params.index(site.sem)]
        check(isinstance(buf, cst.Call) and bool(buf.args), "the buffer's scratch is not a VMEM(shape, dtype) call")
        assert isinstance(buf, cst.Call)
        shape = buf.args[0].value
        check(isinstance(shape, cst.Tuple), "the buffer's scratch shape is not a tuple")
        assert isinstance(shape, cst.Tuple)
        inner_shape = code(shape)[1:-1].rstrip(", ")
        edits[shape] = cst.parse_expression(f"({depth}, {inner_shape})")
        check(m.matches(sem, m.Attribute(attr=m.Name("DMA"))), "the semaphore is not a plain SemaphoreType.DMA")
        edits[sem] = cst.parse_expression(f"{code(sem)}(({depth},))")


def hbm_and_table_refs(call: CallFacts, kernel: cst.FunctionDef) -> set[str]:
    """The kernel's refs a future step's copy index may read: scalar-prefetch tables and raw HBM inputs."""
    params = [p.name.value for p in kernel.params.params]
    n = call.num_scalar_prefetch
    out = set(params[:n])
    for op in call.operands:
        if op.role == "in" and op.memory_space in ("any", "hbm") and n + op.position < len(params):
            out.add(params[n + op.position])
    return out


def apply_ring(module: cst.Module, facts: CallFacts, depth: int, scope: str) -> cst.Module:
    """`module` with the serialized copies of `facts`'s kernel served by a `depth`-slot ring; declines (via
    `check`) where the kernel or its grid does not allow it."""
    from .cst_edit import replace_many
    from .matchers import find_call_node, kernel_function, pl_alias

    check(facts.body.has_dma, "the kernel does no manual DMA")
    loc = Located.of(module)
    node = find_call_node(loc, facts)
    kernel = kernel_function(loc, node)
    check(kernel is not None, "cannot find the kernel function")
    assert kernel is not None
    blocks = serialized_copy_blocks(kernel)
    check(len(blocks) == 1, "no single block of copies that are started and waited on at once")
    ring = ring_for(facts, kernel, depth, scope)
    edits: dict[cst.CSTNode, cst.CSTNode] = {
        kernel: rewrite_kernel(kernel, blocks[0], ring, pl_alias(module), hbm_and_table_refs(facts, kernel))
    }
    ring_scratch(loc, node, facts, kernel, blocks[0].sites, depth, edits)
    return replace_many(loc.wrapper.module, edits)
