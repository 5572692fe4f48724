"""The JAXBench loader: a workload file (``CONFIG``, ``create_inputs``, ``workload``) as reference + inputs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import KernelError
from ..workload import exec_module, read_file
from ._common import (
    Call,
    SuiteWorkload,
    _Bridge,
    _builder_kwargs,
    _finish,
    _is_dim,
    _module_global,
    _positional_names,
    _require,
    _seeded_from,
    parse_source,
)

JAXBENCH_TOLERANCE = {"rtol": 1e-2, "atol": 1e-2}  # JAXBench/harness/correctness.py per its README


def load_jaxbench(path: str | Path, *, dtype: str | None = "bfloat16", survey: bool = True) -> SuiteWorkload:
    """Load a JAXBench workload file, or a benchmark folder holding ``baseline.py`` (and maybe ``optimized.py``).

    ``dtype`` is what JAXBench's harness passes to ``create_inputs`` (bfloat16); None keeps the file's default.
    """
    p = Path(path)
    if p.is_dir():
        if not (p / "baseline.py").is_file():
            raise KernelError(
                "no baseline.py in this folder", path=str(p), hint="pass a JAXBench workload file or benchmark folder"
            )
        p = p / "baseline.py"
    source = read_file(p)
    hand = p.parent / "optimized.py" if p.name == "baseline.py" else None
    hand_ok = hand is not None and hand.is_file()
    return jaxbench_from_source(
        source,
        str(p),
        dtype=dtype,
        hand_tuned_source=read_file(hand) if hand_ok and hand else None,
        hand_tuned_path=str(hand) if hand_ok else None,
        survey=survey,
    )


def jaxbench_from_source(
    source: str,
    path: str,
    *,
    dtype: str | None = "bfloat16",
    hand_tuned_source: str | None = None,
    hand_tuned_path: str | None = None,
    survey: bool = True,
) -> SuiteWorkload:
    """Load a JAXBench workload given as source text (`path` labels tracebacks and errors)."""
    needed = {"CONFIG": "the sizes dict", "create_inputs": "the input builder", "workload": "the reference"}
    _require(
        parse_source(source, path), path, needed, "JAXBench workload file", ("get_inputs", "computation", "MaxKernel")
    )
    module = exec_module(source, path)
    config = module.CONFIG
    if not isinstance(config, dict):
        raise KernelError("CONFIG is not a dict", path=path, hint="JAXBench's CONFIG is a dict of sizes and metadata")
    for name in ("create_inputs", "workload"):
        if not callable(getattr(module, name)):
            raise KernelError(f"`{name}` is not callable", path=path)
    base = dict(config)
    dims = {k: v for k, v in base.items() if _is_dim(k, v)}

    def build(key: Any, d: dict[str, int]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        cfg = {**base, **d}
        with _module_global(module, "CONFIG", cfg), _seeded_from(key, module):
            out = module.create_inputs(**_builder_kwargs(module.create_inputs, key, dtype))
        return (tuple(out) if isinstance(out, tuple | list) else (out,)), cfg

    def call(args: tuple[Any, ...], cfg: dict[str, Any]) -> Any:
        with _module_global(module, "CONFIG", cfg):
            return module.workload(*args)

    hand_call, hpath = None, None
    if hand_tuned_source is not None:
        hpath = hand_tuned_path or str(Path(path).with_name("optimized.py"))
        hand_call = _jaxbench_hand(hand_tuned_source, hpath, dims)
    bridge = _Bridge(path, dims, build, call, hand_call)
    stem = Path(path).parent.name if Path(path).name == "baseline.py" else Path(path).stem
    name = base["name"] if isinstance(base.get("name"), str) else stem
    tol = {k: float(base[k]) for k in ("rtol", "atol") if isinstance(base.get(k), float | int)}
    names, star = _positional_names(module.workload)
    notes = [] if not getattr(module, "_skip_jit", False) else ["the workload is not jit-compatible (_skip_jit)"]
    return _finish(
        bridge,
        name=str(name),
        source=source,
        suite="jaxbench",
        arg_names=(names, star),
        hand=(hand_tuned_source, hpath),
        tolerance={**JAXBENCH_TOLERANCE, **tol},
        options={"dtype": dtype},
        notes=notes,
        survey=survey,
    )


def _jaxbench_hand(source: str, path: str, dims: Mapping[str, int]) -> Call:
    _require(parse_source(source, path), path, {"workload": "the kernel"}, "JAXBench kernel file")
    hand = exec_module(source, path)

    def call(args: tuple[Any, ...], cfg: dict[str, Any]) -> Any:
        own = getattr(hand, "CONFIG", None)
        if not isinstance(own, dict):
            return hand.workload(*args)
        with _module_global(hand, "CONFIG", {**own, **{k: cfg[k] for k in dims if k in own}}):
            return hand.workload(*args)

    return call
