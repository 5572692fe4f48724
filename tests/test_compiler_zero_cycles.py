"""A Pallas kernel the static profile gives 0 cycles has no compiler-tier time (it is not a free kernel joined with its
HBM floor): fused_33's `coarsen` by 2 got 0 cycles from libtpu, ranked at its floor (1.660 ms [C]) and ran 1.6x
slower than its tiles on a v5e (bench/results/hw-v5e-2026-12-06d)."""

from __future__ import annotations

import pytest
from conftest import ROOT

from pallasopt.cost_model.compiler import CompileReport
from pallasopt.cost_model.hardware import get_chip
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.search.tiers import ZERO_CYCLES, Tiers, zero_cycle_kernels


class _Profile:
    """An executor whose every compile answers one static profile (no libtpu)."""

    name = "fake"

    def __init__(self, per_op: tuple[tuple[str, int], ...]) -> None:
        self.per_op = per_op

    def run(self, job: object) -> CompileReport:
        cycles = sum(c for _, c in self.per_op)
        return CompileReport(
            ok=True, target="v5e", estimated_cycles=cycles, estimated_s=cycles / 1.5e9, per_op_cycles=self.per_op
        )

    def slots(self) -> int:
        return 1

    def unavailable(self, needs: object) -> str | None:
        return None


def _compiler(per_op: tuple[tuple[str, int], ...]):
    ir = KernelIR.from_file(str(ROOT / "examples" / "matmul.py"))
    return Tiers(get_chip("v5e"), executor=_Profile(per_op)).compiler(ir)  # type: ignore[arg-type]


def test_zero_cycles_give_no_time() -> None:
    r = _compiler((("pallas:matmul.1", 0), ("xla:copy.2", 500)))
    assert r is not None and r.ok and r.time_s is None
    assert ZERO_CYCLES in r.message and "pallas:matmul.1" in r.message


def test_counted_cycles_give_a_time() -> None:
    r = _compiler((("pallas:matmul.1", 286_613),))
    assert r is not None and r.ok and r.time_s is not None and r.time_s > 0


@pytest.mark.parametrize(
    ("per_op", "zero"),
    [
        ((("pallas:a.1", 0), ("pallas:a.2", 10)), ["pallas:a.1"]),
        ((("xla:fusion.3", 0), ("pallas:a.2", 10)), []),  # an XLA op the profile gives 0 is not a kernel's non-answer
        ((), []),
    ],
)
def test_zero_cycle_kernels(per_op: tuple[tuple[str, int], ...], zero: list[str]) -> None:
    assert zero_cycle_kernels(per_op) == zero
