"""Recognize a whole-row softmax reduction in a kernel body's jaxpr: a logsumexp (`m + log(sum(exp(s - m)))`), a
cross entropy (that minus `sum(where(iota == label, s, 0))`) or an attention (`dot(exp(s - m), V) / sum(exp(s - m))`, the division before or after the dot), over the last axis of
2-D scores `s`. Also finds which input refs the scores (and V) read along that axis, and checks that nothing else
in the body depends on the whole row, so the row can be split into chunks with a running max and sum.

`match_softmax(kernel_jaxpr, n_inputs, n_outputs)` returns a `SoftmaxForm`, or raises `PassNotApplicable` with the
reason (via `errors.check`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax.extend.core

from ..errors import check

# Elementwise primitives: output dim d of each same-rank operand is output dim d.
ELEMENTWISE = frozenset(
    {
        "add",
        "sub",
        "mul",
        "div",
        "max",
        "min",
        "neg",
        "exp",
        "exp2",
        "log",
        "tanh",
        "logistic",
        "abs",
        "sqrt",
        "rsqrt",
        "integer_pow",
        "pow",
        "convert_element_type",
        "select_n",
        "square",
        "sign",
        "erf",
        "copy",
        "copy_p",
        "lt",
        "le",
        "gt",
        "ge",
        "eq",
        "ne",
        "and",
        "or",
        "not",
    }
)
# Wrappers that change neither value nor layout in a way the form cares about (stripped when matching).
PASSTHROUGH = frozenset({"convert_element_type", "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "copy"})
INLINED = frozenset({"pjit", "jit", "closed_call", "custom_jvp_call"})


@dataclass(frozen=True)
class SoftmaxForm:
    """A recognized whole-row softmax reduction. `chunked`: (input position, kernel-ref dim) of every input read
    along the row; `value_input`: V's input position (attention form) and `dot_dtypes` the dtypes the P @ V dot
    multiplies in; `rows`/`row_len`: the scores' shape."""

    kind: str  # "logsumexp" | "cross-entropy" | "attention"
    output: int
    chunked: tuple[tuple[int, int], ...]
    rows: int
    row_len: int
    value_input: int | None = None
    dot_dtypes: tuple[str, str] = ("float32", "float32")
    head_dim: int = 0
    value_lead: int = 0  # leading size-1 dims of V's ref the kernel indexes away (`v_ref[0]`)
    label_input: int | None = None  # cross-entropy: the input holding each row's target index


@dataclass(frozen=True)
class _Eqn:
    prim: str
    invars: tuple[Any, ...]
    outvars: tuple[Any, ...]
    params: dict[str, Any]


def _flatten(jaxpr: Any, env: dict[Any, Any] | None = None) -> list[_Eqn]:
    """The body's equations with `pjit`-style calls inlined (their inner vars renamed to the outer ones)."""
    env = env or {}
    out: list[_Eqn] = []

    def sub(v: Any) -> Any:
        return v if isinstance(v, jax.extend.core.Literal) else env.get(v, v)

    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in INLINED:
            inner = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            inner = getattr(inner, "jaxpr", inner)
            if inner is None or not hasattr(inner, "eqns"):
                out.append(_Eqn(name, tuple(sub(v) for v in eqn.invars), tuple(eqn.outvars), dict(eqn.params)))
                continue
            inner_env = {iv: sub(ov) for iv, ov in zip(inner.invars, eqn.invars, strict=False)}
            out.extend(_flatten(inner, inner_env))
            for o_outer, o_inner in zip(eqn.outvars, inner.outvars, strict=False):
                env[o_outer] = inner_env.get(o_inner, o_inner)
            continue
        out.append(_Eqn(name, tuple(sub(v) for v in eqn.invars), tuple(eqn.outvars), dict(eqn.params)))
    return out


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(getattr(v.aval, "shape", ()))


class _Body:
    def __init__(self, eqns: list[_Eqn]) -> None:
        self.eqns = eqns
        self.producer: dict[Any, _Eqn] = {}
        for e in eqns:
            for o in e.outvars:
                self.producer[o] = e

    def prod(self, v: Any) -> _Eqn | None:
        return None if isinstance(v, jax.extend.core.Literal) else self.producer.get(v)

    def base(self, v: Any) -> Any:
        """`v` with casts, broadcasts and reshapes stripped."""
        e = self.prod(v)
        while e is not None and e.prim in PASSTHROUGH:
            v = e.invars[0]
            e = self.prod(v)
        return v

    def strip(self, v: Any) -> _Eqn | None:
        return self.prod(self.base(v))


def _is(e: _Eqn | None, prim: str) -> bool:
    return e is not None and e.prim == prim


def match_softmax(kernel_jaxpr: Any, n_inputs: int, n_outputs: int) -> SoftmaxForm:
    refs = list(kernel_jaxpr.invars)
    check(len(refs) == n_inputs + n_outputs, "the kernel has scratch or scalar-prefetch refs (it already keeps state)")
    body = _Body(_flatten(kernel_jaxpr))
    prims = {e.prim for e in body.eqns}
    flow = prims & {"cond", "while", "scan", "dma_start", "run_scoped"}
    check(not flow, f"the kernel body has {sorted(flow)} (only straight-line bodies are re-tiled)")
    maxes = [e for e in body.eqns if e.prim == "reduce_max"]
    check(bool(maxes), "no row max (reduce_max) in the kernel body: not a softmax")
    check(len(maxes) == 1, f"{len(maxes)} row maxima in the kernel body: cannot tell which row is the softmax's")
    scores = maxes[0].invars[0]
    shape = _shape(scores)
    check(
        len(shape) == 2 and tuple(maxes[0].params["axes"]) == (1,),
        f"the max reduces axes {tuple(maxes[0].params['axes'])} of a {len(shape)}-D value: only the last axis of "
        "2-D scores is re-tiled",
    )
    stores = [e for e in body.eqns if e.prim in ("swap", "masked_swap", "addupdate")]
    check(
        len(stores) == 1, f"the kernel writes refs {len(stores)} times: only a single store of the result is re-tiled"
    )
    store = stores[0]
    check(store.prim == "swap", "the result is stored with a masked or accumulating store")
    out_ref = store.invars[0]
    check(out_ref in refs[n_inputs:], "the kernel stores into an input ref")
    output = refs.index(out_ref) - n_inputs
    check(n_outputs == 1, f"the kernel has {n_outputs} outputs: only a single reduced output is re-tiled")
    mx = maxes[0].outvars[0]
    used: set[int] = set()
    value = store.invars[1]
    top = body.strip(value)
    _mark(body, value, used)
    kind, v_var, v_dim, dot, label_ref = _match_output(body, top, scores, mx, used)
    label_input = None
    if label_ref is not None:
        check(label_ref in refs[:n_inputs], "the label is not read from an input ref")
        label_input = refs.index(label_ref)
    chunked: dict[int, int] = {}
    cone: set[int] = set()
    _trace_row(body, scores, 1, refs, n_inputs, chunked, cone)
    value_input = None
    value_lead = 0
    if v_var is not None:
        v_refs: dict[int, int] = {}
        _trace_row(body, v_var, v_dim, refs, n_inputs, v_refs, cone)
        check(len(v_refs) == 1, "V is not read from exactly one input ref along the key axis")
        ((value_input, _vd),) = v_refs.items()
        v_shape = tuple(refs[value_input].aval.shape)
        check(len(v_shape) >= 2 and all(d == 1 for d in v_shape[:-2]), "V's block is not (keys, head dim)")
        value_lead = len(v_shape) - 2
        for pos, d in v_refs.items():
            check(chunked.get(pos, d) == d, f"input {pos} is read along two different dims")
            chunked[pos] = d
    check(bool(chunked), "the scores read no input along the row (nothing to split)")
    _check_no_other_work(body, store, cone, used)
    dtypes = ("float32", "float32")
    head = 0
    if dot is not None:
        dtypes = (str(dot.invars[0].aval.dtype), str(dot.invars[1].aval.dtype))
        head = _shape(dot.outvars[0])[-1]
    return SoftmaxForm(
        kind=kind,
        output=output,
        chunked=tuple(sorted(chunked.items())),
        rows=shape[0],
        row_len=shape[1],
        value_input=value_input,
        dot_dtypes=dtypes,
        head_dim=head,
        value_lead=value_lead,
        label_input=label_input,
    )


def _mark(body: _Body, v: Any, used: set[int]) -> None:
    """Mark the equations between `v` and its stripped base (casts, broadcasts) as part of the form."""
    e = body.prod(v)
    while e is not None:
        used.add(id(e))
        if e.prim not in PASSTHROUGH:
            return
        e = body.prod(e.invars[0])


def _exp_of_shift(body: _Body, v: Any, scores: Any, mx: Any, used: set[int]) -> bool:
    """`v` is `exp(scores - max(scores))` (modulo casts and broadcasts)."""
    e = body.strip(v)
    if not _is(e, "exp"):
        return False
    assert e is not None
    d = body.strip(e.invars[0])
    if not (_is(d, "sub") and d is not None and body.base(d.invars[0]) is scores and body.base(d.invars[1]) is mx):
        return False
    for x in (v, e.invars[0], d.invars[1]):
        _mark(body, x, used)
    return True


def _sum_of(body: _Body, v: Any, scores: Any, mx: Any, used: set[int]) -> Any | None:
    """The summed exp var when `v` is `sum(exp(scores - max), axis=1)`, else None."""
    e = body.strip(v)
    if not (_is(e, "reduce_sum") and e is not None and tuple(e.params["axes"]) == (1,)):
        return None
    if not _exp_of_shift(body, e.invars[0], scores, mx, used):
        return None
    _mark(body, v, used)
    return e.invars[0]


def _lse(body: _Body, top: _Eqn, scores: Any, mx: Any, used: set[int]) -> bool:
    """`top` is max + log(sum(exp(s - max))) (either order)."""
    if top.prim != "add":
        return False
    a, b = top.invars[:2]
    for m_side, l_side in ((a, b), (b, a)):
        lg = body.strip(l_side)
        is_log = body.base(m_side) is mx and _is(lg, "log") and lg is not None
        if is_log and lg is not None and _sum_of(body, lg.invars[0], scores, mx, used) is not None:
            for x in (m_side, l_side):
                _mark(body, x, used)
            _mark(body, lg.invars[0], used)
            used.add(id(top))
            return True
    return False


def _picked(body: _Body, v: Any, scores: Any, used: set[int]) -> Any | None:
    """The label ref when `v` is sum(where(iota(axis 1) == label, s, 0), axis=1) with `label` read whole from a ref
    of one element per row; else None."""
    red = body.strip(v)
    if not (_is(red, "reduce_sum") and red is not None and tuple(red.params["axes"]) == (1,)):
        return None
    sel = body.strip(red.invars[0])
    if not (_is(sel, "select_n") and sel is not None and len(sel.invars) == 3):
        return None
    pred, false, true = sel.invars
    fill = body.base(false)
    zero = isinstance(fill, jax.extend.core.Literal) and float(fill.val) == 0.0
    if not (zero and body.base(true) is scores):
        return None
    eq = body.strip(pred)
    if not (_is(eq, "eq") and eq is not None):
        return None
    for col, lab in (eq.invars[:2], eq.invars[1::-1]):
        iota, read = body.strip(col), body.strip(lab)
        if not (_is(iota, "iota") and iota is not None and _is(read, "get") and read is not None):
            continue
        if int(iota.params["dimension"]) != 1 or tuple(iota.params["shape"]) != _shape(scores):
            continue
        if math.prod(_shape(read.outvars[0])) != _shape(scores)[0]:
            continue
        for x in (v, red.invars[0], pred, false, col, lab):
            _mark(body, x, used)
        used.update({id(red), id(sel), id(eq), id(iota), id(read)})
        return read.invars[0]
    return None


def _match_output(body: _Body, top: _Eqn | None, scores: Any, mx: Any, used: set[int]) -> tuple[Any, ...]:
    """(kind, V var, V's key dim, the P @ V dot) of the stored value; declines when it is neither form."""
    check(top is not None, "the stored value is not computed in the kernel")
    assert top is not None
    used.add(id(top))
    if _lse(body, top, scores, mx, used):
        return ("logsumexp", None, 0, None, None)
    if top.prim == "sub":  # cross entropy: lse - sum(where(cols == label, s, 0))
        a, b = top.invars[:2]
        lse = body.strip(a)
        if lse is not None and _lse(body, lse, scores, mx, used):
            _mark(body, a, used)
            label = _picked(body, b, scores, used)
            check(label is not None, "lse minus a value that is not the label's logit sum(where(cols == label, s, 0))")
            return ("cross-entropy", None, 0, None, label)
    if top.prim == "div":  # attention: dot(exp(s - m), V) / sum(exp(s - m))
        num, den = top.invars[:2]
        dot = body.strip(num)
        if _is(dot, "dot_general") and dot is not None and _sum_of(body, den, scores, mx, used) is not None:
            _mark(body, num, used)
            _mark(body, den, used)
            v_var, v_dim = _pv_dot(body, dot, lambda p: _exp_of_shift(body, p, scores, mx, used))
            return ("attention", v_var, v_dim, dot, None)
    if top.prim == "dot_general":  # attention: dot(exp(s - m) / sum(...), V)

        def normalized(p: Any) -> bool:
            d = body.strip(p)
            if not (_is(d, "div") and d is not None):
                return False
            ok = _exp_of_shift(body, d.invars[0], scores, mx, used)
            ok = ok and _sum_of(body, d.invars[1], scores, mx, used) is not None
            if ok:
                _mark(body, p, used)
                _mark(body, d.invars[1], used)
            return ok

        v_var, v_dim = _pv_dot(body, top, normalized)
        return ("attention", v_var, v_dim, top, None)
    whole_row = top.prim == "div" and _exp_of_shift(body, top.invars[0], scores, mx, set())
    check(
        not whole_row,
        "the stored value is exp(s - max) / sum(...), a whole-row softmax output: it is not reduced over the row "
        "(online-softmax takes logsumexp, cross-entropy and softmax-times-V forms)",
    )
    check(False, "the stored value is neither max + log(sum(exp(s - max))) nor a softmax times V")
    raise AssertionError  # unreachable: check raised


def _pv_dot(body: _Body, dot: _Eqn, is_p: Any) -> tuple[Any, int]:
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    check(not lb and not rb, "the P @ V dot is batched")
    check(tuple(lc) == (1,) and len(rc) == 1, "the P @ V dot does not contract P's key axis")
    check(is_p(dot.invars[0]), "the dot's left operand is not exp(s - max) (or its normalized form)")
    return dot.invars[1], int(rc[0])


def _trace_row(
    body: _Body, v: Any, d: int, refs: list[Any], n_inputs: int, found: dict[int, int], cone: set[int]
) -> None:
    """Follow dim `d` of `v` back to the input refs read along it (recorded in `found`: position -> kernel-ref dim);
    every equation `v` depends on goes into `cone`. Declines on an operation that mixes positions along `d`."""
    stack: list[tuple[Any, int | None]] = [(v, d)]
    seen: set[tuple[int, int | None]] = set()
    while stack:
        var, dim = stack.pop()
        e = body.prod(var)
        key = (id(var), dim)
        if e is None or key in seen:
            continue
        seen.add(key)
        cone.add(id(e))
        ins = [x for x in e.invars if not isinstance(x, jax.extend.core.Literal)]
        if dim is None:  # values that do not vary along the row: anything goes, but no input may be read whole
            if e.prim == "get":
                check(e.invars[0] not in refs[n_inputs:], "the scores read an output ref")
            stack.extend((x, None) for x in ins)
            continue
        if e.prim == "get":
            ref = e.invars[0]
            check(ref in refs[:n_inputs], "the scores read a ref that is not an input")
            whole, lead = _whole_read(tuple(ref.aval.shape), _shape(e.outvars[0]))
            check(whole, "an input is read in part (`ref[a:b]`), not whole")
            pos = refs.index(ref)
            check(found.get(pos, dim + lead) == dim + lead, f"input {pos} is read along two different dims")
            found[pos] = dim + lead
        elif e.prim in ELEMENTWISE:
            rank = len(_shape(e.outvars[0]))
            n = _shape(e.outvars[0])[dim]
            for x in ins:
                sx = _shape(x)
                moves = len(sx) == rank and sx[dim] == n and n > 1
                stack.append((x, dim if moves else None))
        elif e.prim == "broadcast_in_dim":
            bd = tuple(e.params["broadcast_dimensions"])
            src = bd.index(dim) if dim in bd else None
            x = e.invars[0]
            moves = src is not None and _shape(x)[src] == _shape(e.outvars[0])[dim]
            stack.append((x, src if moves else None))
        elif e.prim == "transpose":
            stack.append((e.invars[0], int(e.params["permutation"][dim])))
        elif e.prim == "dot_general":
            (lc, rc), (lb, rb) = e.params["dimension_numbers"]
            lhs, rhs = e.invars[:2]
            lfree = [i for i in range(len(_shape(lhs))) if i not in lc and i not in lb]
            rfree = [i for i in range(len(_shape(rhs))) if i not in rc and i not in rb]
            nb = len(lb)
            check(dim >= nb, "the row runs along a batch dim of a dot")
            if dim < nb + len(lfree):
                stack.extend([(lhs, lfree[dim - nb]), (rhs, None)])
            else:
                stack.extend([(lhs, None), (rhs, rfree[dim - nb - len(lfree)])])
        elif e.prim == "iota":
            check(False, "the scores read column positions (iota): chunks would need their offset along the row")
        else:
            check(
                False,
                f"the scores go through `{e.prim}` along the row (only elementwise ops, casts, "
                "broadcasts, transposes and dots are split into chunks)",
            )


def _whole_read(ref: tuple[int, ...], got: tuple[int, ...]) -> tuple[bool, int]:
    """Whether a read of shape `got` covers the whole ref (`ref[...]`, or `ref[0]` on leading dims of size 1), and
    how many leading dims it drops."""
    lead = len(ref) - len(got)
    return lead >= 0 and ref[lead:] == got and all(d == 1 for d in ref[:lead]), max(lead, 0)


def _check_no_other_work(body: _Body, store: _Eqn, cone: set[int], used: set[int]) -> None:
    extra = [e.prim for e in body.eqns if e is not store and id(e) not in cone and id(e) not in used]
    extra = [p for p in extra if p not in ("reduce_max",)]
    check(not extra, f"the kernel also computes {sorted(set(extra))} outside the scores and the softmax")
