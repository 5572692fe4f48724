"""How far the epilogue pass reaches past the function applying a pallas_call: an operand read after a reshape
of the call's result, brought back to the call's output layout (exact cases only), and a caller's epilogue on a
helper's returned result, moved into the helper (or a copy of it for that call site). CST only; the pass traces."""

from __future__ import annotations

import math
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m

from ..errors import PassNotApplicable, check
from .builders import fresh_name, substitute
from .cst_edit import keyword_arg, with_keyword_only
from .epilogue import Epilogue, find_epilogue, follow, leaves, settings
from .matchers import (
    Located,
    bound_names,
    code,
    enclosing_function,
    free_names,
    is_self_assign,
    module_names,
    partial_aliases,
    used_names,
)


@dataclass(frozen=True)
class OperandLayout:
    """Statements that bring an operand (already bound to its name) to the output's layout, and its shape there
    (rank-aligned with the output later)."""

    lines: tuple[str, ...]
    shape: tuple[int, ...]


def to_output_layout(
    name: str,
    text: str,
    shape: tuple[int, ...],
    reshaped: tuple[int, ...] | None,
    out: tuple[int, ...],
    out_text: str,
    jnp: str,
) -> OperandLayout:
    """Operand `name` (`text`, traced `shape`) broadcasts against the reshaped result (`reshaped`); the same
    operand in the layout of the call's output (`out`), when that is exact without materializing a broadcast:
    full-sized (any reshape: the row-major order is kept), or only broadcast along a common trailing part of the
    two shapes with the leading dims (the ones the reshape splits or merges) all full or all 1. The statements
    are written in shapes (`out_text`: the call's out_shape expression), not in the traced sizes."""
    check(reshaped is not None, "internal: no reshaped shape traced")
    assert reshaped is not None
    check(len(shape) <= len(reshaped), f"operand {text} of shape {shape} has more dims than the reshaped result")
    aligned = (1,) * (len(reshaped) - len(shape)) + tuple(shape)
    if aligned == tuple(reshaped):
        return OperandLayout((f"{name} = {jnp}.reshape({name}, ({out_text}).shape)\n",), out)
    s = 0  # the common trailing dims of the output and the reshaped result
    while s < min(len(out), len(reshaped)) and out[len(out) - 1 - s] == reshaped[len(reshaped) - 1 - s]:
        s += 1
    lead_r, lead_o = len(reshaped) - s, len(out) - s
    assert math.prod(out[:lead_o]) == math.prod(reshaped[:lead_r])
    tail = aligned[lead_r:]
    if all(d == 1 for d in aligned[:lead_r]):
        if len(shape) <= s:  # the operand lies in the trailing dims: rank alignment is all it needs
            return OperandLayout((), tuple(shape))
        return OperandLayout((f"{name} = {jnp}.reshape({name}, {jnp}.shape({name})[{len(shape) - s}:])\n",), tail)
    check(
        aligned[:lead_r] == tuple(reshaped[:lead_r]),
        f"operand {text} of shape {shape} broadcasts along the dims the reshape {out} -> {reshaped} splits or merges",
    )
    new = tuple(out[:lead_o]) + tail
    shape_text = f"({out_text}).shape[:{lead_o}] + {jnp}.shape({name})[{lead_r}:]"
    return OperandLayout((f"{name} = {jnp}.reshape({name}, {shape_text})\n",), new)


@dataclass(frozen=True)
class Sunk:
    """The module with a caller's epilogue moved into function `helper` (the original, or a copy when `copied`)."""

    module: cst.Module
    helper: str
    copied: bool


def sink_into_helper(loc: Located, apply: cst.Call, occurrence: int = 0, traced: int = 1) -> Sunk:
    """`def h(..): ...; return pallas_call(..)(..)` (the value returned as it is, maybe through local names and
    a reshape) and a caller `y = h(..); return relu(y + b)`: the caller passes `b` to `h` (a new keyword-only
    parameter) and `h` ends `_y = <its value>; _y = _y + b; return relu(_y)`, where the pass can take it. A helper
    named more than once in the module gets a copy for this call site, so the other callers are untouched.

    The call is the `occurrence`-th of the `traced` calls this pallas_call made; with several call sites, it is
    told to come from the site of that rank only when every site is a plain statement of one function (run in
    source order), else this declines."""
    module = loc.wrapper.module
    helper = follow(loc, apply).fn
    name = helper.name.value
    if loc.parent(helper) is not module:
        owner = loc.parent(loc.parent(helper) or helper)
        where = f"method {owner.name.value}.{name}" if isinstance(owner, cst.ClassDef) else f"nested function {name}"
        check(
            False,
            f"the {where} returns the call's value as it is (callers of methods and nested functions are not followed)",
        )
    returns = [r for r in m.findall(helper, m.Return()) if isinstance(r, cst.Return)]
    body = helper.body
    assert isinstance(body, cst.IndentedBlock)
    last = body.body[-1]
    check(
        len(returns) == 1 and isinstance(last, cst.SimpleStatementLine) and last.body[0] is returns[0],
        f"{name} has several returns or returns before its end",
    )
    ret = returns[0]
    assert ret.value is not None
    aliases = partial_aliases(module, name)  # `down = functools.partial(_down, tm=128)`: callers say `down(..)`
    callees = {name, *aliases}
    sites = [c for c in m.findall(module, m.Call(func=m.Name())) if isinstance(c, cst.Call) and _callee(c) in callees]
    check(bool(sites), f"the entry returns the call's value as it is ({name} is not called by name in this module)")
    sites.sort(key=loc.start)
    via = {n for n in map(_callee, sites) if n is not None} - {name}
    if via:
        uses = [n for n in m.findall(module, m.Name()) if isinstance(n, cst.Name) and n.value in callees]
        # Named only where it is bound: the def, each alias's target and the name it binds, and the one call site.
        check(
            len(sites) == 1 and len(uses) == 2 + 2 * len(aliases),
            f"{name} is called through {', '.join(sorted(via))}, which is named elsewhere too: moving an epilogue "
            "into it would change the other uses",
        )
    if len(sites) > 1:
        fns = {id(follow_fn(loc, c)) for c in sites}
        plain = all(_statement_of(loc, c) in _body(follow_fn(loc, c)) for c in sites)
        check(
            traced == len(sites) and len(fns) == 1 and plain,
            f"{name} is called from {len(sites)} places and the call was traced {traced} times: cannot tell which "
            "call site made it",
        )
    site = sites[occurrence if len(sites) > 1 else 0]
    try:
        epi = find_epilogue(loc, site)
    except PassNotApplicable as e:
        raise PassNotApplicable(f"the caller of {name} (line {loc.start(site)[0]}): {e.reason}") from None
    check(epi.reshape is None, f"the caller of {name} reshapes its result before the epilogue")
    return _move(loc, helper, ret, site, epi, copied=len(_references(module, helper)) > 1)


def _callee(call: cst.Call) -> str | None:
    return call.func.value if isinstance(call.func, cst.Name) else None


def follow_fn(loc: Located, node: cst.CSTNode) -> cst.FunctionDef | None:
    return enclosing_function(loc, node)


def _statement_of(loc: Located, node: cst.CSTNode) -> cst.CSTNode | None:
    cur: cst.CSTNode | None = node
    while cur is not None and not isinstance(cur, cst.SimpleStatementLine | cst.BaseCompoundStatement):
        cur = loc.parent(cur)
    return cur


def _body(fn: cst.FunctionDef | None) -> list[cst.CSTNode]:
    if fn is None or not isinstance(fn.body, cst.IndentedBlock):
        return []
    return list(fn.body.body)


def _references(module: cst.Module, helper: cst.FunctionDef) -> list[cst.Name]:
    """Where the module names `helper` (its own `def` line aside)."""
    name = helper.name.value
    return [n for n in m.findall(module, m.Name(name)) if isinstance(n, cst.Name) and n is not helper.name]


def _move(loc: Located, helper: cst.FunctionDef, ret: cst.Return, site: cst.Call, epi: Epilogue, copied: bool) -> Sunk:
    module = loc.wrapper.module
    used = used_names(module)
    target = fresh_name(used, helper.name.value + "_epilogue") if copied else None
    # Settings that read the caller's locals (`.astype(x.dtype)`) travel as keyword-only parameters too.
    caller_local = bound_names(epi.fn.body) | {p.name.value for p in epi.fn.params.params}
    local_settings = {
        code(s): s for r in epi.regions for s in settings(loc, r.top, r.uses) if free_names(s) & caller_local
    }
    passed = [*epi.operands, *local_settings.values()]
    ops = [fresh_name(used, f"_ce{i}") for i in range(len(passed))]
    value = fresh_name(used | set(ops), "_y")
    leaf_of = {code(e): n for e, n in zip(passed, ops, strict=True)}

    # Static leaves stay as written: module names the helper must see as the caller does.
    helper_local = bound_names(helper.body) | {p.name.value for p in helper.params.params}
    # What each region reads besides its uses: operand leaves and settings, found once for both loops below.
    reads = [[*leaves(loc, r.top, r.uses), *settings(loc, r.top, r.uses)] for r in epi.regions]
    statics = set()
    for found in reads:
        for leaf in found:
            if code(leaf) not in leaf_of:
                statics |= free_names(leaf)
    clash = statics & helper_local
    check(not clash, f"the epilogue's names {sorted(clash)} mean something else inside {helper.name.value}")
    check(statics <= module_names(module), f"the epilogue reads {sorted(statics)}, which the helper cannot see")

    # The helper: keyword-only parameters for the operands, the epilogue on its returned value.
    assert ret.value is not None
    lines = [f"{value} = {code(ret.value)}\n"]
    for r, found in zip(epi.regions, reads, strict=True):
        mapping: dict[cst.CSTNode, cst.CSTNode] = {u: cst.Name(value) for u in r.uses}
        for leaf in found:
            if code(leaf) in leaf_of:
                mapping[leaf] = cst.Name(leaf_of[code(leaf)])
        lines.append(f"{value} = {code(substitute(r.top, mapping)).strip()}\n")
    stmts = [cst.parse_statement(t) for t in lines] + [cst.parse_statement(f"return {value}\n")]
    body = helper.body
    assert isinstance(body, cst.IndentedBlock)
    new_body = body.with_changes(body=[*body.body[:-1], *stmts])
    new_helper = helper.with_changes(params=with_keyword_only(helper.params, ops), body=new_body)
    if target is not None:
        new_helper = new_helper.with_changes(name=cst.Name(target))

    # The caller: the operands computed before the statement holding the call, the call given them, each
    # region giving way to its input.
    fn = epi.fn
    fbody = fn.body
    assert isinstance(fbody, cst.IndentedBlock)
    new_site = site.with_changes(
        func=cst.Name(target) if target is not None else site.func,
        args=[*site.args, *(keyword_arg(n, cst.Name(n)) for n in ops)],
    )
    edits: dict[cst.CSTNode, cst.CSTNode] = {}
    for r in epi.regions:
        edits[r.top] = new_site if r.uses[0] is site else cst.Name(code(r.uses[0]))
    if epi.regions[0].uses[0] is not site:
        edits[site] = new_site
    stmts_c = list(fbody.body)
    at = epi.first
    assigns = [cst.parse_statement(f"{n} = {code(e)}\n") for n, e in zip(ops, passed, strict=True)]
    out: list[cst.BaseStatement] = []
    for i, st in enumerate(stmts_c):
        if i == at:
            out.extend(assigns)  # type: ignore[arg-type]
        new = substitute(st, edits)
        if not is_self_assign(new):
            out.append(new)
    new_fn = fn.with_changes(body=fbody.with_changes(body=out))

    # The module: the caller edited; the helper replaced, or its copy placed right after it.
    top: list[cst.CSTNode] = []
    for st in module.body:
        if st is fn:
            top.append(new_fn)
        elif st is helper and target is not None:
            top += [st, new_helper.with_changes(leading_lines=[cst.EmptyLine(indent=False)] * 2)]
        elif st is helper:
            top.append(new_helper)
        else:
            top.append(_replace_inside(st, fn, new_fn) if fn in _descendants(st) else st)
    return Sunk(module.with_changes(body=top), target or helper.name.value, target is not None)


def _descendants(node: cst.CSTNode) -> set[cst.CSTNode]:
    out: set[cst.CSTNode] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        out.add(n)
        stack.extend(n.children)
    return out


def _replace_inside(node: cst.CSTNode, old: cst.CSTNode, new: cst.CSTNode) -> cst.CSTNode:
    return substitute(node, {old: new})
