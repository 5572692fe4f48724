"""Property tests over generated kernel modules (hypothesis).

Modules are elementwise or K-tiled matmul kernels whose block sizes are written in random styles (literal, module
constant, default argument, `functools.partial` keyword, local variable), with random legal and illegal block sizes and
dims, and sometimes a defect (no reference, a syntax error, a failing make_inputs, ...). Properties:

- loading (`KernelIR.from_source`: inspect, import, trace) either works or raises a `UserError` whose message is one
  line naming the file; any other exception is a bug;
- no pass emits a file that fails to parse or trace: `apply` declines (`PassNotApplicable`), refuses its parameters
  (`UsageError`), or returns an IR whose source `ast.parse`s and loads and traces again.

Only tracing happens (default dims are never materialized), so large dims cost nothing.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PallasoptError, PassNotApplicable, UsageError, UserError
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.base import Pass
from pallasopt.passes.registry import PASSES, parse_pipeline

PATH = "generated_kernel.py"
STYLES = ("literal", "constant", "default", "partial", "local")
SIZES = (8, 16, 64, 100, 128, 256, 512)
DIMS = (8, 64, 128, 200, 256, 384, 512, 1024, 2048)
DEFECTS = (
    "no_reference",
    "no_make_inputs",
    "syntax",
    "make_inputs_raises",
    "no_default",
    "bad_entry_name",
    "import_fails",
    "exits_on_import",
    "second_entry",
    "entry_raises",
    "reference_not_callable",
)

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@dataclass(frozen=True)
class Spec:
    """A generated kernel module, before rendering."""

    kind: str  # "elementwise" | "matmul"
    sizes: dict[str, int]  # block size per name: bm, bn (and bk for matmul)
    styles: dict[str, str]  # spelling per name
    dims: dict[str, int]
    cdiv: bool
    defect: str | None

    def render(self) -> str:
        return render(self)


def _spell(name: str, spec: Spec) -> tuple[str, list[str], list[str], list[str], dict[str, int]]:
    """How block size `name` appears: (expression, module lines, signature params, body lines, partial keywords)."""
    size, style = spec.sizes[name], spec.styles[name]
    if style == "literal":
        return str(size), [], [], [], {}
    if style == "constant":
        return name.upper(), [f"{name.upper()} = {size}"], [], [], {}
    if style == "default":
        return name, [], [f"{name}={size}"], [], {}
    if style == "partial":
        return name, [], [name], [], {name: size}
    return name, [], [], [f"    {name} = {size}"], {}


def render(spec: Spec) -> str:
    names = ("bm", "bn", "bk") if spec.kind == "matmul" else ("bm", "bn")
    expr: dict[str, str] = {}
    consts: list[str] = []
    defaults: list[str] = []
    kw_only: list[str] = []
    local: list[str] = []
    partial: dict[str, int] = {}
    for n in names:
        e, c, sig, body, kw = _spell(n, spec)
        expr[n] = e
        consts += c
        (kw_only if kw else defaults).extend(sig)
        local += body
        partial.update(kw)

    def grid(dim: str, n: str) -> str:
        return f"pl.cdiv({dim}, {expr[n]})" if spec.cdiv else f"{dim} // {expr[n]}"

    entry = "_impl" if partial else "fused_op"
    params = ["x", "y", *defaults] + (["*", *kw_only] if kw_only else [])
    lines = [
        "import functools",
        "",
        "import jax",
        "import jax.numpy as jnp",
        "from jax.experimental import pallas as pl",
        "",
        *consts,
        "",
        "",
    ]
    if spec.kind == "elementwise":
        lines += [
            "def _kernel(x_ref, y_ref, o_ref):",
            "    o_ref[...] = x_ref[...] * 2.0 + y_ref[...]",
            "",
            "",
            f"def {entry}({', '.join(params)}):",
            *local,
            "    m, n = x.shape",
            f"    spec = pl.BlockSpec(({expr['bm']}, {expr['bn']}), lambda i, j: (i, j))",
            "    return pl.pallas_call(",
            "        _kernel,",
            f"        grid=({grid('m', 'bm')}, {grid('n', 'bn')}),",
            "        in_specs=[spec, spec],",
            "        out_specs=spec,",
            "        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),",
            "    )(x, y)",
        ]
        ref = "    return x * 2.0 + y"
        shapes = ("(M, N)", "(M, N)")
    else:
        lines += [
            "def _kernel(x_ref, y_ref, o_ref):",
            "    @pl.when(pl.program_id(2) == 0)",
            "    def _():",
            "        o_ref[...] = jnp.zeros_like(o_ref)",
            "",
            "    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)",
            "",
            "",
            f"def {entry}({', '.join(params)}):",
            *local,
            "    m, k = x.shape",
            "    n = y.shape[1]",
            "    return pl.pallas_call(",
            "        _kernel,",
            f"        grid=({grid('m', 'bm')}, {grid('n', 'bn')}, {grid('k', 'bk')}),",
            "        in_specs=[",
            f"            pl.BlockSpec(({expr['bm']}, {expr['bk']}), lambda i, j, kk: (i, kk)),",
            f"            pl.BlockSpec(({expr['bk']}, {expr['bn']}), lambda i, j, kk: (kk, j)),",
            "        ],",
            f"        out_specs=pl.BlockSpec(({expr['bm']}, {expr['bn']}), lambda i, j, kk: (i, j)),",
            "        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),",
            "    )(x, y)",
        ]
        ref = "    return jnp.dot(x, y, preferred_element_type=jnp.float32)"
        shapes = ("(M, K)", "(K, N)")
    if partial:
        kws = ", ".join(f"{k}={v}" for k, v in partial.items())
        lines += ["", "", f"fused_op = functools.partial(_impl, {kws})"]
    dims = ", ".join(f"{k}={v}" for k, v in spec.dims.items())
    lines += [
        "",
        "",
        "def reference(x, y):",
        ref,
        "",
        "",
        f"def make_inputs(key, {dims}):",
        "    kx, ky = jax.random.split(key)",
        f"    return (jax.random.normal(kx, {shapes[0]}, jnp.float32), jax.random.normal(ky, {shapes[1]}, jnp.float32))",
        "",
    ]
    return _defect("\n".join(lines), spec.defect)


def _defect(src: str, defect: str | None) -> str:
    if defect is None:
        return src
    edits = {
        "no_reference": ("def reference(", "def oracle("),
        "no_make_inputs": ("def make_inputs(", "def inputs("),
        "syntax": ("def reference(x, y):", "def reference(x, y:"),
        "make_inputs_raises": ("    kx, ky = jax.random.split(key)", "    kx, ky = jax.random.split(key, 3)"),
        "no_default": ("def make_inputs(key, M=", "def make_inputs(key, M, Q="),
        "import_fails": ("import functools\n", "import functools\nimport not_a_module_anywhere\n"),
        "exits_on_import": ("import functools\n", "import functools\nraise SystemExit(1)\n"),
        "entry_raises": (
            "    return pl.pallas_call(",
            "    assert x.ndim == 3, 'wants 3-D'\n    return pl.pallas_call(",
        ),
        "reference_not_callable": ("def make_inputs(", "reference = 3\n\n\ndef make_inputs("),
    }
    if defect == "bad_entry_name":
        return 'ENTRY = "no_such_function"\n' + src
    if defect == "second_entry":
        return src + "\n\ndef other_op(x, y):\n    return fused_op(x, y) + pl.pallas_call(None, out_shape=x)(x)\n"
    old, new = edits[defect]
    assert old in src, (defect, old)
    return src.replace(old, new, 1)


@st.composite
def kernel_specs(draw: st.DrawFn, defects: bool = True, legal: bool = False) -> Spec:
    kind = draw(st.sampled_from(("elementwise", "matmul")))
    names = ("bm", "bn", "bk") if kind == "matmul" else ("bm", "bn")
    dim_names = {"bm": "M", "bn": "N", "bk": "K"}
    dims: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for n in names:
        dim = draw(st.sampled_from(DIMS[2:] if legal else DIMS))
        dims[dim_names[n]] = dim
        if legal:
            sizes[n] = draw(st.sampled_from([s for s in (8, 128, 256) if dim % s == 0 and s <= dim] or [dim]))
        else:
            sizes[n] = draw(st.sampled_from(SIZES))
    styles = {n: draw(st.sampled_from(STYLES)) for n in names}
    cdiv = draw(st.booleans())
    defect = draw(st.sampled_from((None, None, *DEFECTS))) if defects else None
    return Spec(kind, sizes, styles, dims, cdiv, defect)


def _assert_user_error(e: BaseException, src: str) -> None:
    assert isinstance(e, UserError), f"{type(e).__name__}: {e}\n--- module ---\n{src}"
    text = str(e)
    assert "\n" not in text and text.strip() == text, repr(text)
    if not isinstance(e, UsageError):
        assert text.startswith(PATH), text


@SETTINGS
@given(kernel_specs())
def test_loader_fails_only_with_one_line_user_errors(spec: Spec) -> None:
    src = spec.render()
    try:
        ir = KernelIR.from_source(src, PATH)
    except Exception as e:  # anything but a one-line UserError is a bug
        event(f"{type(e).__name__}: {str(e).split(':')[2] if ':' in str(e) else e}"[:60])
        _assert_user_error(e, src)
        return
    event("loaded")
    assert ir.calls and ir.entry in ("fused_op",), ir.entry


# ---------------------------------------------------------------------------------------------------------- passes

_IR_CACHE: dict[str, KernelIR | None] = {}


def _load(src: str) -> KernelIR | None:
    """Load once per source (hypothesis revisits examples); None when the module does not load."""
    if src not in _IR_CACHE:
        try:
            _IR_CACHE[src] = KernelIR.from_source(src, PATH)
        except UserError:
            _IR_CACHE[src] = None
    return _IR_CACHE[src]


def _param_text(draw: st.DrawFn, typ: object) -> str:
    """A spec value for a parameter of type `typ`: mostly plausible, sometimes junk."""
    origin = typing.get_origin(typ)
    if typ is bool:
        return draw(st.sampled_from(("true", "false", "maybe")))
    if typ is int:
        return str(draw(st.sampled_from((-1, 0, 1, 2, 3, 16, 64, 4096))))
    if origin is tuple:
        return ":".join(str(i) for i in draw(st.lists(st.integers(-1, 3), min_size=0, max_size=4)))
    return draw(st.sampled_from(("x", "1", "parallel", "")))


@st.composite
def pass_spec(draw: st.DrawFn, ir: KernelIR) -> str:
    """A random `-p` pipeline spec over the registered passes, with knob names taken from the IR (and junk)."""
    from pallasopt.passes.tile import knobs_of

    items = []
    for _ in range(draw(st.integers(1, 3))):
        cls = draw(st.sampled_from(PASSES))
        params: list[str] = []
        if cls.name == "tile":
            knobs = sorted({kn.name for kn in knobs_of(ir)})
            names = draw(st.lists(st.sampled_from(knobs), min_size=1, max_size=3, unique=True)) if knobs else []
            if draw(st.integers(0, 4)) == 0:
                names.append("nope")
            for name in names:
                params.append(f"{name}={draw(st.sampled_from((*SIZES, 24, 384, 1024, 2048)))}")
            if draw(st.booleans()):
                params.append(f"call={draw(st.sampled_from((0, 0, 1)))}")
        else:
            hints = typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):
                if draw(st.booleans()):
                    params.append(f"{f.name}={_param_text(draw, hints.get(f.name, str))}")
        items.append(cls.name + ("{" + ",".join(params) + "}" if params else ""))
    return ",".join(items)


def _apply_checked(p: Pass, ir: KernelIR) -> KernelIR:
    """Apply one pass; a decline or a refused parameter returns `ir`, anything else must re-parse and re-trace."""
    try:
        new = p.apply(ir)
    except (PassNotApplicable, UsageError) as e:
        event(f"{p.name}: {type(e).__name__}")
        return ir
    except PallasoptError as e:
        raise AssertionError(f"{p.spec()} emitted a module that does not load: {e}\n--- input ---\n{ir.source}") from e
    event(f"{p.name}: applied")
    ast.parse(new.source)
    again = KernelIR.from_source(new.source, PATH)
    assert len(again.calls) == len(ir.calls), p.spec()
    return new


@SETTINGS
@given(kernel_specs(defects=False), st.data())
def test_pass_specs_never_emit_a_broken_module(spec: Spec, data: st.DataObject) -> None:
    ir = _load(spec.render())
    if ir is None:
        return
    text = data.draw(pass_spec(ir), label="spec")
    try:
        passes = parse_pipeline(text)
    except UsageError as e:
        _assert_user_error(e, text)
        return
    for p in passes:
        ir = _apply_checked(p, ir)


@SETTINGS
@given(kernel_specs(defects=False, legal=True), st.data())
def test_every_offered_choice_applies_cleanly(spec: Spec, data: st.DataObject) -> None:
    ir = _load(spec.render())
    assert ir is not None, spec.render()
    chip = get_chip(data.draw(st.sampled_from(("v5e", "v6e", "v4")), label="target"))
    cls = data.draw(st.sampled_from(PASSES), label="pass")
    choices = cls.choices(ir, chip)
    if not choices:
        return
    _apply_checked(data.draw(st.sampled_from(choices), label="choice"), ir)  # a choice may still decline


@pytest.mark.parametrize("style", STYLES)
def test_tile_size_not_dividing_the_grid_declines(style: str) -> None:
    spec = Spec("elementwise", {"bm": 8, "bn": 128}, {"bm": style, "bn": style}, {"M": 2048, "N": 256}, True, None)
    ir = _load(spec.render())
    assert ir is not None
    from pallasopt.passes.tile import knobs_of

    knob = next(k.name for k in knobs_of(ir) if 0 in k.axes)
    with pytest.raises(PassNotApplicable, match="does not divide"):
        parse_pipeline(f"tile{{{knob}=384}}")[0].apply(ir)
