"""How many grid steps the compiler tier profiles: fewer when each step is heavy MXU work (search/tiers.py)."""

from __future__ import annotations

from conftest import TEST_KERNELS

from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.registry import parse_pipeline
from pallasopt.search.tiers import MIN_COMPILE_STEPS, compile_steps_cap, reduce_dims_for_compile

STYLES = TEST_KERNELS / "styles"


def test_heavy_steps_are_profiled_at_fewer_steps_never_below_the_floor() -> None:
    ir = KernelIR.from_file(STYLES / "padded_matmul.py")  # 128 x 384 @ 384 x 128 per step: 3 units of 128^3
    assert compile_steps_cap(ir) == 256 // 3  # over the floor of 64
    (wide,) = parse_pipeline("tile{call=0,BM=1024,BN=1024}")
    heavy = wide.apply(ir)  # 1024 x 384 @ 384 x 1024 per step: 192 units
    assert compile_steps_cap(heavy) == MIN_COMPILE_STEPS
    # the cap is what reduce_dims_for_compile gets: 72 steps already fit under 85, not under 20
    assert reduce_dims_for_compile(ir, compile_steps_cap(ir)) == (ir.dims, 1.0)
    dims, scale = reduce_dims_for_compile(ir, 20)
    assert sum(c.steps for c in ir.calls) / scale <= 20 and dims["M"] < 1000
    # a kernel without dots keeps the plain step limit
    assert compile_steps_cap(KernelIR.from_file(STYLES / "ragged_rowsum.py")) == 256
    assert compile_steps_cap(ir, max_steps=40) == 40
