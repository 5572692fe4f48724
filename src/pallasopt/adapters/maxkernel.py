"""The MaxKernel loader: a task folder (``reference.py`` with ``get_inputs``, ``computation``) as reference + inputs."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import KernelError
from ..pyparse import parse_module
from ..workload import exec_module, read_file
from ._common import (
    DIMS_GLOBAL,
    SuiteWorkload,
    _Bridge,
    _builder_kwargs,
    _finish,
    _is_dim,
    _module_global,
    _positional_names,
    _require,
    _seeded_from,
    _with_notes,
    parse_source,
    top_names,
    wrap_dim_sites,
)

MAXKERNEL_TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}  # MaxKernel/tools/test_harness_template.py ATOL/RTOL


def load_maxkernel(
    task_dir: str | Path, *, dtype: str | None = None, case: int = 0, survey: bool = True
) -> SuiteWorkload:
    """Load a MaxKernel task folder (``reference.py``; a sibling module defining ``computation`` is the kernel file).

    A path to a ``reference.py``-style file works too. ``case`` picks one pair when ``get_inputs`` returns a list.
    """
    p = Path(task_dir)
    if not p.exists():
        raise KernelError("no such file or folder", path=str(p), hint="pass a MaxKernel task folder")
    ref = p / "reference.py" if p.is_dir() else p
    if not ref.is_file():
        raise KernelError(
            "no reference.py in the task folder",
            path=str(p),
            hint="a MaxKernel task folder holds reference.py with get_inputs() and computation(...)",
        )
    kernels = [f for f in sorted(ref.parent.glob("*.py")) if f != ref and _defines_computation(f)]
    hand = kernels[0] if len(kernels) == 1 else None
    sw = maxkernel_from_source(
        read_file(ref),
        str(ref),
        name=ref.parent.name if ref.name == "reference.py" else ref.stem,
        dtype=dtype,
        case=case,
        hand_tuned_source=read_file(hand) if hand else None,
        hand_tuned_path=str(hand) if hand else None,
        survey=survey,
    )
    if len(kernels) > 1:
        listed = ", ".join(k.name for k in kernels)
        note = f"several kernel files define computation ({listed}); none was taken as hand_tuned"
        sw = _with_notes(sw, (note,))
    return sw


def _defines_computation(path: Path) -> bool:
    try:
        tree = parse_module(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return False
    return "computation" in top_names(tree)


def _literal_dims(func: ast.FunctionDef) -> tuple[dict[str, int], list[tuple[int, int, int, str]]]:
    """Integer literals assigned at the top of `func` (to names or dict-literal keys), and where each one sits."""
    dims: dict[str, int] = {}
    sites: list[tuple[int, int, int, str]] = []

    def take(name: str, node: ast.expr) -> None:
        value = node.value if isinstance(node, ast.Constant) else None
        if isinstance(value, int) and _is_dim(name, value) and node.end_col_offset is not None:
            dims.setdefault(name, value)
            sites.append((node.lineno, node.col_offset, node.end_col_offset, name))

    for stmt in func.body:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        # `height = width = 128`: one literal, one site; the first name is the dim and the others follow it
        for target in targets[:1]:
            if isinstance(target, ast.Name) and isinstance(value, ast.Dict):
                for k, v in zip(value.keys, value.values, strict=True):
                    if isinstance(k, ast.Constant) and isinstance(k.value, str):
                        take(k.value, v)
            elif isinstance(target, ast.Name) and value is not None:
                take(target.id, value)
            elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                for t, v in zip(target.elts, value.elts, strict=True):
                    if isinstance(t, ast.Name):
                        take(t.id, v)
    return dims, sites


def maxkernel_from_source(
    source: str,
    path: str,
    *,
    name: str | None = None,
    dtype: str | None = None,
    case: int = 0,
    hand_tuned_source: str | None = None,
    hand_tuned_path: str | None = None,
    survey: bool = True,
) -> SuiteWorkload:
    """Load a MaxKernel ``reference.py`` given as source text (`path` labels tracebacks and errors)."""
    tree = parse_source(source, path)
    needed = {"get_inputs": "the input builder", "computation": "the reference"}
    _require(tree, path, needed, "MaxKernel reference.py", ("create_inputs", "workload", "JAXBench workload"))
    func = top_names(tree)["get_inputs"]
    if not isinstance(func, ast.FunctionDef):
        raise KernelError("`get_inputs` is not a function", path=path, line=func.lineno)
    dims, sites = _literal_dims(func)
    module = exec_module(wrap_dim_sites(source, sites), path)
    setattr(module, DIMS_GLOBAL, {})
    names, star = _positional_names(module.computation)
    line = func.lineno

    def build(key: Any, d: dict[str, int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        with _module_global(module, DIMS_GLOBAL, dict(d)), _seeded_from(key, module):
            out = module.get_inputs(**_builder_kwargs(module.get_inputs, key, dtype))
        dynamic, static = _one_case(out, case, path, line)
        static_names = names[len(dynamic) :] if not star else []
        keys = [static_names[i] if i < len(static_names) else f"static_{i}" for i in range(len(static))]
        return tuple(dynamic), dict(zip(keys, static, strict=True))

    def call(args: tuple[Any, ...], params: dict[str, Any]) -> Any:
        return module.computation(*args, *params.values())

    hand_call, hpath = None, None
    if hand_tuned_source is not None:
        hpath = hand_tuned_path or str(Path(path).with_name("kernel.py"))
        _require(parse_source(hand_tuned_source, hpath), hpath, {"computation": "the kernel"}, "kernel file")
        hand_mod = exec_module(hand_tuned_source, hpath)

        def hand_call(args: tuple[Any, ...], params: dict[str, Any]) -> Any:
            return hand_mod.computation(*args, *params.values())

    bridge = _Bridge(path, dims, build, call, hand_call)
    return _finish(
        bridge,
        name=name or Path(path).parent.name,
        source=source,
        suite="maxkernel",
        arg_names=(names, star),
        hand=(hand_tuned_source, hpath),
        tolerance=dict(MAXKERNEL_TOLERANCE),
        options={"dtype": dtype, "case": case},
        notes=[],
        survey=survey,
    )


def _all_cases(out: Any, path: str, line: int) -> list[Any]:
    def is_pair(x: Any) -> bool:
        return isinstance(x, tuple) and len(x) == 2 and all(isinstance(p, tuple | list) for p in x)

    # The MaxKernel harness's rule: a list is a list of cases, a 2-tuple is one (dynamic_args, static_args) case.
    if isinstance(out, list) and out and all(is_pair(c) for c in out):
        cases = out
    elif is_pair(out):
        cases = [out]
    else:
        raise KernelError(
            f"get_inputs() returned {type(out).__name__}, not (dynamic_args, static_args)",
            path=path,
            line=line,
            hint="return ([arrays...], [static values...]) or a list of such pairs",
        )
    return list(cases)


def _one_case(out: Any, case: int, path: str, line: int) -> tuple[Sequence[Any], Sequence[Any]]:
    cases = _all_cases(out, path, line)
    if not 0 <= case < len(cases):
        raise KernelError(f"get_inputs() has {len(cases)} case(s); case {case} asked for", path=path, line=line)
    dynamic, static = cases[case]
    return dynamic, static


def case_count(source: str, path: str, dtype: str | None = None) -> int:
    """How many (dynamic_args, static_args) cases the task's ``get_inputs`` returns (built abstractly)."""
    import jax

    func = top_names(parse_source(source, path)).get("get_inputs")
    module = exec_module(source, path)
    counts: list[int] = []

    def run() -> int:
        out = module.get_inputs(**_builder_kwargs(module.get_inputs, None, dtype))
        counts.append(len(_all_cases(out, path, getattr(func, "lineno", 1))))
        return 0

    jax.eval_shape(run)
    return counts[0]
