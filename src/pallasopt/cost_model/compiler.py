"""The deviceless TPU compiler tier: compile a kernel module with libtpu for a TPU we do not have.

An adapter over private interfaces (kept to this module and `_compile_worker`): the deviceless topology API
(`jax.experimental.topologies.get_topology_desc`), the libtpu flag ``--xla_jf_dump_static_llo_profile_to`` and the
``*_static_llo_profile.textproto`` files it writes, and the text of the compiled HLO module.

Each compile runs in a child process with a timeout, so a slow or crashing libtpu cannot take the caller down:
a fresh one (``python -m pallasopt.cost_model._compile_worker``), or, given a `CompilePool`, a warm worker that
imported JAX and libtpu once (`harness/warm.py`; the same `_compile_worker.run` answers, and a timeout or crash
kills only that worker). The environment changes (LIBTPU_INIT_ARGS, TPU_SKIP_MDS_QUERY,
ALLOW_MULTIPLE_LIBTPU_LOAD, JAX_PLATFORMS=cpu) are made in the child only, and ANTHROPIC_API_KEY is not passed on.

What the estimate means (see /work/shared/FACTS.md): the static LLO profile models the on-core schedule (MXU, VPU,
loads/stores, per-step synchronisation), not HBM bandwidth, so time ~ max(estimate, HBM bytes / bandwidth).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pallasopt.cost_model.hardware import Chip, get_chip

__all__ = ["CompilePool", "CompileReport", "compile_module", "libtpu_available", "parse_static_profile"]

PROFILE_FLAG = "--xla_jf_dump_static_llo_profile_to"
MOSAIC_TARGET = "tpu_custom_call"  # custom-call target of a Pallas TPU (Mosaic) kernel

# Targets where libtpu 0.0.42.1 aborts with the profile flag on, measured on a plain matmul: tpu7x ("LLO_CHECK
# failure ... LloOpcodeIsScalarBranch"), v4 ("Dma latency model is currently only supported on VF/VL/GF/GL", i.e.
# v5p, v5e and the v6 chips). They are compiled without it: VMEM and lowering are checked, no cycles come back.
_PROFILE_UNSUPPORTED = frozenset({"v4", "tpu7x"})

_NOISE = re.compile(
    r"^(WARNING|[IWE]\d{4} |=== Source Location|learning/|third_party/|platforms/|https://symbolize|\*\*\*|\s*$)"
)
_FATAL = re.compile(r"^F\d{4} [^\]]*\] (.*)")


@dataclass(frozen=True)
class CompileReport:
    """What compiling one function for one target gave. `ok=False` is data, not an exception.

    estimated_cycles: sum of the static LLO profile's ``estimated_cycles`` over every op of the compiled program
      (Pallas kernels and XLA ops alike); `kernel_cycles` and `xla_cycles` split it. None when no profile came back.
    estimated_s: ``estimated_cycles / chip.clock_hz * steps_scale`` (on-core time only: no HBM bandwidth model);
      with `call_scales`, each Pallas kernel's cycles are scaled by its own call's step ratio instead.
    call_scales: the step ratio of each `pallas_call` in program order, when the caller's reduced dims cut the calls'
      grids by different ratios (empty: `steps_scale` for all). `note` says so when the kernels could not be matched.
    per_op_cycles: ``("pallas:<hlo name>" | "xla:<hlo name>", cycles)`` for each profiled op.
    note: a remark on an ok report (no static profile on this target, or the profile crashed libtpu).
    vmem_bytes: scoped VMEM the compiler allocated (the largest over the Pallas kernels, else over all ops), or,
      on a VMEM overflow, the size the compiler asked for.
    cost_analysis: ``compiled.cost_analysis()`` as sorted (key, value) pairs (XLA ops only; a Pallas call has
      figures only if it carries a `pl.CostEstimate`).
    compile_s: wall time the caller waited: a fresh child's whole life (JAX import + trace + lower + compile), or a
      warm worker's request (trace + lower + compile).
    """

    ok: bool
    target: str
    error: str | None = None
    error_kind: str | None = None  # vmem_oom, import, entry, inputs, trace, lowering, compile, timeout, crash, ...
    estimated_cycles: int | None = None
    estimated_s: float | None = None
    per_op_cycles: tuple[tuple[str, int], ...] = ()
    vmem_bytes: int | None = None
    compile_s: float = 0.0
    steps_scale: float = 1.0
    call_scales: tuple[float, ...] = ()
    kernel_cycles: int | None = None
    xla_cycles: int | None = None
    cost_analysis: tuple[tuple[str, float], ...] = ()
    note: str | None = None  # e.g. why an ok compile has no cycle estimate
    hbm_bytes: int | None = None  # `hlo_traffic.hbm_traffic_bytes` of the compiled program (None: not read)


def libtpu_available() -> bool:
    """True when the `libtpu` package (the `tpu` extra) is importable; nothing is loaded."""
    try:
        return importlib.util.find_spec("libtpu") is not None
    except (ImportError, ValueError):
        return False


_ESTIMATE = re.compile(r'hlo_op_name:\s*"([^"]*)"\s*estimated_cycles:\s*(\d+)')


def parse_static_profile(text: str) -> list[tuple[str, int]]:
    """(hlo op name, estimated cycles) for each ``hlo_op_estimate`` in one static LLO profile textproto."""
    return [(name, int(cycles)) for name, cycles in _ESTIMATE.findall(text)]


def _read_profiles(directory: Path) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    for f in sorted(directory.glob("*_static_llo_profile.textproto")):
        with contextlib.suppress(OSError):
            found.extend(parse_static_profile(f.read_text(errors="replace")))
    return found


_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_OOM_PATTERNS = (
    re.compile(r"Scoped allocation with size ([\d.]+)([KMG]?)"),
    re.compile(r"Used ([\d.]+)([KMG]?) of [\d.]+[KMG]? vmem"),
    re.compile(r"Allocation \(size=(\d+)()\) would exceed memory"),
)


def _oom_bytes(msg: str) -> int | None:
    for pat in _OOM_PATTERNS:
        m = pat.search(msg)
        if m:
            return int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    return None


_PROFILE_TEMP = re.compile(r"scoped\s+([\d.]+)M\s+HLO temp\s+([\d.]+)M")


def profile_vmem_clash(msg: str) -> tuple[float, float] | None:
    """(scoped MiB, HLO temp MiB) when a VMEM overflow is the kernel's scoped VMEM plus "HLO temp" the program
    holds in VMEM only while the static profile is dumped, not the kernel alone. Measured with libtpu 0.0.42.1 on
    v5e, bench fused_02 (matmul, then a GELU call) tiled (1024, 2048, 2048) with a 64 MiB limit: with
    `--xla_jf_dump_static_llo_profile_to` the program's VMEM also holds an HLO temp of 0 bytes used and 100%
    fragmentation that grows with the arrays (none at M = N = K = 2048; 96 MiB at M = 2048, N = 4096, "Used 140.33M
    of 128.00M vmem ... scoped 44.33M HLO temp 96.00M"; 128 MiB at M = N = 4096), while the same program compiles
    without the profile at every one of those sizes."""
    m = _PROFILE_TEMP.search(msg)
    if m is None or float(m.group(2)) <= 0:
        return None
    return float(m.group(1)), float(m.group(2))


def _is_vmem_oom(msg: str) -> bool:
    return (
        "CompileTimeScopedVmemOom" in msg
        or "memory space vmem" in msg
        or ("RESOURCE_EXHAUSTED" in msg and "space=vmem" in msg)
    )


def _trim(msg: str, limit: int = 1200) -> str:
    """The useful part of a compiler message: drop HLO instruction dumps, protobuf blobs and log noise."""
    msg = re.sub(r"(for %[\w.\-]+) = .*?(\. Scoped allocation)", r"\1\2", msg, flags=re.S)
    msg = re.sub(r"(exceeded scoped vmem limit by [\d.]+[KMG]?)\..*", r"\1.", msg, flags=re.S)
    msg = re.sub(r"\s*\[type\.googleapis\.com/.*?'\]", "", msg, flags=re.S)
    msg = re.sub(r"\n\s*See https://openxla\.org/\S+ for more details\.", "", msg)
    msg = re.sub(r"\n{2,}", "\n", msg).strip()
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _crash_message(stderr: str, rc: int) -> str:
    """Why a worker died without answering: the signal, and libtpu's fatal message or the end of stderr."""
    why = _stderr_tail(stderr) or f"worker exited with status {rc}"
    if rc < 0:
        sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
        why = f"killed by {sig}" + (" (out of memory?)" if rc == -signal.SIGKILL else "") + f": {why}"
    return why


def _stderr_tail(stderr: str, lines: int = 8) -> str:
    """The last meaningful lines of a crashed child's stderr (fatal checks first)."""
    fatal = [m.group(1) for m in map(_FATAL.match, stderr.splitlines()) if m]
    if fatal:
        return _trim(fatal[-1])
    kept = [ln for ln in stderr.splitlines() if not _NOISE.match(ln)]
    return _trim("\n".join(kept[-lines:]))


_STAGE_KIND = {
    "import": "import",
    "entry": "entry",
    "inputs": "inputs",
    "trace": "trace",
    "lower": "lowering",
    "compile": "compile",
    "setup": "setup",
    "worker": "crash",
}


def _child_env(dump_dir: str | None) -> dict[str, str]:
    from ..config import child_env

    env = child_env()  # no credentials of any kind in the child (config.py reads the environment)
    if dump_dir is not None:
        env["LIBTPU_INIT_ARGS"] = f"{env.get('LIBTPU_INIT_ARGS', '')} {PROFILE_FLAG}={dump_dir}".strip()
    env["TPU_SKIP_MDS_QUERY"] = "1"
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    env["JAX_PLATFORMS"] = "cpu"  # never grab a real TPU the parent may hold; the topology API needs none
    src_root = str(Path(__file__).resolve().parents[2])  # .../src, so `-m pallasopt...` imports this copy
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src_root, env.get("PYTHONPATH", "")) if p)
    return env


def _run_child(request: dict[str, Any], env: dict[str, str], timeout_s: float) -> tuple[Any, str, int | None]:
    """Run the worker; returns (reply or None, stderr, returncode). returncode None means timed out."""
    from ..lifeline import child_command, deadline_for, kill_group, spawned, worker_code

    # A guarded child (lifeline): its own session, so a timeout kills libtpu's threads and children too; it dies
    # with this process and by itself after its deadline.
    argv = child_command(sys.executable, "pallasopt.cost_model._compile_worker", deadline_for(timeout_s))
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with spawned(argv, env, text=True, **pipes) as proc:
        try:
            out, err = proc.communicate(json.dumps(request), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
            return None, err, None
    try:
        reply = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        reply = None
    return reply, err, worker_code(proc.returncode)


# The note of a report whose entry compiled but whose static profile killed libtpu (on one of the entry's ops).
PROFILE_CRASHED = "no cycle estimate: the static profile crashed libtpu"


def compile_module(
    source: str,
    path: str,
    entry: str,
    dims: Mapping[str, int],
    target: str,
    *,
    steps_scale: float = 1.0,
    call_scales: Sequence[float] = (),
    timeout_s: float = 120,
    dump_profile: bool = True,
    pool: CompilePool | None = None,
    kernels_only: bool = False,
) -> CompileReport:
    """Compile `entry` of a kernel module for one device of `target`'s TPU topology, without a TPU.

    `entry` names a function of the module (the kernel entry, "reference" or "hand_tuned"); it is traced at
    ``make_inputs(key, **dims)`` under `jax.eval_shape` (never materialized) and compiled by libtpu in a
    subprocess killed after `timeout_s`. `path` is only used in messages. Returns a `CompileReport`; a candidate's
    failures (import error, lowering error, VMEM overflow, timeout, libtpu crash) come back as ``ok=False`` with
    `error_kind`, never as exceptions. An unknown `target` raises `UnknownTarget` (the caller's mistake).

    With `dump_profile`, libtpu writes a static cycle estimate per op. Its compile time and memory grow with the
    number of grid steps (~2.3 ms and ~240 KB per step; 262k steps ran out of memory), while the estimate is
    linear in the step count once a grid has >~100 steps. So the CALLER should pass reduced `dims` (same blocks,
    fewer steps) and ``steps_scale = full steps / reduced steps``; this function only multiplies:
    ``estimated_s = estimated_cycles / clock_hz * steps_scale`` (`estimated_cycles` stays the reduced program's).
    Where the reduction cut the calls' grids by different ratios, `call_scales` gives each call's own ratio (in the
    order the calls run in the entry's trace): the kernels' cycles are matched to the calls by their HLO names'
    sequence numbers, which follow the trace order (`kernel_cycles_in_call_order`).

    `pool`: compile in one of its warm workers instead of a fresh child (same report; `compile_s` is then what
    this call waited). The retry without the profile after libtpu crashed on it always runs in a fresh child.
    `kernels_only`: compile a program of the entry's pallas_calls alone, each on its own operands' shapes, none of
    the wrapper's XLA ops (`_compile_worker.kernels_alone`).
    """
    chip = get_chip(target)
    t0 = time.perf_counter()

    def report(**kw: Any) -> CompileReport:  # every exit goes through here
        kw.setdefault("compile_s", time.perf_counter() - t0)
        return CompileReport(target=chip.name, steps_scale=steps_scale, call_scales=tuple(call_scales), **kw)

    if chip.is_gpu or not chip.topology:
        return report(ok=False, error=f"{chip.name} is not a TPU: no deviceless compile", error_kind="unsupported")
    if not libtpu_available():
        return report(
            ok=False, error="libtpu not installed (pip install 'pallasopt[tpu]')", error_kind="libtpu_missing"
        )

    profile = dump_profile and chip.name not in _PROFILE_UNSUPPORTED
    with tempfile.TemporaryDirectory(prefix="pallasopt_compile_") as tmp:
        module_file = Path(tmp) / "candidate.py"
        module_file.write_text(source)
        dump_dir = Path(tmp) / "profile"
        dump_dir.mkdir()
        request = {
            "module_file": str(module_file),
            "path": path,
            "entry": entry,
            "dims": dict(dims),
            "topology": chip.topology,
            **({"kernels_only": True} if kernels_only else {}),
        }
        if pool is not None:
            reply, stderr, rc, profiles = pool.compile(request, profile, timeout_s)
        else:
            reply, stderr, rc = _run_child(request, _child_env(str(dump_dir) if profile else None), timeout_s)
            profiles = _read_profiles(dump_dir) if profile and reply is not None else []
        note = None
        if dump_profile and not profile:
            note = f"no cycle estimate: libtpu's static profile fails on {chip.name}"
        elif profile and rc is not None and reply is None:
            # libtpu died with the profile on (an abort, or killed for memory); the kernel itself may compile.
            note = f"{PROFILE_CRASHED} ({_crash_message(stderr, rc)})"
            remaining = timeout_s - (time.perf_counter() - t0)
            if remaining < 1:
                return report(ok=False, error=_crash_message(stderr, rc), error_kind="crash")
            profile = False
            reply, stderr, rc = _run_child(request, _child_env(None), remaining)
        clash = profile_vmem_clash(str(reply.get("error") or "")) if profile and reply and not reply.get("ok") else None
        if clash is not None:
            # The profile's own VMEM reservation overflowed, not the kernel: compile it without the profile.
            note = (
                f"no cycle estimate: with libtpu's static profile on, {clash[1]:g} MiB of the program's temporaries "
                f"sit in VMEM and this kernel's {clash[0]:g} MiB of scoped VMEM do not fit beside them (it compiles "
                "without the profile)"
            )
            remaining = timeout_s - (time.perf_counter() - t0)
            if remaining < 1:
                return _failure(reply, report)
            profile = False
            if pool is not None:
                reply, stderr, rc, _ = pool.compile(request, False, remaining)
            else:
                reply, stderr, rc = _run_child(request, _child_env(None), remaining)
        if rc is None:
            return report(ok=False, error=f"compile did not finish in {timeout_s:g} s (killed)", error_kind="timeout")
        if reply is None:
            return report(ok=False, error=_crash_message(stderr, rc), error_kind="crash")
        if not reply.get("ok"):
            return _failure(reply, report)
        scales = _Scales(steps_scale, tuple(call_scales))
        return _success(chip, reply, profiles if profile else [], scales, report, note)


_Report = Callable[..., CompileReport]


def _failure(reply: Mapping[str, Any], report: _Report) -> CompileReport:
    msg = str(reply.get("error") or "unknown error")
    kind = _STAGE_KIND.get(str(reply.get("stage")), "compile")
    if kind in ("compile", "lowering") and _is_vmem_oom(msg):
        return report(ok=False, error=_trim(msg), error_kind="vmem_oom", vmem_bytes=_oom_bytes(msg))
    return report(ok=False, error=_trim(msg), error_kind=kind)


_HLO_SEQ = re.compile(r"\.(\d+)$")


def kernel_cycles_in_call_order(profile: Sequence[tuple[str, int]], kernels: set[str]) -> list[int] | None:
    """The Pallas kernels' cycles in the order their calls were traced, or None when that order cannot be told.

    JAX names each lowered `pallas_call` after the jitted entry with a sequence number (``matmul_softmax.2``,
    ``matmul_softmax.3``) given as the trace is lowered, so the numbers follow the trace order whatever order the
    scheduler runs them in. A kernel name without a number, names with different stems (numbers count per stem) or
    two with the same number leave it unknown."""
    cycles: dict[str, int] = {}
    for name, c in profile:
        if name in kernels:
            cycles[name] = cycles.get(name, 0) + c
    seqs = {name: _HLO_SEQ.search(name) for name in cycles}
    if any(m is None for m in seqs.values()) or len({n[: m.start()] for n, m in seqs.items() if m}) > 1:
        return None  # numbers are per name: kernels named after different functions have no common order
    order = sorted(cycles, key=lambda n: int(seqs[n].group(1)))  # type: ignore[union-attr]
    if len({int(seqs[n].group(1)) for n in order}) != len(order):  # type: ignore[union-attr]
        return None
    return [cycles[n] for n in order]


@dataclass(frozen=True)
class _Scales:
    steps: float
    calls: tuple[float, ...]


def _scaled_cycles(
    profile: Sequence[tuple[str, int]], kernels: set[str], xla: int, scales: _Scales
) -> tuple[float, str | None]:
    """Cycles of the whole program at the full dims (`xla`: the cycles of its XLA ops, which keep the module's
    ratio), and a note when the per-call scales could not be used."""
    total = sum(c for _, c in profile)
    if not scales.calls or len(set(scales.calls)) == 1:
        return total * scales.steps, None
    ordered = kernel_cycles_in_call_order(profile, kernels)
    if ordered is None or len(ordered) != len(scales.calls):
        found = "unnumbered kernel names" if ordered is None else f"{len(ordered)} kernels"
        why = f"the reduced dims cut the {len(scales.calls)} calls' grids by different ratios, but {found}"
        return total * scales.steps, f"{why} could not be matched to them: every kernel scaled by the module's ratio"
    return sum(c * k for c, k in zip(ordered, scales.calls, strict=True)) + xla * scales.steps, None


def _success(
    chip: Chip,
    reply: Mapping[str, Any],
    profile: list[tuple[str, int]],
    scales: _Scales,
    report: _Report,
    note: str | None,
) -> CompileReport:
    ops: list[Mapping[str, Any]] = list(reply.get("ops") or [])
    kernels = {op["name"] for op in ops if op.get("target") == MOSAIC_TARGET}
    if not profile:  # the flag also copies the estimate into the HLO backend config; use it if files are missing
        profile = [(op["name"], int(op["bundle_cycles"])) for op in ops if op.get("bundle_cycles") is not None]

    per_op = tuple((("pallas:" if name in kernels else "xla:") + name, cycles) for name, cycles in profile)
    kernel_cycles = sum(c for name, c in profile if name in kernels)
    xla_cycles = sum(c for name, c in profile if name not in kernels)
    total = kernel_cycles + xla_cycles if profile else None
    scaled, unmatched = _scaled_cycles(profile, kernels, xla_cycles, scales) if profile else (0.0, None)

    scoped = [op for op in ops if op.get("scoped_vmem") is not None]
    in_kernels = [int(op["scoped_vmem"]) for op in scoped if op["name"] in kernels]
    vmem = max(in_kernels) if in_kernels else max((int(op["scoped_vmem"]) for op in scoped), default=None)

    cost = tuple(sorted((str(k), float(v)) for k, v in (reply.get("cost_analysis") or {}).items()))
    return report(
        ok=True,
        note="; ".join(n for n in (note, unmatched) if n) or None,
        estimated_cycles=total,
        estimated_s=None if total is None else scaled / chip.clock_hz,
        per_op_cycles=per_op,
        vmem_bytes=vmem,
        kernel_cycles=kernel_cycles if profile else None,
        xla_cycles=xla_cycles if profile else None,
        cost_analysis=cost,
        hbm_bytes=None if reply.get("hbm_bytes") is None else int(reply["hbm_bytes"]),
    )


class CompilePool:
    """Warm compile workers (`harness/warm.py`) for `compile_module(pool=...)`: one `WarmPool` per profile setting
    (libtpu reads its flags once per process). Each worker has its own profile folder, emptied before each request
    and read after it. `close()` kills them all."""

    HANDLER = "pallasopt.cost_model._compile_worker:run"

    def __init__(self) -> None:
        from ..harness.warm import WarmPool

        self._pools = {profile: WarmPool(self.HANDLER, _ProfileEnv(profile)) for profile in (True, False)}

    def compile(self, request: Mapping[str, Any], profile: bool, timeout_s: float) -> tuple[Any, str, int | None, Any]:
        """(reply or None, stderr, returncode (None: timed out), the static profile read after the reply)."""
        from ..lifeline import worker_code

        pool = self._pools[profile]
        worker = pool.acquire(timeout_s)
        try:
            dump = Path(_dump_dir(worker.folder))
            for f in dump.glob("*"):
                with contextlib.suppress(OSError):
                    f.unlink()
            reply, stderr, code = worker.call(request, timeout_s)
            rc = None if code is None else worker_code(code)
            profiles = _read_profiles(dump) if profile and reply is not None else []
            return reply, stderr, rc, profiles
        finally:
            pool.release(worker)

    def workers(self) -> list[int]:
        """Process ids of the live workers (their guards)."""
        return [pid for pool in self._pools.values() for pid in pool.pids()]

    def started(self) -> int:
        return sum(pool.started for pool in self._pools.values())

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()


class _ProfileEnv:
    """A warm compile worker's environment: with libtpu's profile dumped into its own folder, or without it."""

    def __init__(self, profile: bool) -> None:
        self.profile = profile

    def __call__(self, folder: Path) -> dict[str, str]:
        return _child_env(_dump_dir(folder) if self.profile else None)


def _dump_dir(folder: Path) -> str:
    dump = folder / "profile"
    dump.mkdir(parents=True, exist_ok=True)
    return str(dump)
