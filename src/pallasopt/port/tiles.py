"""2-D tile kernels: `ptr + offs_m[:, None] * stride_m + offs_n[None, :] * stride_n` accesses, optionally a K loop.

The Triton shape (the tutorials' matmul):
    pid = tl.program_id(0); ...; pid_m = ...; pid_n = ...          # any program-id -> tile mapping (grouped swizzle)
    offs_am = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)              # a tile-indexed offset vector (`% M` wrap allowed)
    a_ptrs = a_ptr + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)                                      # or acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
    tl.store(c_ptrs, acc.to(tl.float16), mask=(offs_cm[:, None] < M) & (offs_cn[None, :] < N))
becomes a Pallas kernel over the grid (tiles_m, tiles_n[, k_steps]): 2-D BlockSpecs whose index maps follow the tile
each axis is indexed by (program tile, the K loop's step, or block 0), the K axis "arbitrary", each loop-carried value
in an f32 VMEM scratch initialised under `pl.when(k == 0)`, the code after the loop (and the store) under
`pl.when(k == last)`: the pattern of JAX's Pallas TPU matmul guide. The program-id mapping is run at trace time for
every program of the launch grid; it must be a permutation of the tile grid (then the order is dropped: a TPU core
walks the grid in order and has no L2 to group for; the swizzle only changed which programs shared a GPU L2).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from .affine import Affine, IndexEnv, affine, names_in
from .exprs import Declined, ExprContext, call_arg, rewrite, tl_name
from .kernel import Param, pointer_params
from .source import TritonFile, code
from .tile_blocks import Ptr, block_advance, block_ptr, boundary_dims, boundary_mask
from .tile_index import GRID, Axis, axis_of, calls, conj, norm, py, terms

_LOOP_END = "#<loop end>"


@dataclass(frozen=True)
class TilePort:
    """A translated 2-D tile kernel: the body, the program-id mapping and the launch, as source."""

    name: str
    line: int
    params: tuple[Param, ...]
    stored: tuple[str, ...]
    body: str
    launch: str
    mode: str = "tiles"


class TileTranslator:
    def __init__(self, tf: TritonFile, fn: cst.FunctionDef, helpers: frozenset[str], bare_math: frozenset[str]):
        self.tf, self.fn, self.helpers, self.bare_math = tf, fn, helpers, bare_math
        self.params = tuple(
            Param(
                p.name.value,
                code(p.default) if p.default is not None else None,
                p.annotation is not None and "constexpr" in code(p.annotation.annotation),
            )
            for p in fn.params.params
        )
        if fn.params.star_kwarg is not None:
            raise Declined(tf.line(fn), "a **meta tile kernel is not in the rule subset")
        self.names = {p.name for p in self.params}
        bases = {code(b) for c in calls(fn) if tl_name(c.func) == "make_block_ptr" and (b := call_arg(c, 0, "base"))}
        self.pointers = frozenset(pointer_params(fn, set(self.names)) | (bases & self.names))
        self.env = IndexEnv()
        self.pidvars: set[str] = set()
        self.scalars: set[str] = set()  # scalar names computed from the arguments alone (num_pid_m)
        self.swizzle: list[str] = []  # program-id mapping, as Python run at trace time
        self.offsets: dict[str, Affine] = {}
        self.wraps: set[str] = set()
        self.ptrs: dict[str, Ptr] = {}
        self.exprs: dict[str, cst.BaseExpression] = {}
        self.layout: dict[str, tuple[Axis, Axis]] = {}
        self.loaded: set[str] = set()
        self.stored: dict[str, tuple[tuple[int, str], ...]] = {}  # param -> store mask bounds (axis, bound)
        self.assigned_before: set[str] = set()
        self.loop: dict[str, object] = {}
        self.carried: dict[str, tuple[str, str]] = {}  # name -> (shape source, dtype source)
        self.line = tf.line(fn)
        self.in_loop = False
        self.after_loop = False
        self.loop_pos = 0
        self.defaults: dict[str, str] = {}  # constexpr defaults the launch omits (an autotuned kernel's first config)

    # ---- expressions
    def _ctx(self) -> ExprContext:
        return ExprContext(
            self.line, self.pointers, self.helpers, self.bare_math, self._load, self._subscript, frozenset(self.offsets)
        )

    def _value(self, e: cst.BaseExpression) -> str:
        extra = (names_in(code(e)) & self.pidvars) - set(self.tile_names())
        if extra or "program_id" in code(e):
            raise Declined(
                self.line, f"'{' '.join(code(e).split())}' uses the program-id mapping outside the tile offsets"
            )
        for c in calls(e):
            if tl_name(c.func) in ("sum", "max", "min", "argmax", "argmin"):
                raise Declined(self.line, f"tl.{tl_name(c.func)} in a 2-D tile kernel is not in the rule subset")
        return rewrite(e, self._ctx())

    def tile_names(self) -> tuple[str, ...]:
        return tuple(sorted({s[2:] for f in self.offsets.values() for s in f.sources() if s.startswith("t:")}))

    def _subscript(self, sub: cst.Subscript) -> str | None:
        axis = axis_of(sub)
        if axis is None:
            return None
        form = self._offset_form(sub.value)
        if form is None:
            return None
        shape = "(SIZE, 1)" if axis == 0 else "(1, SIZE)"
        parts: list[str] = []
        for src, coef in form.terms:
            if src.startswith("ar:"):
                size = src[3:]
                iota = f"jax.lax.broadcasted_iota(jnp.int32, {shape.replace('SIZE', size)}, {axis})"
                parts.append(iota if coef == "1" else f"{iota} * ({coef})")
            elif src.startswith("t:"):
                parts.append(f"{src[2:]} * {coef}" if coef.isidentifier() else f"{src[2:]} * ({coef})")
            elif src == "iter":
                parts.append(f"{GRID[2]} * ({coef})")
            else:
                raise Declined(self.line, f"an offset over {src} is not in the rule subset")
        if form.const not in (None, "0"):
            parts.append(f"({form.const})")
        return "(" + " + ".join(parts) + ")"

    def _offset_form(self, e: cst.BaseExpression) -> Affine | None:
        if isinstance(e, cst.Name) and e.value in self.offsets:
            return self.offsets[e.value]
        form = affine(e, self.env)
        return form if form is not None and form.aranges() else None

    # ---- accesses
    def _access_axes(self, e: cst.BaseExpression) -> Ptr:
        parts = terms(e)
        base = parts[0]
        if isinstance(base, cst.Name) and base.value in self.ptrs and len(parts) == 1:
            return self.ptrs[base.value]
        if not (isinstance(base, cst.Name) and base.value in self.pointers):
            raise Declined(self.line, f"cannot tell which argument the address '{code(e)}' points into")
        axes: dict[int, Axis] = {}
        for t in parts[1:]:
            sub, stride = self._strided(t)
            if sub is None:
                raise Declined(
                    self.line,
                    f"the address term '{code(t)}' of '{base.value}' is not `offs[:, None] * stride` or "
                    "`offs[None, :] * stride` (batch offsets and 1-D accesses in tile kernels are not in the rule subset)",
                )
            axis = axis_of(sub)
            form = self._offset_form(sub.value)
            if axis is None or form is None or axis in axes:
                raise Declined(self.line, f"the address term '{code(t)}' of '{base.value}' is not a 2-D tile offset")
            axes[axis] = self._axis(form, stride, base.value)
            if isinstance(sub.value, cst.Name) and sub.value.value in self.wraps and axes[axis].tile is None:
                raise Declined(self.line, f"the wrapped offset '{sub.value.value}' indexes an untiled axis")
        if set(axes) != {0, 1}:
            raise Declined(
                self.line, f"the address of '{base.value}' needs an offset on both axes ([:, None], [None, :])"
            )
        return Ptr(base.value, axes[0], axes[1])

    def _strided(self, t: cst.BaseExpression) -> tuple[cst.Subscript | None, str]:
        if isinstance(t, cst.Subscript):
            return t, "1"
        if isinstance(t, cst.BinaryOperation) and isinstance(t.operator, cst.Multiply):
            if isinstance(t.left, cst.Subscript) and not isinstance(t.right, cst.Subscript):
                return t.left, code(t.right)
            if isinstance(t.right, cst.Subscript) and not isinstance(t.left, cst.Subscript):
                return t.right, code(t.left)
        return None, ""

    def _axis(self, form: Affine, stride: str, param: str) -> Axis:
        ars = form.aranges()
        if len(ars) != 1 or form.coef("ar:" + ars[0]) != "1":
            raise Declined(self.line, f"an offset of '{param}' is not `tile * BLOCK + tl.arange(0, BLOCK)`")
        if form.const not in (None, "0"):
            raise Declined(self.line, f"a constant offset '{form.const}' in the address of '{param}'")
        others = [(s, c) for s, c in form.terms if not s.startswith("ar:")]
        if not others:
            return Axis(ars[0], None, stride)
        (src, coef), *rest = others
        if rest or norm(coef) != norm(ars[0]):
            raise Declined(
                self.line, f"an offset of '{param}' moves by '{coef}', not by its block size '{ars[0]}' per tile"
            )
        return Axis(ars[0], src, stride)

    def _note_layout(self, p: Ptr, rows: Axis, cols: Axis) -> None:
        prev = self.layout.get(p.param)
        if prev is not None and prev != (rows, cols):
            raise Declined(self.line, f"'{p.param}' is accessed with two different tilings")
        self.layout[p.param] = (rows, cols)

    def _current(self, p: Ptr) -> tuple[Axis, Axis]:
        rows, cols = p.rows, p.cols
        if p.advance is not None:
            if not self.in_loop:
                raise Declined(self.line, f"'{p.param}' is read after the K loop advanced its pointer")
            if self.loop_pos > p.advanced_at:
                raise Declined(self.line, f"'{p.param}' is read after its pointer advance inside the loop")
            if p.advance == 0:
                rows = Axis(rows.size, "iter", rows.stride)
            else:
                cols = Axis(cols.size, "iter", cols.stride)
        return rows, cols

    def _load(self, call: cst.Call) -> str:
        ptr_e = call_arg(call, 0, "pointer")
        if ptr_e is None:
            raise Declined(self.line, "tl.load without a pointer")
        p = self._access_axes(ptr_e)
        if p.param in self.stored:
            raise Declined(self.line, f"'{p.param}' is loaded after the kernel stored to it (read-after-write)")
        rows, cols = self._current(p)
        self._note_layout(p, rows, cols)
        self.loaded.add(p.param)
        dims = boundary_dims(call, p, 3, self.line)
        if dims and p.shape is not None:  # out-of-bounds block elements: zeros ("" is undefined in Triton) or NaN
            pad = call_arg(call, 4, "padding_option")
            other = "jnp.nan" if pad is not None and "nan" in code(pad) else "0"
            return f'_ld({p.param}_ref, "tile", {boundary_mask(dims, rows, cols, p.shape)}, {other})'
        mask_e, other_e = call_arg(call, 1, "mask"), call_arg(call, 2, "other")
        mask = self._value(mask_e) if mask_e is not None else "None"
        other = self._value(other_e) if other_e is not None else "None"
        return f'_ld({p.param}_ref, "tile", {mask}, {other})'

    def _store(self, call: cst.Call) -> str:
        ptr_e, value_e = call_arg(call, 0, "pointer"), call_arg(call, 1, "value")
        if ptr_e is None or value_e is None:
            raise Declined(self.line, "tl.store without a pointer or a value")
        value = self._value(value_e)
        p = self._access_axes(ptr_e)
        rows, cols = self._current(p)
        if self.in_loop or "iter" in (rows.tile, cols.tile):
            raise Declined(self.line, f"'{p.param}' is stored inside the K loop (only after it)")
        if rows.tile is None or cols.tile is None:
            raise Declined(self.line, f"the stored '{p.param}' needs a program tile on both axes")
        self._note_layout(p, rows, cols)
        if p.param in self.stored:
            raise Declined(self.line, f"'{p.param}' is stored twice")
        dims = boundary_dims(call, p, 3, self.line)
        if p.shape is not None:  # a block pointer: boundary_check names the axes whose edge Pallas clips
            self.stored[p.param] = tuple((d, p.shape[d]) for d in dims)
        else:
            self.stored[p.param] = self._bounds(call_arg(call, 2, "mask"), rows, cols, p.param)
        return f"_st({p.param}_out, None, 'tile', {value}, None)"

    def _bounds(self, m: cst.BaseExpression | None, rows: Axis, cols: Axis, param: str) -> tuple[tuple[int, str], ...]:
        """A store mask must be `offs[:, None] < B0 & offs[None, :] < B1` over the store's own offsets: it then only
        cuts the partial edge tiles, which Pallas clips; the launch checks each bound covers the array."""
        if m is None:
            return ()
        if isinstance(m, cst.Name) and m.value in self.exprs:
            m = self.exprs[m.value]
        parts = conj(m)
        out: list[tuple[int, str]] = []
        for c in parts:
            if (
                isinstance(c, cst.Comparison)
                and len(c.comparisons) == 1
                and isinstance(c.comparisons[0].operator, cst.LessThan)
                and isinstance(c.left, cst.Subscript)
            ):
                sub = c.left
                axis = axis_of(sub)
                form = self._offset_form(sub.value)
                bound = affine(c.comparisons[0].comparator, self.env)
                want = rows if axis == 0 else cols
                if axis is not None and form is not None and bound is not None and not bound.terms and bound.const:
                    got = self._axis(form, "1", param)
                    if (got.size, got.tile) == (want.size, want.tile):
                        out.append((axis, bound.const))
                        continue
            raise Declined(
                self.line,
                f"the store mask of '{param}' is not a bound on its own tile offsets "
                "(`(offs_m[:, None] < M) & (offs_n[None, :] < N)`): masks that keep old values are not in the tile rules",
            )
        return tuple(out)

    # ---- statements
    def statements(self, body: cst.BaseSuite, indent: str) -> list[str]:
        stmts = body.body if isinstance(body, cst.IndentedBlock) else [body]
        out: list[str] = []
        for i, s in enumerate(stmts):
            if self.in_loop:
                self.loop_pos = i
            out.extend(self.statement(s, indent))  # type: ignore[arg-type]
        return out

    def statement(self, s: cst.CSTNode, indent: str) -> list[str]:
        self.line = self.tf.line(s) or self.line
        if isinstance(s, cst.SimpleStatementLine):
            out: list[str] = []
            for small in s.body:
                self.line = self.tf.line(small) or self.line
                out.extend(indent + ln for ln in self.small(small))
            return out
        if isinstance(s, cst.If):
            lines = [f"{indent}if {self._value(s.test)}:", *self.statements(s.body, indent + "    ")]
            if len(lines) == 1:
                lines.append(indent + "    pass")
            if s.orelse is not None:
                if isinstance(s.orelse, cst.If):
                    raise Declined(self.line, "elif in a tile kernel is not in the rule subset")
                lines += [f"{indent}else:", *(self.statements(s.orelse.body, indent + "    ") or [indent + "    pass"])]
            return lines
        if isinstance(s, cst.For):
            return self._loop(s, indent)
        raise Declined(self.line, f"a {type(s).__name__} statement is not in the tile rules")

    def small(self, s: cst.BaseSmallStatement) -> list[str]:
        if isinstance(s, cst.Expr):
            if isinstance(s.value, cst.SimpleString):
                return []
            if isinstance(s.value, cst.Call) and tl_name(s.value.func) == "store":
                return [self._store(s.value)]
            if isinstance(s.value, cst.Call) and tl_name(s.value.func) in ("static_assert", "multiple_of", "assume"):
                return []
            return [self._value(s.value)]
        if isinstance(s, (cst.Assign, cst.AnnAssign)):
            target = s.targets[0].target if isinstance(s, cst.Assign) and len(s.targets) == 1 else None
            if isinstance(s, cst.AnnAssign):
                target = s.target
            if not isinstance(target, cst.Name) or s.value is None:
                raise Declined(self.line, "tuple assignments are not in the tile rules")
            return self._assign(target.value, s.value)
        if isinstance(s, cst.AugAssign) and isinstance(s.target, cst.Name):
            name = s.target.value
            if name in self.ptrs:
                return []  # pointer advances were read before the loop body (_advances)
            if name in self.pointers:
                raise Declined(self.line, f"the argument pointer '{name}' is advanced in place")
            self._carry(name)
            return [f"{name} {code(s.operator).strip()} {self._value(s.value)}"]
        if isinstance(s, cst.Pass):
            return ["pass"]
        raise Declined(self.line, f"a {type(s).__name__} statement is not in the tile rules")

    def _assign(self, name: str, value: cst.BaseExpression) -> list[str]:
        text = code(value)
        used = {tl_name(c.func) for c in calls(value)}
        if isinstance(value, cst.Call) and tl_name(value.func) in ("make_block_ptr", "advance"):
            if tl_name(value.func) == "advance":
                if not self.in_loop:
                    raise Declined(self.line, "tl.advance outside the K loop is not in the tile rules")
                return []  # read before the loop body (_advances)
            if self.in_loop:
                raise Declined(self.line, "block pointers made inside the K loop are not in the tile rules")
            self.ptrs[name] = block_ptr(value, self.env, self.pointers, self.line)
            return []
        head = terms(value)[0]
        if isinstance(head, cst.Name) and (head.value in self.pointers or head.value in self.ptrs):
            if self.in_loop:
                raise Declined(self.line, "pointers built inside the K loop are not in the tile rules")
            self.ptrs[name] = self._access_axes(value)
            return []
        if "arange" in used:
            inner, wrap = value, False
            if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Modulo):
                inner, wrap = value.left, True  # `% M` wraps rows past the edge; Pallas pads them (see the header)
            form = affine(inner, self.env)
            if form is None or not form.aranges():
                raise Declined(self.line, f"the offset '{' '.join(text.split())}' is not affine in tl.arange")
            self.offsets[name] = form
            self.env.forms[name] = form
            if wrap:
                self.wraps.add(name)
            return []
        if "program_id" in used or names_in(text) & self.pidvars:
            if self.in_loop or "load" in used:
                raise Declined(self.line, f"'{name}' mixes program ids with loaded data or the K loop")
            self.pidvars.add(name)
            self.env.forms[name] = Affine(((f"t:{name}", "1"),))
            self.swizzle.append(f"{name} = {py(value, self.line)}")
            return []
        scalar = names_in(text) <= self.names | self.scalars | {"tl", "triton", "min", "max", "int"}
        if scalar and not self.in_loop and not self.after_loop:
            try:  # a scalar the program-id mapping may read (num_pid_m = tl.cdiv(M, BLOCK_SIZE_M))
                self.swizzle.append(f"{name} = {py(value, self.line)}")
                self.scalars.add(name)
            except Declined:
                pass
        if self.in_loop:
            self._carry(name)
        elif self.after_loop and name in self.assigned_before and name not in self.carried:
            raise Declined(self.line, f"'{name}' is reassigned after the K loop")
        else:
            self.assigned_before.add(name)
        self.exprs[name] = value
        self.env.data.add(name)
        return [f"{name} = {self._value(value)}"]

    def _carry(self, name: str) -> None:
        if not self.in_loop or name in self.carried or name not in self.assigned_before:
            return
        init = self.exprs.get(name)
        if not (isinstance(init, cst.Call) and tl_name(init.func) in ("zeros", "full")):
            raise Declined(
                self.line,
                f"'{name}' is carried across the K loop but not initialised with tl.zeros/tl.full(shape, dtype=...)",
            )
        shape = call_arg(init, 0, "shape")
        dtype = call_arg(init, 1 if tl_name(init.func) == "zeros" else 2, "dtype")
        self.carried[name] = (self._value(shape) if shape else "()", self._value(dtype) if dtype else "jnp.float32")

    def _loop(self, s: cst.For, indent: str) -> list[str]:
        if self.in_loop or self.loop:
            raise Declined(self.line, "more than one loop (or a nested loop) in a tile kernel")
        if not isinstance(s.target, cst.Name) or not isinstance(s.iter, cst.Call) or code(s.iter.func) != "range":
            raise Declined(self.line, "only `for k in range(...)` loops are in the tile rules")
        args = [a.value for a in s.iter.args]
        k = s.target.value
        if len(args) == 3 and code(args[0]) == "0" and code(args[2]) != "1":
            step = code(args[2])
            self.env.forms[k] = Affine((("iter", step),))
            first = f"{k} = {GRID[2]} * ({step})"
        elif len(args) == 1 or (code(args[0]) == "0" and (len(args) == 2 or code(args[2]) == "1")):
            self.env.forms[k] = Affine((("iter", "1"),))
            first = f"{k} = {GRID[2]}"
        else:
            raise Declined(self.line, f"the loop range '{code(s.iter)}' does not start at 0")
        self.loop = {"count": f"len(range({', '.join(py(a, self.line) for a in args)}))", "line": self.line}
        self._advances(s.body)
        self.in_loop = True
        body = self.statements(s.body, indent)
        self.in_loop = False
        self.after_loop = True
        out = [f"{indent}{first}"]
        for name in self.carried:
            out.append(f"{indent}@pl.when({GRID[2]} == 0)")
            out.append(f"{indent}def _init_{name}():")
            out.append(
                f"{indent}    _acc_{name}[...] = jnp.broadcast_to({name}, _acc_{name}.shape).astype(_acc_{name}.dtype)"
            )
            out.append(f"{indent}{name} = _acc_{name}[...]")
        if not self.carried:
            raise Declined(self.loop["line"], "a loop that carries no value (no accumulator) is not in the tile rules")  # type: ignore[arg-type]
        out += body
        out += [f"{indent}_acc_{n}[...] = {n}" for n in self.carried]
        return [*out, _LOOP_END]

    def _advances(self, body: cst.BaseSuite) -> None:
        stmts = body.body if isinstance(body, cst.IndentedBlock) else []
        for i, st in enumerate(stmts):
            if not isinstance(st, cst.SimpleStatementLine):
                continue
            for small in st.body:
                if block_advance(small, i, self.ptrs, self.tf.line(small) or self.line):
                    continue
                if not (isinstance(small, cst.AugAssign) and isinstance(small.target, cst.Name)):
                    continue
                p = self.ptrs.get(small.target.value)
                if p is None:
                    continue
                self.line = self.tf.line(small) or self.line
                if not isinstance(small.operator, cst.AddAssign):
                    raise Declined(self.line, f"the pointer '{small.target.value}' moves backwards")
                inc = norm(code(small.value))
                hits = [
                    ax
                    for ax, a in ((0, p.rows), (1, p.cols))
                    if a.tile is None
                    and inc
                    in (
                        norm(f"{a.size}*{a.stride}"),
                        norm(f"{a.stride}*{a.size}"),
                        *([norm(a.size)] * (a.stride == "1")),
                    )
                ]
                if len(hits) != 1:
                    raise Declined(
                        self.line,
                        f"the pointer advance '{code(small.value)}' of '{small.target.value}' is not "
                        "BLOCK * stride of one untiled axis",
                    )
                p.advance, p.advanced_at = hits[0], i

    # ---- the whole kernel
    def translate(self) -> TilePort:
        lines = self.statements(self.fn.body, "    ")
        if not self.stored:
            raise Declined(self.tf.line(self.fn), "the tile kernel stores nothing")
        if len(self.stored) > 1:
            raise Declined(self.tf.line(self.fn), "tile kernels storing several arrays are not in the rule subset")
        out = next(iter(self.stored))
        t0, t1 = (a.tile[2:] for a in self.layout[out])  # type: ignore[index]
        roles = {f"t:{t0}": 0, f"t:{t1}": 1, "iter": 2, None: None}
        for p, (r, c) in self.layout.items():
            for a in (r, c):
                if a.tile not in roles:
                    raise Declined(self.tf.line(self.fn), f"'{p}' is tiled by '{a.tile[2:]}', which the output is not")  # type: ignore[index]
        if "iter" in roles and self.loop == {} and any("iter" in (r.tile, c.tile) for r, c in self.layout.values()):
            raise Declined(self.tf.line(self.fn), "a K-loop offset outside a loop")
        name = self.fn.name.value
        inputs = [p.name for p in self.params if p.name in self.loaded]
        stored = [out]
        scalars = [p.name for p in self.params if p.name not in self.pointers]
        head = [f"    {t0} = {GRID[0]} = pl.program_id(0)", f"    {t1} = {GRID[1]} = pl.program_id(1)"]
        if self.loop:
            head.append(f"    {GRID[2]} = pl.program_id(2)")
        used = "\n".join(lines)
        head += [f"    {p}_dtype = {p}_ref.dtype" for p in inputs if f"{p}_dtype" in used]
        head += [f"    {p}_dtype = {p}_out.dtype" for p in stored if p not in inputs and f"{p}_dtype" in used]
        lines = [ln.replace("_cast(", "_tcast(") for ln in lines]  # f16 stays f32 in the kernel (runtime.py)
        body = self._split_last(lines) if self.loop else lines
        sig = ", ".join(
            [*(f"{p}_ref" for p in inputs), *(f"{p}_out" for p in stored), *(f"_acc_{n}" for n in self.carried)]
        )
        src = [f"def _k_{name}({sig}, *, {', '.join([*scalars, '_W', '_NK'])}):", *head, *body]
        kw = "".join(f"{s}=None, " for s in scalars)
        mapping = [f"def _tiles_{name}(_p, *, {kw}**_unused):", *(f"    {ln}" for ln in self.swizzle)]
        mapping.append(f"    return {t0}, {t1}")
        return TilePort(
            name,
            self.tf.line(self.fn),
            self.params,
            tuple(stored),
            "\n".join(src) + "\n\n\n" + "\n".join(mapping) + "\n",
            self._launch(name, inputs, out, scalars, roles),
        )

    def _split_last(self, lines: list[str]) -> list[str]:
        """The statements after the loop go under `pl.when(k == last)`, reading the carried values back."""
        end = lines.index(_LOOP_END)
        tail = lines[end + 1 :]
        lines = lines[:end]
        if not tail:
            return lines
        fin = [f"    @pl.when({GRID[2]} == _NK - 1)", "    def _finish():"]
        fin += [f"        {n} = _acc_{n}[...]" for n in self.carried]
        fin += ["    " + ln for ln in tail]
        return lines[:end] + fin

    def _launch(self, name: str, inputs: list[str], out: str, scalars: list[str], roles: dict) -> str:
        params = ", ".join(f"{p.name}={self.defaults.get(p.name, p.default or 'None')}" for p in self.params)
        meta = ", ".join(f"{p.name}={p.name}" for p in self.params if p.constexpr)
        arrays = []
        for p in [*inputs, *(x for x in [out] if x not in inputs)]:
            r, c = self.layout[p]
            arrays.append(
                f'("{p}", {p}, ({r.size}, {roles[r.tile]}, {r.stride}), ({c.size}, {roles[c.tile]}, {c.stride}))'
            )
        bounds = ", ".join(f"({axis}, {b})" for axis, b in self.stored[out])
        carried = ", ".join(f"({shape}, {dtype})" for shape, dtype in self.carried.values())
        count = self.loop.get("count", "None")
        return (
            f"def _launch_{name}(grid, {params}, **_launch_options):\n"
            f"    if callable(grid):\n        grid = grid(dict({meta}))\n"
            f"    return _launch_tiles(_k_{name}, _tiles_{name}, grid, [{', '.join(arrays)}], "
            f'({", ".join(repr(i) for i in inputs)}{"," if len(inputs) == 1 else ""}), "{out}", '
            f"dict({', '.join(f'{s}={s}' for s in scalars)}), {count}, [{carried}], [{bounds}])\n"
        )
