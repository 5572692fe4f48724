"""What one function body binds, read from its source without running it: the locals assigned exactly once (and to
what), the names bound any other way or more than once, where each is bound, and the locals that stand for
`program_id(axis)`. The skip-masked passes read iota masks through these names (see `mask_bounds.Reader`).

Python scoping, read statically: a nested `def` or `lambda` is its own scope (only the `def`'s name is bound here,
plus the names it declares `nonlocal`); a store into a ref or an attribute (`o_ref[...] = x`, `a.b = x`) binds no
name; `for`, `with ... as`, `except ... as`, `import`, augmented, annotated and `:=` assignments bind their names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import libcst as cst
import libcst.matchers as m

from ..errors import check
from .matchers import is_call_to


def statements(fn: cst.FunctionDef) -> list[cst.BaseStatement]:
    """The function's top-level statements (declines a one-line def)."""
    check(isinstance(fn.body, cst.IndentedBlock), f"`{fn.name.value}` is a one-line def")
    assert isinstance(fn.body, cst.IndentedBlock)
    return [s for s in fn.body.body if isinstance(s, cst.BaseStatement)]


def params(fn: cst.FunctionDef) -> list[cst.Param]:
    """The function's named parameters, in order (positional-only, positional, keyword-only)."""
    return [*fn.params.posonly_params, *fn.params.params, *fn.params.kwonly_params]


def _target_names(target: cst.CSTNode) -> list[str]:
    """Names an assignment target binds: a name, or the names of a (starred, nested) tuple or list of targets."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, cst.Tuple | cst.List):
        return [n for e in target.elements for n in _target_names(e.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return []  # a subscript or attribute store binds no name


def _binds(node: cst.CSTNode) -> list[str]:
    """Names `node` binds in the scope that holds it, one entry a binding (of a nested def or class only its name,
    and the names the def declares `nonlocal`)."""
    if isinstance(node, cst.FunctionDef | cst.ClassDef):
        declared = [d for d in m.findall(node.body, m.Nonlocal()) if isinstance(d, cst.Nonlocal)]
        return [node.name.value, *(item.name.value for d in declared for item in d.names)]
    if isinstance(node, cst.Lambda):
        return []
    here: list[str] = []
    if isinstance(node, cst.Assign):
        here = [n for t in node.targets for n in _target_names(t.target)]
    elif isinstance(node, cst.AugAssign | cst.AnnAssign | cst.For | cst.NamedExpr):
        here = _target_names(node.target)
    elif isinstance(node, cst.AsName):
        here = _target_names(node.name)
    elif isinstance(node, cst.Import | cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
        here = [a.evaluated_name.split(".")[0] for a in node.names if a.asname is None]
    return here + [n for child in node.children for n in _binds(child)]


def _assigns(stmts: list[cst.BaseStatement]) -> list[tuple[cst.BaseExpression, cst.BaseExpression, bool]]:
    """(target, value, plain) of each top-level assignment with one target, in source order; a tuple assignment of
    equal lengths is split into one per element (`i, j = a, b`: `i = a` and `j = b`, not plain)."""
    out: list[tuple[cst.BaseExpression, cst.BaseExpression, bool]] = []
    for s in stmts:
        for small in s.body if isinstance(s, cst.SimpleStatementLine) else ():
            if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
                continue
            t, v = small.targets[0].target, small.value
            if isinstance(t, cst.Tuple) and isinstance(v, cst.Tuple) and len(t.elements) == len(v.elements):
                if not any(isinstance(e, cst.StarredElement) for e in (*t.elements, *v.elements)):
                    out += [(a.value, b.value, False) for a, b in zip(t.elements, v.elements, strict=True)]
            else:
                out.append((t, v, True))
    return out


def _shape_unpacks(stmts: list[cst.BaseStatement]) -> list[tuple[str, cst.BaseExpression]]:
    """`rows, keys = x.shape` at the top level, as (`rows`, `x.shape[0]`), (`keys`, `x.shape[1]`)."""
    out: list[tuple[str, cst.BaseExpression]] = []
    for s in stmts:
        for small in s.body if isinstance(s, cst.SimpleStatementLine) else ():
            if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
                continue
            t, v = small.targets[0].target, small.value
            if not (isinstance(t, cst.Tuple) and isinstance(v, cst.Attribute) and v.attr.value == "shape"):
                continue
            if all(isinstance(e, cst.Element) and isinstance(e.value, cst.Name) for e in t.elements):
                for k, e in enumerate(t.elements):
                    assert isinstance(e.value, cst.Name)
                    index = cst.SubscriptElement(cst.Index(cst.Integer(str(k))))
                    out.append((e.value.value, cst.Subscript(v, [index])))
    return out


def _pid_axis(value: cst.BaseExpression) -> int | None:
    arg = value.args[0].value if isinstance(value, cst.Call) and len(value.args) == 1 else None
    return int(arg.evaluated_value) if is_call_to(value, "program_id") and isinstance(arg, cst.Integer) else None


@dataclass(frozen=True)
class Scope:
    """The names one function body (its top-level statements) binds."""

    env: Mapping[str, cst.BaseExpression]  # bound exactly once, by a top-level `name = value`: name -> value
    bound: frozenset[str]  # every name bound here, any way
    rebound: frozenset[str]  # names bound more than once
    sites: Mapping[str, tuple[int, ...]]  # name -> indices of the top-level statements that bind it
    pids: Mapping[str, int]  # bound exactly once, at the top level, to `program_id(axis)`: name -> axis
    # `env` plus the names bound once by a tuple assignment (`tq, S = r.shape[2], r.shape[3]`) whose values read
    # none of that statement's targets (so each name is its value, not a swap)
    values: Mapping[str, cst.BaseExpression] = field(default_factory=dict)

    @classmethod
    def of(cls, stmts: list[cst.BaseStatement]) -> Scope:
        sites: dict[str, tuple[int, ...]] = {}
        for i, stmt in enumerate(stmts):
            for name in _binds(stmt):
                sites[name] = (*sites.get(name, ()), i)
        once = {n for n, at in sites.items() if len(at) == 1}
        single = [(t.value, v, plain) for t, v, plain in _assigns(stmts) if isinstance(t, cst.Name) and t.value in once]
        env = {name: v for name, v, plain in single if plain}  # that assignment is the name's only binding
        pids = {name: axis for name, v, _ in single if (axis := _pid_axis(v)) is not None}
        rebound = frozenset(n for n, at in sites.items() if len(at) > 1)
        pairs = {name: v for name, v, plain in single if not plain}
        pairs.update((name, v) for name, v in _shape_unpacks(stmts) if name in once)
        read = {n.value for v in pairs.values() for n in m.findall(v, m.Name()) if isinstance(n, cst.Name)}
        values = {**{k: v for k, v in pairs.items() if not (read & set(pairs))}, **env}
        return cls(env, frozenset(sites), rebound, sites, pids, values)

    @property
    def opaque(self) -> frozenset[str]:
        """Names bound here whose value the scope does not pin to one expression (bound twice, or not by a plain
        top-level assignment)."""
        return self.bound - set(self.env)

    def bound_in(self, start: int, stop: int) -> set[str]:
        """Names bound by the top-level statements `start` to `stop - 1`."""
        return {n for n, at in self.sites.items() if any(start <= i < stop for i in at)}

    def pid_locals(self, stop: int | None = None) -> dict[int, str]:
        """Locals that alias `program_id(axis)` (`i = pl.program_id(0)`, `i, j = pl.program_id(0), ...`), bound by
        the top-level statements before `stop` (all when None), by axis: the first one of each axis."""
        out: dict[int, str] = {}
        for name, axis in self.pids.items():  # in source order
            if stop is None or self.sites[name][0] < stop:
                out.setdefault(axis, name)
        return out


# The loop the `stream-chunks` pass writes: `_stream_fori_loop(lower, upper, body, init, refs, chunk, axes)` runs
# `body(j, carry, *chunks)`; passes that narrow or read a loop's bounds treat it as a fori_loop.
STREAM_LOOP = "_stream_fori_loop"


def fori_loops(kernel: cst.FunctionDef, streamed: bool = False) -> list[cst.Call]:
    """The `fori_loop(lower, upper, body, init)` calls written in the kernel's own top-level statements (with
    `streamed`, the `_stream_fori_loop` calls too)."""
    names = ("fori_loop", STREAM_LOOP) if streamed else ("fori_loop",)
    out: list[cst.Call] = []
    for stmt in statements(kernel):
        if isinstance(stmt, cst.SimpleStatementLine):
            out += [
                c for c in m.findall(stmt, m.Call()) if isinstance(c, cst.Call) and any(is_call_to(c, n) for n in names)
            ]
    return out


def loop_body_def(kernel: cst.FunctionDef, loop: cst.Call, unroll: bool = False) -> cst.FunctionDef:
    """The function a `fori_loop(lower, upper, body, init)` (or `_stream_fori_loop`) of the kernel runs: a def in
    the kernel taking (index, carry) (then the chunks, for a streamed loop); declines any other form, and an
    `unroll=` keyword unless `unroll` (jax unrolls only a loop whose bounds are static)."""
    streamed = is_call_to(loop, STREAM_LOOP)
    positional = [a for a in loop.args if a.keyword is None]
    keywords = {a.keyword.value for a in loop.args if a.keyword is not None}
    check(
        len(positional) == (7 if streamed else 4) and not any(a.star for a in loop.args) and keywords <= {"unroll"},
        "the fori_loop is not (lo, hi, body, init[, unroll=...])",
    )
    check(unroll or not keywords, "the fori_loop is unrolled (`unroll=`): jax unrolls only a loop with static bounds")
    body = loop.args[2].value
    check(isinstance(body, cst.Name), "the loop body is not a function named in the kernel")
    assert isinstance(body, cst.Name)
    defs = [s for s in statements(kernel) if isinstance(s, cst.FunctionDef) and s.name.value == body.value]
    check(len(defs) == 1, f"the loop body `{body.value}` is not defined once in the kernel")
    n = len(params(defs[0]))
    check(n > 2 if streamed else n == 2, f"`{body.value}` does not take (index, carry)")
    return defs[0]
