"""Read-only libcst lookups every pass may use: find a pallas_call and its parts, look up import aliases, the names
an expression reads or a block binds, the grid axes a body's program_id calls use.

This module is the bottom of the CST layer: it imports nothing else from `ir/` but `facts`; `builders.py` (new
names, renaming, tuple and index-map expressions), `cst_edit.py` (the editing helpers) and `knobs.py` build on it. A helper that more than one pass needs lives here or in `cst_edit.py`,
never as a private name one pass imports from another.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider

from ..errors import check
from .facts import CallFacts

Pos = tuple[int, int]  # (line, column) of a node's start, 1-based line, 0-based column

PALLAS = "jax.experimental.pallas"
PALLAS_TPU = "jax.experimental.pallas.tpu"
JAX_NUMPY = "jax.numpy"


def code(node: cst.CSTNode) -> str:
    """The source text of one node."""
    return cst.Module([]).code_for_node(node)


@dataclass(frozen=True)
class Located:
    """A module wrapped with position and parent metadata, resolved once per module object.

    The search applies every choice of a pass to the same state module, and each application (and each knob lookup)
    asks for that module's metadata; resolving it was most of the candidate expansion time (issue 16: 22 of 38 s on
    the matmul example). libcst modules are immutable and the wrapper does not copy (`unsafe_skip_copy`), so the
    metadata of one module object never changes: `of` keeps the last `LOCATED_CACHE` of them (keyed by identity,
    the module held so its id is not reused). The mappings are shared: read them, never change them.
    """

    wrapper: MetadataWrapper

    @functools.cached_property
    def positions(self) -> Mapping[cst.CSTNode, object]:
        """Resolved on first use (it renders the whole module): an edit that only walks the tree never pays it."""
        return self.wrapper.resolve(PositionProvider)

    @functools.cached_property
    def calls(self) -> tuple[cst.Call, ...]:
        """The module's `pallas_call(...)` nodes in source order."""
        return _pallas_calls(self.wrapper.module)

    @functools.cached_property
    def parents(self) -> Mapping[cst.CSTNode, cst.CSTNode]:
        return self.wrapper.resolve(ParentNodeProvider)

    @staticmethod
    def of(module: cst.Module) -> Located:
        with _LOCATED_LOCK:
            hit = _LOCATED.get(id(module)) if LOCATED_CACHE > 0 else None
            if hit is not None and hit[0] is module:
                _LOCATED.move_to_end(id(module))
                return hit[1]
        wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
        loc = Located(wrapper=wrapper)
        with _LOCATED_LOCK:
            _LOCATED[id(module)] = (module, loc)
            while len(_LOCATED) > LOCATED_CACHE:
                _LOCATED.popitem(last=False)
        return loc

    def start(self, node: cst.CSTNode) -> Pos:
        rng = self.positions[node]
        return (rng.start.line, rng.start.column)  # type: ignore[attr-defined]

    def end_line(self, node: cst.CSTNode) -> int:
        return int(self.positions[node].end.line)  # type: ignore[attr-defined]

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self.parents.get(node)


LOCATED_CACHE = 64  # modules whose metadata `Located.of` keeps (a beam's states and the edits in flight)
_LOCATED: OrderedDict[int, tuple[cst.Module, Located]] = OrderedDict()
_LOCATED_LOCK = threading.Lock()


# --- import aliases ----------------------------------------------------------------------------------------------


def _imports(module: cst.Module) -> list[cst.Import | cst.ImportFrom]:
    """The top-level import statements of a module (inside `if TYPE_CHECKING:` or functions do not count)."""
    out: list[cst.Import | cst.ImportFrom] = []
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            out.extend(s for s in stmt.body if isinstance(s, cst.Import | cst.ImportFrom))
    return out


def module_alias(module: cst.Module, dotted: str, through_parent: bool = True) -> str | None:
    """The expression the module can use to reach module `dotted` (e.g. "jax.numpy"), under every import form:
    `import jax.numpy as jnp` -> "jnp"; `from jax import numpy as np_` -> "np_"; `from jax import numpy` -> "numpy";
    `import jax.numpy` or just `import jax` -> "jax.numpy"; `import jax as j` -> "j.numpy". None when not imported.
    An exact import wins over reaching the module through a parent package; `through_parent=False` accepts only
    exact imports (a parent package need not load the submodule, as `import jax` does not load Pallas)."""
    head, _, last = dotted.rpartition(".")
    via_parent: str | None = None
    for imp in _imports(module):
        if isinstance(imp, cst.ImportFrom):
            if isinstance(imp.names, cst.ImportStar) or imp.module is None or imp.relative:
                continue
            if code(imp.module) != head:
                continue
            for a in imp.names:
                if code(a.name) == last:
                    return a.asname.name.value if a.asname else last  # type: ignore[union-attr]
            continue
        for a in imp.names:
            name = code(a.name)
            if name == dotted:
                return a.asname.name.value if a.asname else dotted  # type: ignore[union-attr]
            if not through_parent or via_parent is not None:
                continue
            if a.asname is not None and dotted.startswith(name + "."):  # `import jax as j` -> `j.numpy`
                via_parent = a.asname.name.value + dotted[len(name) :]  # type: ignore[union-attr]
            elif a.asname is None and name.split(".")[0] == dotted.split(".")[0]:
                via_parent = dotted  # `import jax.experimental` binds `jax`, which reaches `jax.numpy`
    return via_parent


def pl_alias(module: cst.Module) -> str:
    """The name for `jax.experimental.pallas` (default "pl" when the module does not import it)."""
    return module_alias(module, PALLAS, through_parent=False) or "pl"


def pltpu_alias(module: cst.Module) -> str | None:
    """The name for `jax.experimental.pallas.tpu`, if the module imports it (a bare `import jax` does not load it)."""
    return module_alias(module, PALLAS_TPU, through_parent=False)


def jnp_alias(module: cst.Module) -> str | None:
    """The name for `jax.numpy`, if the module can reach it (`import jax` is enough)."""
    return module_alias(module, JAX_NUMPY)


# --- locating a pallas_call and its parts ---------------------------------------------------------------------


def is_pallas_call(node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and (
        m.matches(node.func, m.Attribute(attr=m.Name("pallas_call"))) or m.matches(node.func, m.Name("pallas_call"))
    )


def pallas_call_nodes(loc: Located) -> list[cst.Call]:
    """The module's `pallas_call(...)` nodes in source order (found once per module: `Located.calls`)."""
    return list(loc.calls)


def _pallas_calls(module: cst.Module) -> tuple[cst.Call, ...]:
    found: list[cst.Call] = []

    class Finder(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            if is_pallas_call(node):
                found.append(node)

    module.visit(Finder())
    return tuple(found)


def find_call_node(loc: Located, call: CallFacts) -> cst.Call:
    """The `pallas_call(...)` node that produced `call` (declines when the span is unknown or ambiguous)."""
    check(
        call.library_site is None,
        f"call {call.index}'s pallas_call is in a library ({call.library_site}): only the values this file passes "
        "to it can change",
    )
    check(call.span is not None, "the traced call has no source location")
    assert call.span is not None
    first, last = call.span
    inside = [n for n in pallas_call_nodes(loc) if first <= loc.start(n)[0] <= last]
    check(len(inside) == 1, f"cannot tell which pallas_call on lines {first}-{last} made call {call.index}")
    return inside[0]


def keyword(call: cst.Call, name: str) -> cst.Arg | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def enclosing_function(loc: Located, node: cst.CSTNode) -> cst.FunctionDef | None:
    cur: cst.CSTNode | None = loc.parent(node)
    while cur is not None and not isinstance(cur, cst.FunctionDef):
        cur = loc.parent(cur)
    return cur


def resolve_local(loc: Located, at: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """The expression last assigned to `name` in the function enclosing `at` (or the module), before `at`."""
    fn = enclosing_function(loc, at)
    scope: cst.CSTNode = fn if fn is not None else loc.wrapper.module
    target_line = loc.start(at)[0]
    best: tuple[int, cst.BaseExpression] | None = None

    class Finder(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            nonlocal best
            for t in node.targets:
                if m.matches(t.target, m.Name(name)):
                    line = loc.start(node)[0]
                    if line < target_line and (best is None or line > best[0]):
                        best = (line, node.value)

    scope.visit(Finder())
    return best[1] if best else None


def resolve(loc: Located, at: cst.CSTNode, expr: cst.BaseExpression | None, hops: int = 5) -> cst.BaseExpression | None:
    """Follow local names (`specs = [...]; in_specs=specs`) to the expression they were last assigned."""
    seen = 0
    while isinstance(expr, cst.Name) and seen < hops:
        expr = resolve_local(loc, at, expr.value)
        seen += 1
    return expr


def spec_list(loc: Located, call: cst.Call, key: str) -> list[cst.BaseExpression | None]:
    """The elements of a pallas_call's `in_specs` / `out_specs` (or the `grid` value itself), given directly or in its
    `grid_spec=GridSpec(...)`, each followed through local names; [] when absent. A single spec is a one-item list."""
    holder: cst.Call = call
    arg = keyword(call, key)
    if arg is None:
        gs = keyword(call, "grid_spec")
        gs_val = resolve(loc, call, gs.value) if gs is not None else None
        if isinstance(gs_val, cst.Call):
            holder = gs_val
            arg = keyword(gs_val, key)
    if arg is None:
        return []
    val = resolve(loc, holder, arg.value)
    if isinstance(val, cst.List | cst.Tuple) and key != "grid":
        return [resolve(loc, holder, e.value) for e in val.elements]
    return [val]


def spec_nodes(loc: Located, call: cst.Call) -> list[cst.BaseExpression | None]:
    """The BlockSpec expressions of a pallas_call in operand order (inputs then outputs; None where unknown)."""
    return spec_list(loc, call, "in_specs") + spec_list(loc, call, "out_specs")


def grid_spec_keyword(loc: Located, call: cst.Call, key: str) -> tuple[cst.Call, cst.Arg | None]:
    """A pallas_call keyword (`grid`, `scratch_shapes`, ...) given directly or inside its `grid_spec=GridSpec(...)`:
    the call that holds it and the argument (None when absent)."""
    arg = keyword(call, key)
    if arg is None:
        gs = keyword(call, "grid_spec")
        val = gs.value if gs is not None else None
        while isinstance(val, cst.Name):
            val = resolve_local(loc, call, val.value)
        if isinstance(val, cst.Call):
            return val, keyword(val, key)
    return call, arg


def spec_site(
    loc: Located, node: cst.Call, operand: int, n_operands: int, n_inputs: int | None = None
) -> tuple[cst.CSTNode, cst.Call]:
    """Where operand `operand`'s new BlockSpec goes (index into inputs then outputs; its element of an in_specs or
    out_specs list in place, so a spec shared with other operands is left to them; else the spec itself, when not
    shared) and the spec it starts from. `n_inputs` (default: every operand is an input) tells outputs apart."""
    specs = spec_nodes(loc, node)
    check(len(specs) == n_operands, "cannot read every BlockSpec")
    spec = specs[operand]
    check(is_blockspec(spec), f"operand {operand}'s spec is not a BlockSpec(...)")
    assert isinstance(spec, cst.Call)
    n_in = n_operands if n_inputs is None else n_inputs
    key, position = ("in_specs", operand) if operand < n_in else ("out_specs", operand - n_in)
    _, arg = grid_spec_keyword(loc, node, key)
    if arg is not None and isinstance(arg.value, cst.List | cst.Tuple) and len(arg.value.elements) > position:
        return arg.value.elements[position].value, spec
    check(sum(s is spec for s in specs) == 1, "the BlockSpec is shared with another operand")
    return spec, spec


def kernel_function(loc: Located, call: cst.Call) -> cst.FunctionDef | None:
    """The module-level function a pallas_call runs as its kernel (directly or through functools.partial)."""
    kernel, forwarder = kernel_path(loc, call)
    return kernel if forwarder is None else None


def kernel_body(loc: Located, call: cst.Call) -> cst.FunctionDef | None:
    """The function whose body runs as the call's kernel, also behind a forwarding lambda (`kernel_path`): for
    rewrites that read or edit the body only, never its parameters."""
    return kernel_path(loc, call)[0]


def bound_values(loc: Located, call: cst.Call) -> dict[str, cst.BaseExpression]:
    """The values the wrapper binds to the kernel's parameters that are not refs, in the wrapper's terms: the
    keywords of a `functools.partial(kernel, k=v, ...)`, or of a forwarding lambda (`kernel_path`) and the values it
    passes positionally after the refs (by the function's parameter names)."""
    first = call.args[0].value if call.args and call.args[0].keyword is None else None
    first = resolve(loc, call, first)
    if isinstance(first, cst.Call) and is_call_to(first, "partial"):
        return {a.keyword.value: a.value for a in first.args if a.keyword is not None}
    kernel, forwarder = kernel_path(loc, call)
    if kernel is None or forwarder is None:
        return {}
    body = forwarder.body
    assert isinstance(body, cst.Call)
    n = len(forwarder.params.params)
    names = [p.name.value for p in kernel.params.params]
    out = {a.keyword.value: a.value for a in body.args[n:] if a.keyword is not None}
    extra = [a.value for a in body.args[n:] if a.keyword is None]
    out.update({name: v for name, v in zip(names[n:], extra, strict=False)})
    return out


def kernel_path(loc: Located, call: cst.Call) -> tuple[cst.FunctionDef | None, cst.Lambda | None]:
    """The kernel function of a pallas_call (`kernel_function`), also when reached through a `forwarding_lambda`
    (`kernel = lambda x_ref, o_ref: _kernel(x_ref, o_ref, taps=K)`), and that lambda (None when there is none). A
    rewrite that adds a ref to the function must add it to the lambda too (`cst_edit.forward_new_ref`)."""
    first = call.args[0].value if call.args and call.args[0].keyword is None else None
    if first is None:
        arg = keyword(call, "kernel")
        first = arg.value if arg is not None else None
    hops, forwarder = 0, None
    while first is not None and hops < 4:
        if isinstance(first, cst.Call) and first.args:  # functools.partial(fn, ...)
            first = first.args[0].value
        elif isinstance(first, cst.Lambda) and forwarder is None and forwarding_lambda(first) is not None:
            forwarder = first
            first = forwarding_lambda(first)
        elif isinstance(first, cst.Name):
            name = first.value
            defs = [
                d
                for d in m.findall(loc.wrapper.module, m.FunctionDef(name=m.Name(name)))
                if isinstance(d, cst.FunctionDef)
            ]
            if len(defs) == 1:  # module level or a closure in the entry
                return defs[0], forwarder
            first = resolve_local(loc, call, name)
        else:
            return None, None
        hops += 1
    return None, None


def forwarding_lambda(lam: cst.Lambda) -> cst.Name | None:
    """The function a lambda forwards its refs to: `lambda a, b, c: f(a, b, c, v, k=w, ...)` (plain parameters,
    passed on positionally in order and first; the other arguments, positional or keywords, do not read them);
    None otherwise."""
    ps = lam.params
    plain = not (ps.kwonly_params or ps.posonly_params or ps.star_kwarg is not None)
    plain = plain and ps.star_arg is cst.MaybeSentinel.DEFAULT and all(p.default is None for p in ps.params)
    body = lam.body
    if not plain or not isinstance(body, cst.Call) or not isinstance(body.func, cst.Name):
        return None
    names = [p.name.value for p in ps.params]
    args = list(body.args)
    head, tail = args[: len(names)], args[len(names) :]
    if len(head) != len(names) or any(
        a.keyword is not None or a.star or not (isinstance(a.value, cst.Name) and a.value.value == n)
        for a, n in zip(head, names, strict=True)
    ):
        return None
    if any(a.star for a in tail):
        return None
    if any(isinstance(x, cst.Name) and x.value in names for a in tail for x in m.findall(a.value, m.Name())):
        return None
    return body.func


def call_kernel(
    loc: Located, call: CallFacts, n_refs: int, through_lambda: bool = False
) -> tuple[cst.Call, cst.FunctionDef, tuple[str, ...]]:
    """The pallas_call node that made `call`, its kernel function and the kernel's ref names (declines when the
    kernel cannot be found or takes fewer than `n_refs` positional refs). `through_lambda`: also a kernel reached
    through a forwarding lambda (`kernel_path`: the caller edits the lambda with the function)."""
    node = find_call_node(loc, call)
    kernel, forwarder = kernel_path(loc, node)
    check(kernel is not None and (through_lambda or forwarder is None), "cannot find the kernel function")
    assert kernel is not None
    refs = kernel_refs(kernel)
    check(refs is not None and len(refs) >= n_refs, "the kernel's parameters do not match its refs")
    assert refs is not None
    if forwarder is not None:  # the lambda passes the refs first, then values of its own
        check(len(forwarder.params.params) == n_refs, "the kernel's lambda does not take exactly the call's refs")
        refs = refs[:n_refs]
    return node, kernel, refs


@dataclass(frozen=True)
class CallSite:
    """Where a pallas_call is applied in the wrapper: `pl.pallas_call(...)(x, w)` directly, or through a local name
    (`f = pl.pallas_call(...); f(x, w)`). `apply` is the applying Call node, `operands` its positional arguments."""

    apply: cst.Call
    operands: tuple[cst.BaseExpression, ...]
    star: cst.BaseExpression | None = None  # a last `*rest` argument (only with `trailing_star`)


def call_site(loc: Located, call: cst.Call, trailing_star: bool = False) -> CallSite | None:
    """The application of pallas_call node `call` to its operands (None when it is not applied right there or
    through exactly one local name in the same function, or is applied with keywords or `*args`; with
    `trailing_star`, a last `*rest` argument is allowed and kept apart as `star`)."""
    parent = loc.parent(call)
    applying: cst.Call | None = None
    if isinstance(parent, cst.Call) and parent.func is call:
        applying = parent
    elif isinstance(parent, cst.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0].target, cst.Name):
        name = parent.targets[0].target.value
        fn = enclosing_function(loc, call)
        scope: cst.CSTNode = fn if fn is not None else loc.wrapper.module
        uses = [
            c
            for c in m.findall(scope, m.Call(func=m.Name(name)))
            if isinstance(c, cst.Call) and loc.start(c)[0] > loc.start(call)[0]
        ]
        applying = uses[0] if len(uses) == 1 else None
    if applying is None:
        return None
    args = list(applying.args)
    star = args.pop().value if trailing_star and args and args[-1].star == "*" else None
    if any(a.keyword is not None or a.star for a in args):
        return None
    return CallSite(apply=applying, operands=tuple(a.value for a in args), star=star)


@dataclass(frozen=True)
class InputSite:
    """Where input `operand` of a plain pallas_call sits in the wrapper: the call node, its kernel function and ref
    names, and its application to positional operands."""

    loc: Located
    node: cst.Call
    kernel: cst.FunctionDef
    refs: tuple[str, ...]
    site: CallSite
    forwarder: cst.Lambda | None = None  # the lambda between the call and the kernel (`kernel_path`)


def input_site(module: cst.Module, calls: Sequence[CallFacts], call: int, operand: int) -> InputSite:
    """The `InputSite` of input `operand` of `calls[call]` in `module`, for rewrites that move a wrapper op into the
    kernel; PassNotApplicable (through `check`) for a library or scalar-prefetch call, a missing input, a kernel whose
    positional parameters are not its refs, or a call not applied to positional operands in place."""
    check(0 <= call < len(calls), f"no pallas_call #{call}")
    facts = calls[call]
    check(facts.library_site is None, "the call is inside a library function")
    check(facts.num_scalar_prefetch == 0, "the call uses scalar prefetch")
    check(0 <= operand < len(facts.inputs), f"pallas_call #{call} has no input {operand}")
    n_refs = len(facts.inputs) + len(facts.outputs) + len(facts.scratch)
    loc = Located.of(module)
    node, kernel, refs = call_kernel(loc, facts, n_refs, through_lambda=True)
    check(len(refs) == n_refs, "the kernel's positional parameters do not match its refs")
    site = call_site(loc, node, trailing_star=True)  # `*rest` after the operand: the rewrite leaves it as is
    check(site is not None, "the pallas_call is not applied to positional operands in place")
    assert site is not None
    check(operand < len(site.operands), f"input {operand} is passed through a `*args` argument")
    return InputSite(loc, node, kernel, refs, site, kernel_path(loc, node)[1])


def kernel_refs(kernel: cst.FunctionDef) -> tuple[str, ...] | None:
    """The kernel's positional parameter names (its refs in operand order), None when it takes `*args`."""
    params = kernel.params
    if not (params.star_arg is cst.MaybeSentinel.DEFAULT or isinstance(params.star_arg, cst.ParamStar)):
        return None
    return tuple(p.name.value for p in params.params)


def is_blockspec(node: cst.CSTNode | None) -> bool:
    if not isinstance(node, cst.Call):
        return False
    f = node.func
    return (isinstance(f, cst.Attribute) and f.attr.value == "BlockSpec") or (
        isinstance(f, cst.Name) and f.value == "BlockSpec"
    )


def blockspec_parts(spec: cst.BaseExpression | None) -> tuple[cst.BaseExpression | None, cst.BaseExpression | None]:
    """The (block_shape, index_map) expressions of a `BlockSpec(...)` call, positional or keyword (None if absent)."""
    if not is_blockspec(spec):
        return None, None
    assert isinstance(spec, cst.Call)
    positional = [a.value for a in spec.args if a.keyword is None]
    shape_arg, imap_arg = keyword(spec, "block_shape"), keyword(spec, "index_map")
    shape = shape_arg.value if shape_arg is not None else (positional[0] if positional else None)
    imap = imap_arg.value if imap_arg is not None else (positional[1] if len(positional) > 1 else None)
    return shape, imap


# --- names and grid axes ------------------------------------------------------------------------------------------


def bound_in_nested(kernel: cst.FunctionDef, name: str) -> bool:
    """`name` is a parameter or assignment target of a function nested in the kernel."""
    for fn in m.findall(kernel.body, m.FunctionDef() | m.Lambda()):
        params = fn.params  # type: ignore[attr-defined]
        if any(p.name.value == name for p in params.params):
            return True
    return False


def only_read(kernel: cst.FunctionDef, ref: str) -> bool:
    """The body reads `ref` and never stores to it, rebinds it or rebinds it in a nested function."""
    for target in m.findall(kernel.body, m.AssignTarget() | m.AugAssign() | m.AnnAssign()):
        lhs = target.target  # type: ignore[attr-defined]
        if any(isinstance(n, cst.Name) and n.value == ref for n in m.findall(lhs, m.Name())) or (
            isinstance(lhs, cst.Name) and lhs.value == ref
        ):
            return False
    return not bound_in_nested(kernel, ref)


def shared_kernel(loc: Located, calls: Sequence[CallFacts], index: int, kernel: cst.FunctionDef) -> bool:
    """The kernel function also runs in another pallas_call of the module than `calls[index]` (a rewrite of its body
    would change that one too)."""
    for other in calls:
        if other.index == index or other.library_site is not None:
            continue
        try:
            if kernel_function(loc, find_call_node(loc, other)) is kernel:
                return True
        except Exception:
            continue
    return False


def dead_assignment(loc: Located, operand: cst.BaseExpression, value: cst.BaseExpression) -> cst.CSTNode | None:
    """The statement line `xp = <value>` when `operand` is the name `xp` and nothing else in the function reads it
    (it would be dead once the call takes another operand); else None."""
    if not isinstance(operand, cst.Name):
        return None
    assign = loc.parent(value)
    line = loc.parent(assign) if isinstance(assign, cst.Assign) else None
    fn = enclosing_function(loc, operand)
    if not isinstance(assign, cst.Assign) or not isinstance(line, cst.SimpleStatementLine) or fn is None:
        return None
    if len(line.body) != 1 or len(assign.targets) != 1:
        return None
    uses = [n for n in m.findall(fn, m.Name(operand.value)) if n is not assign.targets[0].target]
    return line if uses == [operand] else None


def used_names(node: cst.CSTNode) -> set[str]:
    return {n.value for n in m.findall(node, m.Name()) if isinstance(n, cst.Name)}


PROGRAM_ID = m.Call(
    func=m.Attribute(attr=m.Name("program_id") | m.Name("num_programs")) | m.Name("program_id") | m.Name("num_programs")
)


def own_kernel(
    loc: Located, calls: Sequence[CallFacts], facts: CallFacts, node: cst.Call
) -> tuple[cst.FunctionDef, tuple[str, ...]]:
    """The module-level kernel function pallas_call `node` (`facts`) runs, and its ref names, one per operand and
    scratch buffer, for a pass that rewrites the body; declines where there is none, where it runs in another call
    too (the rewrite would change that one) or where it takes *args."""
    kernel = kernel_function(loc, node)
    check(kernel is not None, "cannot find the kernel function (a module-level def the call runs)")
    assert kernel is not None
    check(not shared_kernel(loc, calls, facts.index, kernel), "the kernel function runs in another call too")
    refs = kernel_refs(kernel)
    check(refs is not None and len(refs) == len(facts.operands) + len(facts.scratch), "the kernel takes *args")
    assert refs is not None
    return kernel, refs


def helper_reading_program_id(module: cst.Module, kernel: cst.FunctionDef) -> str | None:
    """The name of a function outside `kernel` (not nested in it) that the kernel calls and that reads
    program_id / num_programs (a rewrite renumbering or rescaling the kernel's axes would not reach it); None."""
    called = used_names(kernel)
    inside = {id(f) for f in m.findall(kernel, m.FunctionDef())}
    for fn in m.findall(module, m.FunctionDef()):
        assert isinstance(fn, cst.FunctionDef)
        if id(fn) not in inside and fn.name.value in called and m.findall(fn, PROGRAM_ID):
            return fn.name.value
    return None


def program_id_axes(node: cst.CSTNode) -> set[int] | None:
    """The literal grid axes `pl.program_id(a)` / `pl.num_programs(a)` use inside `node`; None when an axis is not
    an integer literal."""
    axes: set[int] = set()
    for use in m.findall(node, PROGRAM_ID):
        assert isinstance(use, cst.Call)
        arg = use.args[0].value if use.args else None
        if not isinstance(arg, cst.Integer):
            return None
        axes.add(int(arg.evaluated_value))
    return axes


def module_names(module: cst.Module) -> set[str]:
    """Names bound by the module's top-level statements (imports, assignments, defs, classes)."""
    names: set[str] = set()
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef | cst.ClassDef):
            names.add(stmt.name.value)
        elif isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Import | cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                    for a in small.names:
                        bound = a.asname.name if a.asname else a.name  # type: ignore[union-attr]
                        names.add(code(bound).split(".")[0])
                elif isinstance(small, cst.Assign):
                    for t in small.targets:
                        names.update(used_names(t.target))
                elif isinstance(small, cst.AnnAssign):
                    names.update(used_names(small.target))
    return names


def partial_aliases(module: cst.Module, name: str) -> set[str]:
    """Module-level names bound to function `name` as it is or through `functools.partial(name, ...)` (any spelling
    whose callee ends in `partial`), followed through aliases of aliases."""
    found: set[str] = set()
    grew = True
    while grew:
        grew = False
        for stmt in module.body:
            if not isinstance(stmt, cst.SimpleStatementLine):
                continue
            for small in stmt.body:
                if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
                    continue
                target = small.targets[0].target
                if not isinstance(target, cst.Name) or target.value in found or target.value == name:
                    continue
                value = small.value
                if isinstance(value, cst.Call) and code(value.func).split(".")[-1] == "partial" and value.args:
                    value = value.args[0].value
                if isinstance(value, cst.Name) and value.value in found | {name}:
                    found.add(target.value)
                    grew = True
    return found


def free_names(expr: cst.CSTNode) -> set[str]:
    """Variable names an expression reads (attribute names and keywords excluded; lambda parameters excluded)."""
    out: set[str] = set()

    class Finder(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)
            return False

        def visit_Lambda(self, node: cst.Lambda) -> bool:
            bound = {p.name.value for p in node.params.params}
            out.update(free_names(node.body) - bound)
            return False

        def visit_Name(self, node: cst.Name) -> None:
            out.add(node.value)

    expr.visit(Finder())
    return out


def bound_names(node: cst.CSTNode) -> set[str]:
    """Names a block of code binds: assignment and loop targets, `with ... as`, defs (nested bodies included)."""
    out: set[str] = set()
    for t in m.findall(node, m.AssignTarget() | m.AugAssign() | m.AnnAssign() | m.For() | m.AsName()):
        target = getattr(t, "target", None) or getattr(t, "name", None)
        if target is not None:
            out.update(n.value for n in m.findall(target, m.Name()) if isinstance(n, cst.Name))
            if isinstance(target, cst.Name):
                out.add(target.value)
    for fn in m.findall(node, m.FunctionDef()):
        assert isinstance(fn, cst.FunctionDef)
        out.add(fn.name.value)
    return out


def descendants(node: cst.CSTNode) -> set[cst.CSTNode]:
    """Every node below `node` (by identity)."""
    out: set[cst.CSTNode] = set()
    stack = list(node.children)
    while stack:
        n = stack.pop()
        out.add(n)
        stack.extend(n.children)
    return out


def is_call_to(node: cst.CSTNode, name: str) -> bool:
    """`node` is a call of a function named `name`, under any module alias (`pl.program_id(..)`, `where(..)`)."""
    return isinstance(node, cst.Call) and (
        m.matches(node.func, m.Attribute(attr=m.Name(name))) or m.matches(node.func, m.Name(name))
    )


def is_self_assign(stmt: cst.BaseStatement) -> bool:
    """`stmt` is `y = y` (what is left where a statement's work moved elsewhere)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    a = stmt.body[0]
    return (
        isinstance(a, cst.Assign)
        and len(a.targets) == 1
        and isinstance(a.targets[0].target, cst.Name)
        and isinstance(a.value, cst.Name)
        and a.targets[0].target.value == a.value.value
    )


def docstring_lines(stmts: Sequence[cst.BaseStatement]) -> int:
    """1 when the first of a function body's `stmts` is its docstring (a string literal statement), else 0: the
    statements a rewrite keeps first."""
    doc = m.SimpleStatementLine(body=[m.Expr(m.SimpleString() | m.ConcatenatedString())])
    return int(bool(stmts) and m.matches(stmts[0], doc))
