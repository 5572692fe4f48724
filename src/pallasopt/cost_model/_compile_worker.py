"""Child process of `cost_model.compiler`: compile one function of a kernel module for a TPU, deviceless.

Protocol: one JSON request on stdin, one JSON reply on stdout (nothing else is written there: fd 1 is pointed at
stderr while JAX and libtpu run). Request keys: ``module_file`` (the source, written to a temp file by the
parent), ``path`` (the user's path, for messages), ``entry``, ``dims``, ``topology``, optionally ``kernels_only``
(compile only the entry's pallas_calls, `kernels_alone`). Reply: ``ok``, ``stage``
(where it failed: import, entry, inputs, trace, lower, compile), ``error``, ``error_type``, ``ops`` (one dict
per HLO instruction of the entry computation and called computations that carries a backend config: ``name``,
``opcode``, ``target`` (custom-call target or ""), ``scoped_vmem`` and ``bundle_cycles``), ``cost_analysis``,
``compile_s``.

Run by the parent with the environment already set (LIBTPU_INIT_ARGS, TPU_SKIP_MDS_QUERY, JAX_PLATFORMS=cpu).
Private interfaces used: `jax.experimental.topologies.get_topology_desc` and the layout of the compiled HLO text.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
from typing import Any

from .hlo_traffic import hbm_traffic_bytes

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\S+.*?\s([\w\-]+)\(")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_SCOPED = re.compile(r'"used_scoped_memory_configs":\[([^\]]*)\]')
_SIZE = re.compile(r'"memory_space":"1"[^}]*?"size":"(\d+)"')
_BUNDLE = re.compile(r'"bundle_analysis_data":\{"estimated_cycles":"(\d+)"')


def hlo_ops(hlo_text: str) -> list[dict[str, Any]]:
    """Instructions of a compiled HLO module that carry a TPU backend config, with what the config says."""
    ops: list[dict[str, Any]] = []
    for line in hlo_text.splitlines():
        if "backend_config=" not in line:
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        target = _TARGET.search(line)
        scoped = _SCOPED.search(line)
        sizes = [int(s) for s in _SIZE.findall(scoped.group(1))] if scoped else []
        bundle = _BUNDLE.search(line)
        ops.append(
            {
                "name": m.group(1),
                "opcode": m.group(2),
                "target": target.group(1) if target else "",
                "scoped_vmem": max(sizes) if sizes else None,
                "bundle_cycles": int(bundle.group(1)) if bundle else None,
            }
        )
    return ops


def _where(exc: BaseException, module_file: str, path: str) -> str:
    """``path:line: `` of the innermost frame of the candidate module in `exc`'s traceback ("" if none)."""
    names = (module_file, path)  # the module's code objects carry the user's path (`exec_module`)
    if isinstance(exc, SyntaxError) and exc.filename in names and exc.lineno:
        return f"{path}:{exc.lineno}: "
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename in names]
    return f"{path}:{frames[-1].lineno}: " if frames else ""


def _fail(stage: str, exc: BaseException, t0: float, request: dict[str, Any] | None = None) -> dict[str, Any]:
    msg = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if stage in ("compile", "entry"):
        msg = str(exc)  # the compiler's message verbatim (it starts with its status code), or ours
    elif isinstance(exc, _UserModuleError):
        msg = str(exc)
    elif request is not None:  # the user's code (or lowering of it) raised: say where in their file
        msg = _where(exc, request["module_file"], request["path"]) + msg
    if request is not None:  # name the user's file, not our temporary copy of it
        module_file = request["module_file"]
        msg = msg.replace(module_file, request["path"])
        msg = msg.replace(f"({os.path.basename(module_file)}, line", f"({request['path']}, line")
    return {
        "ok": False,
        "stage": stage,
        "error": msg,
        "error_type": type(exc).__name__,
        "compile_s": time.perf_counter() - t0,
    }


def _load(request: dict[str, Any]) -> Any:
    """Run the candidate as Python imports a module (`workload.exec_module`: registered in `sys.modules`, its
    package imported for relative imports), with code objects named after the user's file, not our temporary copy.
    A `KernelError` (syntax error, failing import) is re-raised as a plain error carrying its one-line message."""
    from pallasopt.errors import KernelError
    from pallasopt.workload import exec_module

    with open(request["module_file"], encoding="utf-8") as f:
        source = f.read()
    try:
        return exec_module(source, request["path"])
    except KernelError as e:
        raise _UserModuleError(str(e)) from None


def kernels_alone(closed: Any, sharding: Any) -> Any:
    """A jitted program of only the `pallas_call`s of a traced entry (`closed`, its ClosedJaxpr), each on inputs of
    its own operands' shapes, traced for `sharding`: what the compiler tier profiles when libtpu's static profile of
    the whole entry fails on the wrapper's XLA ops (or takes too long on them). Literal operands stay literals."""
    import jax
    from jax.extend.core import Literal

    from pallasopt.ir.trace import find_pallas_call_chains

    eqns = [chain[-1] for chain in find_pallas_call_chains(closed.jaxpr)]
    if not eqns:
        raise ValueError("the entry's trace has no pallas_call")
    structs = [
        jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, sharding=sharding)
        for eqn in eqns
        for v in eqn.invars
        if not isinstance(v, Literal)
    ]

    def only(*flat: Any) -> list[Any]:
        it, outs = iter(flat), []
        for eqn in eqns:
            args = [v.val if isinstance(v, Literal) else next(it) for v in eqn.invars]
            outs.extend(eqn.primitive.bind(*args, **eqn.params))
        return outs

    return jax.jit(only, out_shardings=sharding).trace(*structs)


class _UserModuleError(Exception):
    """The user's module failed to import; the message already names the file and line."""


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Compile ``request['entry']`` for device 0 of ``request['topology']``; never raises."""
    t0 = time.perf_counter()
    try:
        import jax
        from jax.experimental import topologies
        from jax.sharding import SingleDeviceSharding
    except Exception as exc:  # libtpu or jax broken: not the candidate's fault
        return _fail("setup", exc, t0)

    try:
        module = _load(request)
    except BaseException as exc:
        return _fail("import", exc, t0, request)

    fn = getattr(module, request["entry"], None)
    make_inputs = getattr(module, "make_inputs", None)
    if not callable(fn) or not callable(make_inputs):
        missing = request["entry"] if not callable(fn) else "make_inputs"
        return _fail("entry", AttributeError(f"{request['path']}: no function {missing!r}"), t0)

    try:
        device = topologies.get_topology_desc(request["topology"], platform="tpu").devices[0]
    except Exception as exc:
        return _fail("setup", exc, t0)
    sharding = SingleDeviceSharding(device)
    # Code that asks `pltpu.get_tpu_info()` (or `emit_pipeline`) at trace time reads the default device's kind.
    jax.config.update("jax_default_device", device)

    dims = request.get("dims") or {}
    try:
        structs = jax.eval_shape(lambda: make_inputs(jax.random.key(0), **dims))
        args = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), structs)
        if not isinstance(args, tuple | list):
            args = (args,)
    except BaseException as exc:
        return _fail("inputs", exc, t0, request)
    try:
        traced = jax.jit(fn, out_shardings=sharding).trace(*args)
        if request.get("kernels_only"):
            traced = kernels_alone(traced.jaxpr, sharding)
    except BaseException as exc:
        return _fail("trace", exc, t0, request)
    try:
        lowered = traced.lower()
    except BaseException as exc:
        return _fail("lower", exc, t0, request)
    try:
        compiled = lowered.compile()
    except BaseException as exc:
        return _fail("compile", exc, t0, request)
    compile_s = time.perf_counter() - t0

    cost: dict[str, float] = {}
    try:
        raw = compiled.cost_analysis()
        if isinstance(raw, list | tuple):  # older JAX returned one dict per computation
            raw = raw[0] if raw else {}
        for k, v in (raw or {}).items():
            if isinstance(v, int | float):
                cost[str(k)] = float(v)
    except Exception:
        pass
    text = ""
    try:
        text = compiled.as_text()
        ops = hlo_ops(text)
    except Exception:
        ops = []
    try:
        hbm = hbm_traffic_bytes(text)
    except Exception:  # a figure for the XLA reference's floor; its absence is not the compile's failure
        hbm = None
    return {"ok": True, "ops": ops, "cost_analysis": cost, "hbm_bytes": hbm, "compile_s": compile_s}


def main() -> None:
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything JAX, libtpu or the user's module prints goes to stderr
    sys.stdout = sys.stderr
    try:
        reply = run(json.loads(sys.stdin.read()))
    except BaseException as exc:  # a bug here: still answer in JSON
        reply = {"ok": False, "stage": "worker", "error": repr(exc), "error_type": type(exc).__name__}
    out.write(json.dumps(reply))
    out.flush()


if __name__ == "__main__":
    main()
