"""Composing OUT.py: header, prelude, translated kernels and launcher, then REF.py and the entry wrapper."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from ..errors import UserError
from .autotune import autotune_configs, tpu_config
from .exprs import Declined
from .kernel import KernelPort, KernelTranslator, translate_helper
from .launcher import LaunchInfo, launches, rewrite_launcher
from .runtime import PRELUDE, TILE_PRELUDE
from .source import TritonFile, code, read_triton
from .tile_index import is_tile_kernel
from .tiles import TilePort, TileTranslator

HEADER_IMPORTS = "import functools\n\nimport jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"


@dataclass(frozen=True)
class KernelStatus:
    name: str
    line: int
    status: str  # "rules" | "declined"
    mode: str | None
    reason: str | None

    def line_text(self, path: str) -> str:
        if self.status == "declined":
            return f"{path}:{self.line}: declined {self.name}: {self.reason}"
        return f"{path}:{self.line}: ported {self.name} by rules ({self.mode} kernel)"


@dataclass(frozen=True)
class PortResult:
    source: str
    launcher: str
    kernels: tuple[KernelStatus, ...]
    notes: tuple[str, ...]

    @property
    def ported(self) -> bool:
        return any(k.status == "rules" for k in self.kernels)


def _bare_math(module: cst.Module) -> frozenset[str]:
    names: set[str] = set()

    class _V(cst.CSTVisitor):
        def visit_ImportFrom(self, n: cst.ImportFrom) -> None:
            if n.module is not None and code(n.module).startswith("triton") and not isinstance(n.names, cst.ImportStar):
                for a in n.names:
                    names.add(code(a.asname.name) if a.asname else code(a.name))

    module.visit(_V())
    return frozenset(names)


_SAFE = (
    cst.Integer,
    cst.Float,
    cst.SimpleString,
    cst.Name,
    cst.Attribute,
    cst.Call,
    cst.Dict,
    cst.Tuple,
    cst.List,
    cst.UnaryOperation,
    cst.BinaryOperation,
    cst.DictElement,
    cst.Element,
    cst.Arg,
)


def _constants(tf: TritonFile) -> list[str]:
    """Top-level `NAME = literal` lines (tl.constexpr(...) kept as an int with `.value`)."""
    known: set[str] = {"True", "False", "None"}
    out: list[str] = []
    for stmt in tf.module.body:
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            continue
        s = stmt.body[0]
        if isinstance(s, cst.Assign) and len(s.targets) == 1 and isinstance(s.targets[0].target, cst.Name):
            name, value = s.targets[0].target.value, s.value
        elif isinstance(s, cst.AnnAssign) and isinstance(s.target, cst.Name) and s.value is not None:
            name, value = s.target.value, s.value
        else:
            continue
        text = code(value).replace("tl.constexpr(", "_constexpr(")
        ok = True

        class _V(cst.CSTVisitor):
            def on_visit(self, n: cst.CSTNode) -> bool:
                nonlocal ok
                if isinstance(n, cst.Name) and n.value not in known and n.value != "_constexpr":
                    ok = False
                if isinstance(n, cst.Call) and code(n.func) != "_constexpr":
                    ok = False
                return not isinstance(n, cst.Attribute) or self._attr(n)

            def _attr(self, n: cst.Attribute) -> bool:
                n.value.visit(self)
                return False

        cst.parse_expression(text).visit(_V())
        if ok:
            known.add(name)
            out.append(f"{name} = {text}")
    return out


def choose_launcher(tf: TritonFile, name: str | None) -> cst.FunctionDef:
    candidates = {n: f for n, f in tf.functions.items() if any(k in tf.jit for k in launches(f))}
    if name is not None:
        if name not in tf.functions:
            raise UserError(
                f"--launcher {name}: no such top-level function",
                path=tf.path,
                line=1,
                hint=f"launchers in the file: {', '.join(candidates) or 'none'}",
            )
        if name not in candidates:
            raise UserError(
                f"--launcher {name} launches no @triton.jit kernel",
                path=tf.path,
                line=tf.line(tf.functions[name]),
                hint="name the function that calls kernel[grid](...)",
            )
        return tf.functions[name]
    if len(candidates) == 1:
        return next(iter(candidates.values()))
    if not candidates:
        raise UserError(
            "no launcher: no top-level function calls kernel[grid](...)",
            path=tf.path,
            line=1,
            hint="add the Python function that launches the kernel",
        )
    raise UserError(
        f"several launchers: {', '.join(f'{n} (line {tf.line(f)})' for n, f in candidates.items())}",
        path=tf.path,
        line=1,
        hint="name one with --launcher NAME",
    )


def _launch_fn(k: KernelPort) -> str:
    star = next((p.name for p in k.params if p.star), "_launch_options")
    params = ", ".join(f"{p.name}=None" for p in k.params if not p.star)
    meta = ", ".join(f"{p.name}={p.name}" for p in k.params if p.constexpr)
    arrays = ", ".join(f'("{p}", {p}, "{kind}", {stride or "None"})' for p, kind, stride in k.kinds)
    scalars = ", ".join(f"{p.name}={p.name}" for p in k.params if p.name not in {n for n, _, _ in k.kinds})
    stored = "".join(f'"{s}", ' for s in k.stored)
    inputs = "".join(f'"{s}", ' for s in k.inputs)
    aliased = "".join(f'"{s}", ' for s in k.aliased)
    return (
        f"def _launch_{k.name}(grid, {params}, **{star}):\n"
        f"    if callable(grid):\n        grid = grid(dict({meta}))\n"
        f'    return _launch(_k_{k.name}, grid, "{k.mode}", [{arrays}], ({stored}), dict({scalars}), {k.width}, ({inputs}), ({aliased}))\n'
    )


def port_source(path: str, text: str, ref_path: str, ref_text: str, launcher: str | None = None) -> PortResult:
    """Translate the Triton file `text` (named `path`) and wrap it with the reference module `ref_text`."""
    tf = read_triton(path, text)
    _check_reference(ref_path, ref_text)
    fn = choose_launcher(tf, launcher)
    bare = _bare_math(tf.module)
    helpers = frozenset(n for n in tf.jit if n not in tf.launched)
    ported: list[KernelPort | TilePort] = []
    tuned: dict[str, str] = {}
    status: list[KernelStatus] = []
    infos: dict[str, LaunchInfo] = {}
    helper_src: list[str] = []
    notes: list[str] = []
    for h in sorted(helpers):
        try:
            helper_src.append(translate_helper(tf, tf.jit[h], helpers, bare))
        except Declined as e:
            notes.append(f"{path}:{e.line}: helper {h} not translated: {e.why}")
    for name in dict.fromkeys(k for k in launches(fn) if k in tf.jit):
        kfn = tf.jit[name]
        try:
            kp = _translate(tf, kfn, helpers, bare, tuned, notes)
        except Declined as e:
            status.append(KernelStatus(name, e.line, "declined", None, e.why))
            params = tuple(p.name.value for p in kfn.params.params)
            infos[name] = LaunchInfo((), params, (), f"line {e.line}: {e.why}")
            continue
        ported.append(kp)
        status.append(KernelStatus(name, kp.line, "rules", kp.mode, None))
        names = tuple(p.name for p in kp.params)
        literal = tuple(p.name for p in kp.params if p.constexpr)
        infos[name] = LaunchInfo(tuple(names.index(s) for s in kp.stored), names, literal, None)
    try:
        launcher_src, launch_notes, consts = rewrite_launcher(tf, fn, infos)
    except Declined as e:
        raise UserError(
            f"launcher {fn.name.value}: {e.why}",
            path=path,
            line=e.line,
            hint="simplify the launcher to shape arithmetic, allocations and kernel[grid](...) calls",
        ) from e
    notes += launch_notes
    if not ported:
        first = status[0]
        raise UserError(
            f"no kernel of launcher {fn.name.value} is in the rule subset: declined {first.name}: {first.reason}",
            path=path,
            line=first.line,
            hint="rewrite that construct, or port this kernel by hand",
        )
    header = [f'"""Ported from {path} (launcher {fn.name.value}) by `pallasopt port` (rule-based translation).', ""]
    header += [k.line_text(path) for k in status] + notes
    header += ["", "Triton writes in place; here each launch returns the arrays its kernel stores to."]
    tiles = any(isinstance(k, TilePort) for k in ported)
    if tiles:
        header += [
            "2-D tile kernels run over a (tiles_m, tiles_n[, k_steps]) grid: the Triton program -> tile mapping (a",
            "grouped swizzle orders programs for a GPU's L2) is checked at trace time to be a permutation of the tile",
            "grid and then dropped, since a TPU core walks the grid in order with no shared L2 to group for. The K loop",
            "is the last, 'arbitrary' grid axis with its carried values in f32 VMEM scratch. Offsets wrapped with",
            "`% M` read Pallas' padding of the edge tile instead of wrapped rows: those rows only reach output rows",
            "the store mask drops (tile kernels with reductions are declined). Mosaic has no f16 vectors: f16 arrays",
            "are widened to f32 outside the kernel and the output narrowed back; a cast to f16 inside stays f32.",
        ]
    header += ['"""']
    parts = [
        "\n".join(header),
        HEADER_IMPORTS + ("import itertools\n\nfrom jax.experimental.pallas import tpu as pltpu\n" if tiles else ""),
        PRELUDE,
        TILE_PRELUDE if tiles else "",
        "\n".join(_constants(tf)),
        "\n".join(
            f"{k} = {v}  # a block size of the Triton launch, hoisted to a tunable constant" for k, v in consts.items()
        ),
        "\n".join(f"{k} = {v}  # from the kernel's first @triton.autotune config; tunable" for k, v in tuned.items()),
        *helper_src,
        *(k.body for k in ported),
        *(k.launch if isinstance(k, TilePort) else _launch_fn(k) for k in ported),
        launcher_src,
        "STATIC_ARGS = {}  # the launcher's non-array arguments (REF.py may set them)\nOUTPUTS = None  # which of the launcher's results are compared (REF.py may set them)\n",
        f"# ---- reference: {ref_path} (verbatim) ----\n" + ref_text,
        f'ENTRY = "ported"\n\n\ndef ported(*args):\n    return _select({fn.name.value}(*args, **STATIC_ARGS), OUTPUTS)\n',
    ]
    source = "\n\n".join(p.strip("\n") + "\n" for p in parts if p.strip())
    return PortResult(source, fn.name.value, tuple(status), tuple(notes))


def _translate(
    tf: TritonFile,
    fn: cst.FunctionDef,
    helpers: frozenset[str],
    bare: frozenset[str],
    tuned: dict[str, str],
    notes: list[str],
) -> KernelPort | TilePort:
    """The flat/rows rules, or the 2-D tile rules for kernels with `[:, None]` offsets or tl.dot (their decline wins)."""
    if not is_tile_kernel(fn):
        return KernelTranslator(tf, fn, helpers, bare).translate()
    configs = autotune_configs(tf, fn)
    if not configs:
        return TileTranslator(tf, fn, helpers, bare).translate()
    probe = TileTranslator(tf, fn, helpers, bare)
    probe.translate()  # for the layout: which block sizes are sublane rows and lane columns
    cfg, why = tpu_config(configs, probe.layout)
    t = TileTranslator(tf, fn, helpers, bare)
    for k, v in cfg.items():
        if k in t.names:
            const = f"{fn.name.value.strip('_').upper()}_{k}"
            tuned[const] = v
            t.defaults[k] = const
    chosen = ", ".join(f"{k}={v}" for k, v in cfg.items())
    notes.append(f"{tf.path}:{tf.line(fn)}: {fn.name.value} is autotuned: the port takes {why} ({chosen})")
    return t.translate()


def _check_reference(path: str, text: str) -> None:
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as e:
        raise UserError(f"syntax error: {e.message}", path=path, line=e.raw_line, hint="fix the Python syntax") from e
    names = {s.name.value for s in module.body if isinstance(s, cst.FunctionDef)}
    for need, what in (
        ("reference", "def reference(*args): the pure-JAX oracle, the launcher's array arguments"),
        ("make_inputs", "def make_inputs(key, **dims): the launcher's array arguments, same order"),
    ):
        if need not in names:
            raise UserError(f"no `{need}` function", path=path, line=1, hint=f"define `{what}`")
