"""One `@triton.jit` kernel translated to a Pallas kernel body plus the facts its launch needs.

Two families are in the rule subset (docs/porting.md):
- flat: every access is `ptr + pid * BLOCK + tl.arange(0, BLOCK)` -> 1-D (BLOCK,) blocks over a pl.cdiv grid;
- rows: every access is `ptr + row * stride (+ tl.arange(0, BLOCK))` with a column mask `cols < n_cols` -> blocks of
  BLOCK_ROWS whole rows (width n_cols, so the power-of-two padding disappears), reductions over the last axis.
Anything else raises `Declined` naming the line.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from .affine import Affine, IndexEnv, affine, names_in
from .exprs import Declined, ExprContext, call_arg, rewrite, tl_name
from .source import TritonFile, code
from .tl import DROPPED


@dataclass(frozen=True)
class Access:
    param: str
    form: Affine
    mask: str | None  # the bound of a column mask `cols < BOUND`, when the mask has that shape
    store: bool
    line: int
    masked: bool = False
    colmask: bool = True  # no mask, or only a column mask `cols < BOUND` (all true over a whole-row block)


@dataclass(frozen=True)
class Param:
    name: str
    default: str | None
    constexpr: bool
    star: bool = False  # `**meta`


@dataclass(frozen=True)
class KernelPort:
    """A translated kernel: body source, launch facts."""

    name: str
    line: int
    params: tuple[Param, ...]
    mode: str  # "flat" | "rows"
    kinds: tuple[tuple[str, str, str | None], ...]  # (pointer param, kind, row stride source) in signature order
    stored: tuple[str, ...]
    width: str | None  # rows: source of the row width (a param), flat: the block size
    body: str  # `def _k_<name>(refs..., *, scalars, _W, _R):`
    inputs: tuple[str, ...] = ()  # the pointer params passed in (loaded, or stored under a mask that keeps values)
    aliased: tuple[str, ...] = ()  # stored params whose output aliases their input (masked-out elements kept)


@dataclass
class _State:
    env: IndexEnv = field(default_factory=IndexEnv)
    ptrs: dict[str, tuple[str, Affine]] = field(default_factory=dict)
    masks: dict[str, str | None] = field(default_factory=dict)
    mask_exprs: dict[str, cst.BaseExpression] = field(default_factory=dict)
    loaded: set[str] = field(default_factory=set)  # names holding values read from memory (transitively)
    accesses: list[Access] = field(default_factory=list)
    stored: set[str] = field(default_factory=set)


def _leftmost(e: cst.BaseExpression, params: set[str], assigns: dict[str, cst.BaseExpression]) -> str | None:
    while isinstance(e, cst.BinaryOperation) and isinstance(e.operator, (cst.Add, cst.Subtract)):
        e = e.left
    if isinstance(e, cst.Name):
        if e.value in params:
            return e.value
        if e.value in assigns:
            return _leftmost(assigns[e.value], params, assigns)
    return None


def _walk_calls(node: cst.CSTNode) -> list[cst.Call]:
    found: list[cst.Call] = []

    class _V(cst.CSTVisitor):
        def visit_Call(self, n: cst.Call) -> None:
            found.append(n)

    node.visit(_V())
    return found


def pointer_params(fn: cst.FunctionDef, params: set[str]) -> set[str]:
    """The params used as the base of a tl.load/tl.store pointer (leftmost term of the address)."""
    assigns: dict[str, cst.BaseExpression] = {}

    class _A(cst.CSTVisitor):
        def visit_Assign(self, n: cst.Assign) -> None:
            for t in n.targets:
                if isinstance(t.target, cst.Name):
                    assigns.setdefault(t.target.value, n.value)

    fn.visit(_A())
    found: set[str] = set()
    for call in _walk_calls(fn):
        if tl_name(call.func) in ("load", "store") and call.args:
            base = _leftmost(call.args[0].value, params, assigns)
            if base:
                found.add(base)
    return found


class KernelTranslator:
    def __init__(self, tf: TritonFile, fn: cst.FunctionDef, helpers: frozenset[str], bare_math: frozenset[str]):
        self.tf = tf
        self.fn = fn
        self.helpers = helpers
        self.bare_math = bare_math
        self.params = tuple(
            Param(
                p.name.value,
                code(p.default) if p.default is not None else None,
                p.annotation is not None and "constexpr" in code(p.annotation.annotation),
            )
            for p in fn.params.params
        )
        star = fn.params.star_kwarg
        if star is not None:  # old-style `**meta`: the launch's keywords arrive as one dict
            self.params += (Param(star.name.value, None, False, star=True),)
        self.names = {p.name for p in self.params}
        self.pointers = frozenset(pointer_params(fn, set(self.names)))
        self.st = _State()
        self.stmt_line = tf.line(fn)

    # ---- expressions
    def _ctx(self) -> ExprContext:
        return ExprContext(self.stmt_line, self.pointers, self.helpers, self.bare_math, self._load)

    def _value(self, e: cst.BaseExpression) -> str:
        return rewrite(e, self._ctx())

    def _pointer(self, e: cst.BaseExpression) -> tuple[str, Affine] | None:
        if isinstance(e, cst.Name):
            if e.value in self.st.ptrs:
                return self.st.ptrs[e.value]
            if e.value in self.pointers:
                return (e.value, Affine())
            return None
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, (cst.Add, cst.Subtract)):
            left = self._pointer(e.left)
            if left is None:
                return None
            off = affine(e.right, self.st.env)
            if off is None:
                raise Declined(self.stmt_line, self._why_not_affine(left[0], e.right))
            from .affine import _add

            return (left[0], _add(left[1], off, "+" if isinstance(e.operator, cst.Add) else "-"))
        return None

    def _why_not_affine(self, param: str, e: cst.BaseExpression) -> str:
        text = " ".join(code(e).split())
        if names_in(code(e)) & self.st.loaded:
            return (
                f"the address of '{param}' depends on loaded data ('{text}'): "
                "data-dependent pointer chasing is not in the rule subset"
            )
        return (
            f"the address of '{param}' is not an affine blocked offset ('{text}'): 2-D offsets ([:, None]), "
            "tl.where or integer division in addresses are not in this build's rule subset"
        )

    def _mask_bound(self, m: cst.BaseExpression | None) -> str | None:
        if m is None:
            return None
        if isinstance(m, cst.Name) and m.value in self.st.masks:
            return self.st.masks[m.value]
        return self._compare_bound(m)

    def _compare_bound(self, m: cst.BaseExpression) -> str | None:
        if (
            isinstance(m, cst.Comparison)
            and len(m.comparisons) == 1
            and isinstance(m.comparisons[0].operator, cst.LessThan)
        ):
            lhs, rhs = affine(m.left, self.st.env), affine(m.comparisons[0].comparator, self.st.env)
            if lhs is not None and rhs is not None and not rhs.terms and lhs.aranges() and rhs.const:
                return rhs.const
        return None

    def _access(self, call: cst.Call, store: bool) -> tuple[str, str, str]:
        ptr_e = call_arg(call, 0, "pointer")
        if ptr_e is None:
            raise Declined(self.stmt_line, "tl.load/tl.store without a pointer")
        ptr = self._pointer(ptr_e)
        if ptr is None:
            raise Declined(self.stmt_line, f"cannot tell which argument the address '{code(ptr_e)}' points into")
        mask_e = call_arg(call, 2 if store else 1, "mask")
        if any(a.keyword is not None and a.keyword.value == "boundary_check" for a in call.args):
            raise Declined(self.stmt_line, "boundary_check (block pointers) is not in the rule subset")
        param, form = ptr
        if not store and param in self.st.stored:
            raise Declined(self.stmt_line, f"'{param}' is loaded after the kernel stored to it (read-after-write)")
        bound = self._mask_bound(mask_e)
        colmask = mask_e is None or (bound is not None and self._pid_free(mask_e))
        self.st.accesses.append(Access(param, form, bound, store, self.stmt_line, mask_e is not None, colmask))
        mask = self._value(mask_e) if mask_e is not None else "None"
        return param, mask, ""

    def _load(self, call: cst.Call) -> str:
        param, mask, _ = self._access(call, store=False)
        other_e = call_arg(call, 2, "other")
        other = self._value(other_e) if other_e is not None else "None"
        return f"_ld({param}_ref, _KIND_{param}, {mask}, {other})"

    def _store(self, call: cst.Call) -> str:
        value_e = call_arg(call, 1, "value")
        if value_e is None:
            raise Declined(self.stmt_line, "tl.store without a value")
        value = self._value(value_e)
        param, mask, _ = self._access(call, store=True)
        self.st.stored.add(param)
        return f"_st({param}_out, _OLD_{param}, _KIND_{param}, {value}, {mask})"

    def _pid_free(self, m: cst.BaseExpression) -> bool:
        if isinstance(m, cst.Name) and m.value in self.st.masks:
            m = self.st.mask_exprs.get(m.value, m)
        if isinstance(m, cst.Comparison):
            lhs = affine(m.left, self.st.env)
            return lhs is not None and not any(src.startswith("pid") for src in lhs.sources())
        return False

    # ---- statements
    def block(self, body: cst.BaseSuite, indent: str) -> list[str]:
        stmts = body.body if isinstance(body, cst.IndentedBlock) else [body]
        out: list[str] = []
        for s in stmts:
            out.extend(self.statement(s, indent))  # type: ignore[arg-type]
        return out or [indent + "pass"]

    def statement(self, s: cst.CSTNode, indent: str) -> list[str]:
        self.stmt_line = self.tf.line(s) or self.stmt_line
        if isinstance(s, cst.SimpleStatementLine):
            out: list[str] = []
            for small in s.body:
                self.stmt_line = self.tf.line(small) or self.stmt_line
                out.extend(indent + line for line in self.small(small))
            return out
        if isinstance(s, cst.If):
            lines = [f"{indent}if {self._value(s.test)}:", *self.block(s.body, indent + "    ")]
            orelse = s.orelse
            while orelse is not None:
                if isinstance(orelse, cst.If):
                    lines += [f"{indent}elif {self._value(orelse.test)}:", *self.block(orelse.body, indent + "    ")]
                    orelse = orelse.orelse
                else:
                    lines += [f"{indent}else:", *self.block(orelse.body, indent + "    ")]
                    orelse = None
            return lines
        if isinstance(s, (cst.For, cst.While)):
            raise Declined(
                self.stmt_line,
                "a loop inside the kernel (column loops, K loops) is not in this build's rule subset",
            )
        raise Declined(self.stmt_line, f"a {type(s).__name__} statement is not in the rule subset")

    def small(self, s: cst.BaseSmallStatement) -> list[str]:
        if isinstance(s, cst.Expr):
            if isinstance(s.value, cst.SimpleString):
                return []
            if isinstance(s.value, cst.Call):
                name = tl_name(s.value.func)
                if name == "store":
                    return [self._store(s.value)]
                if name in DROPPED:
                    return []
            return [self._value(s.value)]
        if isinstance(s, cst.Assign):
            if len(s.targets) == 1 and isinstance(s.targets[0].target, cst.Name):
                return self._assign(s.targets[0].target.value, s.value)
            for t in s.targets:
                for n in names_in(code(t.target)):
                    self.st.env.data.add(n)
            return [f"{' = '.join(code(t.target) for t in s.targets)} = {self._value(s.value)}"]
        if isinstance(s, cst.AnnAssign) and isinstance(s.target, cst.Name) and s.value is not None:
            return self._assign(s.target.value, s.value)
        if isinstance(s, cst.AugAssign) and isinstance(s.target, cst.Name):
            name = s.target.value
            if name in self.pointers or name in self.st.ptrs:
                base = self.st.ptrs.get(name, (name, Affine()))
                op = "+" if isinstance(s.operator, cst.AddAssign) else "-"
                fake = cst.BinaryOperation(cst.Name("__p"), cst.Add() if op == "+" else cst.Subtract(), s.value)
                self.st.ptrs["__p"] = base
                self.st.ptrs[name] = self._pointer(fake)  # type: ignore[assignment]
                return []
            self.st.env.data.add(name)
            self.st.env.forms.pop(name, None)
            return [f"{name} {code(s.operator).strip()} {self._value(s.value)}"]
        if isinstance(s, cst.Pass):
            return ["pass"]
        if isinstance(s, cst.Return):
            return [f"return {self._value(s.value)}" if s.value is not None else "return"]
        raise Declined(self.stmt_line, f"a {type(s).__name__} statement is not in the rule subset")

    def _assign(self, name: str, value: cst.BaseExpression) -> list[str]:
        reads = any(tl_name(c.func) == "load" for c in _walk_calls(value)) or bool(
            names_in(code(value)) & self.st.loaded
        )
        (self.st.loaded.add if reads else self.st.loaded.discard)(name)
        ptr = self._pointer(value)
        if ptr is not None:
            self.st.ptrs[name] = ptr
            return []
        form = affine(value, self.st.env)
        self.st.masks.pop(name, None)
        if form is not None and form.terms:
            self.st.env.forms[name] = form
            self.st.env.data.discard(name)
        else:
            self.st.env.forms.pop(name, None)
            bound = self._compare_bound(value)
            if bound is not None:
                self.st.masks[name] = bound
                self.st.mask_exprs[name] = value
            elif form is None:  # data (a parameter expression keeps its affine const form)
                self.st.env.data.add(name)
        return [f"{name} = {self._value(value)}"]

    # ---- the whole kernel
    def translate(self) -> KernelPort:
        lines = self.block(self.fn.body, "    ")
        mode, kinds, width = self._layout()
        used = [p.name for p in self.params if p.name in {k for k, _, _ in kinds}]
        scalars = [p.name for p in self.params if p.name not in self.pointers]
        stored = tuple(p for p in used if p in self.st.stored)
        # a store keeps old values where its mask is false: it then reads the array (aliased to the output), unless
        # the mask is all true by construction (a column mask over whole-row blocks)
        merge = {a.param for a in self.st.accesses if a.store and (not a.colmask if mode == "rows" else a.masked)}
        loaded = {a.param for a in self.st.accesses if not a.store}
        inputs = tuple(p for p in used if p in loaded or p in merge)
        sig = ", ".join([*(f"{p}_ref" for p in inputs), *(f"{p}_out" for p in stored)])
        kw = ", ".join([*scalars, "_W", "_R"])
        head = [f"def _k_{self.fn.name.value}({sig}, *, {kw}):"]
        head += [f'    _KIND_{p} = "{k}"' for p, k, _ in kinds]
        head += [f"    _OLD_{p} = {p + '_ref' if p in merge else None}" for p in stored]
        body = "\n".join(head + lines) + "\n"
        return KernelPort(
            self.fn.name.value,
            self.tf.line(self.fn),
            self.params,
            mode,
            kinds,
            stored,
            width,
            body,
            inputs,
            tuple(p for p in stored if p in merge),
        )

    def _layout(self) -> tuple[str, tuple[tuple[str, str, str | None], ...], str | None]:
        if not self.st.accesses:
            raise Declined(self.tf.line(self.fn), "the kernel reads and writes no memory")
        per: dict[str, tuple[str, str | None]] = {}
        sizes: set[str] = set()
        bounds: set[str] = set()
        flat = all(self._is_flat(a.form) for a in self.st.accesses)
        for a in self.st.accesses:
            if a.form.const not in (None, "0"):
                raise Declined(
                    a.line,
                    f"a constant offset '{a.form.const}' in the address of '{a.param}' is not in the rule subset",
                )
            extra = [s for s in a.form.sources() if s not in ("pid0",) and not s.startswith("ar:")]
            if extra:
                raise Declined(
                    a.line, f"the address of '{a.param}' uses {extra}: only program axis 0 is in the rule subset"
                )
            ars = a.form.aranges()
            if len(ars) > 1:
                raise Declined(
                    a.line,
                    f"the address of '{a.param}' combines several tl.arange vectors (2-D blocks are not in this build's rule subset)",
                )
            sizes.update(ars)
            if flat:
                kind, stride = "flat", None
            else:
                if ars and a.form.coef("ar:" + ars[0]) != "1":
                    raise Declined(
                        a.line,
                        f"the columns of '{a.param}' are strided ({a.form.coef('ar:' + ars[0])}): only unit column stride is in the rule subset",
                    )
                pid = a.form.coef("pid0")
                kind = ("row" if ars else "rowscalar") if pid else ("bcast" if ars else "scalar")
                stride = pid
                if stride is not None and not names_in(stride) <= self.names:
                    raise Declined(a.line, f"the row stride '{stride}' of '{a.param}' is not a kernel argument")
                if a.store and kind in ("bcast", "scalar"):
                    raise Declined(
                        a.line,
                        f"every program stores to the same '{a.param}' location (a cross-program reduction needs atomics)",
                    )
                if a.mask:
                    bounds.add(a.mask)
            prev = per.get(a.param)
            if prev is not None and prev != (kind, stride):
                raise Declined(a.line, f"'{a.param}' is accessed with two different layouts ({prev[0]}, {kind})")
            per[a.param] = (kind, stride)
        if len(sizes) > 1:
            raise Declined(self.tf.line(self.fn), f"tl.arange vectors of different sizes {sorted(sizes)}")
        if len(bounds) > 1:
            raise Declined(self.tf.line(self.fn), f"column masks with different bounds {sorted(bounds)}")
        kinds = tuple((p.name, *per[p.name]) for p in self.params if p.name in per)
        if flat:
            return "flat", kinds, next(iter(sizes))  # type: ignore[return-value]
        width = next(iter(bounds)) if bounds else (next(iter(sizes)) if sizes else "1")
        if not names_in(width) <= self.names:
            raise Declined(self.tf.line(self.fn), f"the row width '{width}' is not a kernel argument")
        return "rows", kinds, width

    @staticmethod
    def _is_flat(form: Affine) -> bool:
        ars = form.aranges()
        return len(ars) == 1 and form.coef("ar:" + ars[0]) == "1" and form.coef("pid0") == ars[0]


def translate_helper(tf: TritonFile, fn: cst.FunctionDef, helpers: frozenset[str], bare_math: frozenset[str]) -> str:
    """A `@triton.jit` helper that takes and returns values (e.g. `silu`), as a plain jax.numpy function."""
    t = KernelTranslator.__new__(KernelTranslator)
    t.tf, t.fn, t.helpers, t.bare_math = tf, fn, helpers, bare_math
    t.params = ()
    t.names = {p.name.value for p in fn.params.params}
    t.pointers = frozenset()
    t.st = _State()
    t.stmt_line = tf.line(fn)
    t._load = None  # type: ignore[assignment,method-assign]
    params = ", ".join(
        code(p.name) + (f"={code(p.default)}" if p.default is not None else "") for p in fn.params.params
    )
    return "\n".join([f"def {fn.name.value}({params}):", *t.block(fn.body, "    ")]) + "\n"
