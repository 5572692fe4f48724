"""The deviceless compiler tier: real libtpu compiles of an inline matmul, and its failures as values.

The compile tests need libtpu (the `tpu` extra) and skip without it; each compile is a ~1-3 s subprocess.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from pallasopt.cost_model import compiler
from pallasopt.cost_model._compile_worker import hlo_ops
from pallasopt.cost_model.compiler import CompileReport, compile_module, libtpu_available, parse_static_profile
from pallasopt.cost_model.hardware import UnknownTarget, get_chip

_skip_without_libtpu = pytest.mark.skipif(
    not libtpu_available(), reason="libtpu not installed (pip install 'pallasopt[tpu]')"
)


def needs_libtpu(test: Any) -> Any:
    """Marks a test `tpu_compiler` and skips it without libtpu."""
    return pytest.mark.tpu_compiler(_skip_without_libtpu(test))


MATMUL = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK = {block}
DTYPE = jnp.{dtype}


def _kernel(x_ref, y_ref, o_ref, acc_ref):
    @pl.when(pl.program_id(2) == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def matmul(x, y):
    (m, k), n = x.shape, y.shape[1]
    return pl.pallas_call(
        _kernel,
        grid=(m // BLOCK, n // BLOCK, k // BLOCK),
        in_specs=[pl.BlockSpec((BLOCK, BLOCK), lambda i, j, k: (i, k)),
                  pl.BlockSpec((BLOCK, BLOCK), lambda i, j, k: (k, j))],
        out_specs=pl.BlockSpec((BLOCK, BLOCK), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((BLOCK, BLOCK), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
    )(x, y)


def reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32).astype(x.dtype)


def make_inputs(key, M=512, N=512, K=512):
    kx, ky = jax.random.split(key)
    return jax.random.normal(kx, (M, K), DTYPE), jax.random.normal(ky, (K, N), DTYPE)
"""


def matmul_source(block: int = 128, dtype: str = "float32") -> str:
    return MATMUL.format(block=block, dtype=dtype)


def compile_matmul(
    block: int = 128, dtype: str = "float32", n: int = 512, target: str = "v5e", **kw: Any
) -> CompileReport:
    return compile_module(
        matmul_source(block, dtype), "kernels/mm.py", "matmul", {"M": n, "N": n, "K": n}, target, **kw
    )


# ---- pure parts: no libtpu needed --------------------------------------------------------------------------------

PROFILE = """hlo_op_estimate {
  hlo_op_name: "matmul.1"
  estimated_cycles: 50899
  num_equivalent_hlos: 1
  dma_instruction_type: DMA_INSTRUCTION_TYPE_LOCAL
  scalar_inputs: 0
}
"""


def test_parse_static_profile() -> None:
    assert parse_static_profile(PROFILE) == [("matmul.1", 50899)]
    assert parse_static_profile(PROFILE + PROFILE.replace("matmul.1", "fusion").replace("50899", "7")) == [
        ("matmul.1", 50899),
        ("fusion", 7),
    ]
    assert parse_static_profile("garbage") == []


def test_hlo_ops_reads_kernel_target_scoped_vmem_and_cycles() -> None:
    line = (
        '  ROOT %matmul.1 = f32[512,512]{1,0:T(8,128)} custom-call(%x.1, %y.1), custom_call_target="tpu_custom_call",'
        ' metadata={op_name="jit(matmul)/pallas_call"}, backend_config={"flag_configs":[],"scoped_memory_configs":[],'
        '"used_scoped_memory_configs":[{"memory_space":"1","offset":"0","size":"458752"}],'
        '"bundle_analysis_data":{"estimated_cycles":"50899","flops":"0","scalar_inputs":"0"}}'
    )
    fusion = '  %fusion = f32[8]{0} fusion(%a), kind=kLoop, calls=%fc, backend_config={"flag_configs":[]}'
    assert hlo_ops(f"HloModule m\n{line}\n{fusion}\n  %p = f32[8]{{0}} parameter(0)\n") == [
        {"name": "matmul.1", "opcode": "custom-call", "target": "tpu_custom_call", "scoped_vmem": 458752,
         "bundle_cycles": 50899},
        {"name": "fusion", "opcode": "fusion", "target": "", "scoped_vmem": None, "bundle_cycles": None},
    ]  # fmt: skip


OOM_MESSAGES = [
    (
        "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\nRan out of memory in memory space vmem while allocating"
        ' on stack for %matmul.1 = f32[2048,2048]{1,0:T(8,128)} custom-call(%x.1, %y.1), metadata={op_name="x"}.'
        " Scoped allocation with size 28.00M and limit 16.00M exceeded scoped vmem limit by 12.00M. It should not be"
        " possible to run out of scoped vmem - \nSee https://openxla.org/xla/errors/error_1001 for more details.",
        28 << 20,
    ),
    (
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem. Used 64.00M of"
        " 63.94M vmem. Exceeded vmem capacity by 64.0K.\nProgram vmem requirement 64.00M:\n [type.googleapis.com/"
        "tensorflow.tpu.CompilationResultProto='\\x08\\x08...[truncated]']",
        64 << 20,
    ),
    (
        "RESOURCE_EXHAUSTED: Allocation (size=33554432) would exceed memory (size=16777216) :: #allocation2 [shape ="
        " 'u8[33554432]{0}', space=vmem, size = 0x2000000, scoped] :: copy.2",
        33554432,
    ),
]


@pytest.mark.parametrize(("message", "size"), OOM_MESSAGES)
def test_vmem_oom_messages(message: str, size: int) -> None:
    assert compiler._is_vmem_oom(message)
    assert compiler._oom_bytes(message) == size
    trimmed = compiler._trim(message)
    assert "googleapis" not in trimmed and "openxla.org" not in trimmed and "custom-call(" not in trimmed


def test_trim_keeps_the_e1001_line() -> None:
    trimmed = compiler._trim(OOM_MESSAGES[0][0])
    assert trimmed == (
        "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\nRan out of memory in memory space vmem while allocating"
        " on stack for %matmul.1. Scoped allocation with size 28.00M and limit 16.00M exceeded scoped vmem limit by"
        " 12.00M."
    )


def test_child_env_is_private_to_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--foo=1")
    env = compiler._child_env("/tmp/d")
    assert "ANTHROPIC_API_KEY" not in env
    assert env["LIBTPU_INIT_ARGS"] == "--foo=1 --xla_jf_dump_static_llo_profile_to=/tmp/d"
    assert env["TPU_SKIP_MDS_QUERY"] == "1" and env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
    assert env["JAX_PLATFORMS"] == "cpu"
    assert compiler._child_env(None)["LIBTPU_INIT_ARGS"] == "--foo=1"
    assert os.environ["LIBTPU_INIT_ARGS"] == "--foo=1" and os.environ["ANTHROPIC_API_KEY"] == "sk-test"


def test_without_libtpu_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler, "libtpu_available", lambda: False)
    r = compile_matmul()
    assert not r.ok and r.error_kind == "libtpu_missing"
    assert r.error == "libtpu not installed (pip install 'pallasopt[tpu]')"


def test_targets() -> None:
    r = compile_matmul(target="h100")
    assert not r.ok and r.error_kind == "unsupported"
    with pytest.raises(UnknownTarget):
        compile_matmul(target="v99")


def test_kernels_are_put_in_call_order_by_their_hlo_sequence_numbers() -> None:
    profile = [("f.12", 5), ("copy.3", 7), ("f.3", 11), ("f.12", 1)]
    assert compiler.kernel_cycles_in_call_order(profile, {"f.3", "f.12"}) == [11, 6]  # 3 before 12, repeats summed
    assert compiler.kernel_cycles_in_call_order(profile, {"f.3", "copy.3"}) is None  # stems differ: no common order
    assert compiler.kernel_cycles_in_call_order([("custom", 4)], {"custom"}) is None  # no number


def test_each_kernel_is_scaled_by_its_own_calls_ratio() -> None:
    profile = [("f.2", 100), ("f.3", 10), ("copy.1", 4)]
    kernels = {"f.2", "f.3"}
    by_call = compiler._scaled_cycles(profile, kernels, 4, compiler._Scales(8.0, (16.0, 2.0)))
    assert by_call == (100 * 16 + 10 * 2 + 4 * 8, None)  # XLA ops keep the module's ratio
    assert compiler._scaled_cycles(profile, kernels, 4, compiler._Scales(8.0, ())) == (114 * 8.0, None)
    one_kernel, note = compiler._scaled_cycles(profile, {"f.2"}, 14, compiler._Scales(8.0, (16.0, 2.0)))
    assert one_kernel == 114 * 8.0 and note is not None and "1 kernels could not be matched" in note


# ---- real compiles ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def v5e_matmul() -> CompileReport:
    if not libtpu_available():
        pytest.skip("libtpu not installed (pip install 'pallasopt[tpu]')")
    return compile_matmul(steps_scale=4.0)


@needs_libtpu
def test_matmul_compiles_with_a_cycle_estimate(v5e_matmul: CompileReport) -> None:
    r = v5e_matmul
    assert r.ok, r.error
    assert r.error is None and r.error_kind is None and r.note is None and r.target == "v5e"
    assert r.estimated_cycles is not None and r.estimated_cycles > 10_000  # 64 steps of ~800 cycles (measured)
    assert r.kernel_cycles == r.estimated_cycles and r.xla_cycles == 0
    assert [name for name, _ in r.per_op_cycles] == ["pallas:matmul.1"]
    assert r.steps_scale == 4.0
    assert r.estimated_s == pytest.approx(r.estimated_cycles / get_chip("v5e").clock_hz * 4.0)
    assert r.vmem_bytes == 2 * 3 * 128 * 128 * 4 + 128 * 128 * 4  # double-buffered blocks + accumulator
    assert 0 < r.compile_s < 60


@needs_libtpu
def test_estimate_scales_with_grid_steps(v5e_matmul: CompileReport) -> None:
    small = compile_matmul(n=256)  # 8 steps vs 64
    assert small.ok and small.estimated_cycles and v5e_matmul.estimated_cycles
    assert 6.0 < v5e_matmul.estimated_cycles / small.estimated_cycles < 8.5


@needs_libtpu
def test_bigger_tiles_make_a_compute_bound_matmul_cheaper() -> None:
    small_tiles = compile_matmul(block=128, dtype="bfloat16")
    big_tiles = compile_matmul(block=512, dtype="bfloat16")
    assert small_tiles.ok and big_tiles.ok
    assert small_tiles.estimated_cycles and big_tiles.estimated_cycles
    assert big_tiles.estimated_cycles * 3 < small_tiles.estimated_cycles


@needs_libtpu
def test_reference_is_pure_xla() -> None:
    r = compile_module(matmul_source(), "kernels/mm.py", "reference", {"M": 512, "N": 512, "K": 512}, "v6e")
    assert r.ok, r.error
    assert r.per_op_cycles and all(name.startswith("xla:") for name, _ in r.per_op_cycles)
    assert r.kernel_cycles == 0 and r.estimated_cycles == r.xla_cycles and r.estimated_cycles > 0
    assert dict(r.cost_analysis)["flops"] == 2 * 512**3


@needs_libtpu
def test_trace_sees_the_target_device() -> None:
    # Kernels that ask for the chip at trace time (pltpu.get_tpu_info, emit_pipeline) must see the target's kind.
    source = matmul_source() + (
        "\ndef checked(x, y):\n"
        "    assert pltpu.get_tpu_info().generation == 6, pltpu.get_tpu_info()\n"
        "    return matmul(x, y)\n"
    )
    r = compile_module(source, "kernels/mm.py", "checked", {}, "v6e")
    assert r.ok, r.error
    assert r.estimated_cycles and r.vmem_bytes


@needs_libtpu
def test_vmem_overflow_is_reported_quickly() -> None:
    # (1024, 1024) f32 blocks on a 2x2x2 grid: 2 x 3 x 4 MiB + 4 MiB accumulator = 28 MiB > v5e's 16 MiB default
    # scoped limit; rejected in ~2 s. (With n=1024 the grid has one step, nothing is double-buffered and it fits.)
    r = compile_matmul(block=1024, n=2048)
    assert not r.ok and r.error_kind == "vmem_oom"
    assert r.error is not None and "E1001" in r.error and "size 28.00M and limit 16.00M" in r.error
    assert r.vmem_bytes == 28 << 20
    assert r.compile_s < 30


@needs_libtpu
def test_candidate_faults_are_values() -> None:
    lowering = compile_module(
        matmul_source().replace("preferred_element_type=jnp.float32)", "precision=jax.lax.Precision.HIGH)"),
        "kernels/mm.py",
        "matmul",
        {},
        "v5e",
    )
    assert lowering.error_kind == "lowering" and "Unsupported dot precision" in str(lowering.error)
    broken = compile_module("import jax\ndef f(:\n    pass\n", "kernels/bad.py", "f", {}, "v5e")
    assert broken.error_kind == "import" and str(broken.error).startswith("kernels/bad.py:2: syntax error")
    missing = compile_module(matmul_source(), "kernels/mm.py", "nope", {}, "v5e")
    assert missing.error_kind == "entry" and "'nope'" in str(missing.error)


@needs_libtpu
def test_timeout_kills_the_compile() -> None:
    r = compile_matmul(timeout_s=0.3)
    assert not r.ok and r.error_kind == "timeout" and r.compile_s < 5


# libtpu 0.0.42.1, v5e, `--xla_jf_dump_static_llo_profile_to` on: bench fused_02 tiled (1024, 2048, 2048) with a
# 64 MiB limit (it compiles without the profile; `cost_model/compiler.py: profile_vmem_clash`).
PROFILE_CLASH = (
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem. Used 140.33M of "
    "128.00M vmem. Exceeded vmem capacity by 12.33M.\nProgram vmem requirement 140.33M:\n    scoped           44.33M\n"
    "    HLO temp         96.00M (0.0% utilization: Unpadded (0B) Padded (0B), 100.0% fragmentation (96.00M))\n"
)
KERNEL_OOM = (
    "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Ran out of memory in memory space vmem while allocating "
    "on stack for %matmul_gelu.2. Scoped allocation with size 44.33M and limit 40.00M exceeded scoped vmem limit"
)


def test_profile_vmem_clash_tells_the_profiles_reservation_from_the_kernels_overflow() -> None:
    assert compiler.profile_vmem_clash(PROFILE_CLASH) == (44.33, 96.0)
    assert compiler.profile_vmem_clash(KERNEL_OOM) is None


def test_a_clash_with_the_profile_is_compiled_again_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel fits (no vmem_oom): it comes back compiled, with no cycle estimate and a note saying why; a kernel
    that overflows without the profile too stays a vmem_oom."""
    monkeypatch.setattr(compiler, "libtpu_available", lambda: True)
    calls: list[str | None] = []

    def child(replies: list[dict[str, Any]]) -> Any:
        def run(request: dict[str, Any], env: dict[str, str], timeout_s: float) -> tuple[Any, str, int | None]:
            calls.append(env.get("LIBTPU_INIT_ARGS"))
            return replies[len(calls) - 1], "", 0

        return run

    clash = {"ok": False, "stage": "compile", "error": PROFILE_CLASH}
    monkeypatch.setattr(compiler, "_run_child", child([clash, {"ok": True, "ops": [], "cost_analysis": {}}]))
    r = compile_matmul()
    assert r.ok and r.estimated_s is None
    assert r.note is not None and "96 MiB of the program's temporaries" in r.note and "44.33 MiB" in r.note
    assert compiler.PROFILE_FLAG in (calls[0] or "") and compiler.PROFILE_FLAG not in (calls[1] or "")
    calls.clear()
    real = {"ok": False, "stage": "compile", "error": KERNEL_OOM}
    monkeypatch.setattr(compiler, "_run_child", child([clash, real]))
    r = compile_matmul()
    assert not r.ok and r.error_kind == "vmem_oom" and len(calls) == 2


TWO_CALLS = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _double(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def _rowsum(h_ref, o_ref):
    o_ref[...] = jnp.sum(h_ref[...], axis=1, keepdims=True)


def two_calls(x):
    m, n = x.shape
    h = pl.pallas_call(
        _double,
        grid=(m // 8, n // 128),
        in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
    )(x)
    return pl.pallas_call(
        _rowsum,
        grid=(m // 8,),
        in_specs=[pl.BlockSpec((8, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((m, 1), x.dtype),
    )(h)


def reference(x):
    return jnp.sum(x * 2.0, axis=1, keepdims=True)


def make_inputs(key, M=64, N=512):
    return (jax.random.normal(key, (M, N), jnp.float32),)
"""


@needs_libtpu
def test_two_calls_are_scaled_by_their_own_ratios() -> None:
    """The first call's grid walks N, the second's does not: the kernels' cycles (in call order) scale apart."""
    r = compile_module(TWO_CALLS, "kernels/two.py", "two_calls", {}, "v5e", steps_scale=3.0, call_scales=(4.0, 1.0))
    assert r.ok, r.error
    kernels = {name.removeprefix("pallas:") for name, _ in r.per_op_cycles if name.startswith("pallas:")}
    ordered = compiler.kernel_cycles_in_call_order([(n.split(":", 1)[1], c) for n, c in r.per_op_cycles], kernels)
    assert ordered is not None and len(ordered) == 2 and r.note is None and r.call_scales == (4.0, 1.0)
    xla = r.xla_cycles or 0
    clock = get_chip("v5e").clock_hz
    # the order is the calls': the first call's 8 x 4 steps cost more than the second's 8
    first, second = ordered
    assert first > second
    assert r.estimated_s == pytest.approx((first * 4.0 + second * 1.0 + xla * 3.0) / clock)
