"""The compiler tier of a module whose wrapper libtpu's static profile cannot schedule (it crashes on a JAXBench
kernel's XLA max-pool, and takes minutes on a big XLA matmul the kernel only adds a norm to): the pallas_calls are
profiled alone and the wrapper's other XLA ops priced by their FLOPs and bytes, and the tier says so."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import ROOT
from test_compiler import needs_libtpu

from pallasopt.cost_model.compiler import PROFILE_CRASHED, CompileReport, compile_module
from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.wrapper import xla_rest
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.search.tiers import Tiers, kernels_alone_reason

FIXTURE = ROOT / "tests" / "fixtures" / "wrapper" / "gemm_then_norm.py"
MATMUL = ROOT / "examples" / "matmul.py"
KERNEL_CYCLES = 150_000


def test_the_wrapper_s_contractions_and_windows_are_priced_elementwise_work_is_not() -> None:
    rest = xla_rest(KernelIR.from_file(FIXTURE))  # M=256, K=512, N=512 bf16, then a (1, 2) max window
    assert sorted(rest.ops) == ["dot_general", "reduce_window_max"]
    assert rest.flops == 2 * 256 * 512 * 512
    dot = (256 * 512 + 512 * 512) * 2 + 256 * 512 * 4  # bf16 operands, f32 result
    window = 256 * 512 * 4 + 256 * 256 * 4
    assert rest.bytes == dot + window
    chip = get_chip("v5e")
    assert rest.seconds(chip) == max(
        rest.flops / chip.device_peak_flops("bfloat16"), rest.bytes / chip.delivered_hbm_bw_bytes_s
    )
    assert xla_rest(KernelIR.from_file(MATMUL)).ops == ()  # only a pallas_call: nothing else to price


class _Fake:
    """An executor whose whole-entry compiles answer `entry` (a crash of the profile, or a timeout) and whose
    kernels-only compiles answer a profile of the kernels; it records which it was asked for."""

    name = "fake"

    def __init__(self, entry: CompileReport) -> None:
        self.entry = entry
        self.asked: list[bool] = []

    def run(self, job: Any) -> CompileReport:
        alone = bool(job.kwargs.get("kernels_only"))
        self.asked.append(alone)
        if not alone:
            return self.entry
        per_op = (("pallas:only.2", KERNEL_CYCLES),)
        return CompileReport(
            ok=True,
            target="v5e",
            estimated_cycles=KERNEL_CYCLES,
            estimated_s=KERNEL_CYCLES / 1.5e9,
            per_op_cycles=per_op,
        )

    def slots(self) -> int:
        return 1

    def unavailable(self, needs: object) -> str | None:
        return None


CRASHED = CompileReport(ok=True, target="v5e", note=f"{PROFILE_CRASHED} (killed by SIGABRT: reduce_window_max.7)")
TIMED_OUT = CompileReport(
    ok=False, target="v5e", error="compile did not finish in 180 s (killed)", error_kind="timeout"
)


@pytest.mark.parametrize(("entry", "why"), [(CRASHED, "profile crashed"), (TIMED_OUT, "ran past 180 s")])
def test_a_wrapper_the_profile_cannot_schedule_gets_its_kernels_profiled_alone(entry: CompileReport, why: str) -> None:
    ir = KernelIR.from_file(FIXTURE)
    fake = _Fake(entry)
    tiers = Tiers(get_chip("v5e"), executor=fake)  # type: ignore[arg-type]
    r = tiers.compiler(ir)
    assert r is not None and r.ok and r.time_s is not None
    assert fake.asked == [False, True]
    assert why in r.data["kernels_alone"]
    assert "pallas_calls' static schedule alone" in r.message and "dot_general, reduce_window_max" in r.message
    rest = xla_rest(ir).seconds(get_chip("v5e").floor_chip)
    assert r.data["xla_rest_s"] == pytest.approx(rest)
    assert r.time_s >= rest + KERNEL_CYCLES / 1.5e9 * 0.5  # the wrapper's floor is added, never dropped
    # the next candidate of the same module goes straight to its kernels
    again = tiers.compiler(ir)
    assert again is not None and again.time_s == pytest.approx(r.time_s)
    assert fake.asked == [False, True, True] and "earlier candidate" in again.data["kernels_alone"]


def test_a_timeout_without_xla_work_in_the_wrapper_stays_a_timeout() -> None:
    ir = KernelIR.from_file(MATMUL)
    assert kernels_alone_reason(ir, TIMED_OUT, 180.0) is None
    fake = _Fake(TIMED_OUT)
    r = Tiers(get_chip("v5e"), executor=fake).compiler(ir)  # type: ignore[arg-type]
    assert r is not None and not r.ok and r.data["error_kind"] == "timeout" and fake.asked == [False]


@needs_libtpu
def test_the_kernels_alone_compile_profiles_no_xla_op_of_the_wrapper() -> None:
    ir = KernelIR.from_file(FIXTURE)
    whole = compile_module(ir.source, ir.path, ir.entry, {}, "v5e", timeout_s=240)
    alone = compile_module(ir.source, ir.path, ir.entry, {}, "v5e", timeout_s=240, kernels_only=True)
    assert whole.ok and alone.ok, (whole.error, alone.error)
    kernels = [n for n, _ in alone.per_op_cycles if n.startswith("pallas:")]
    assert len(kernels) == 1 and alone.kernel_cycles and alone.kernel_cycles > 0
    assert not [n for n, c in alone.per_op_cycles if n.startswith("xla:") and c > 0]
    assert [n for n, c in whole.per_op_cycles if n.startswith("xla:") and c > 0]  # the matmul and window are there
