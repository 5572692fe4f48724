"""How many grid steps the compiler tier profiles: fewer when each step is heavy MXU work (search/tiers.py)."""

from __future__ import annotations

import pytest
from conftest import TEST_KERNELS

from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.registry import parse_pipeline
from pallasopt.search import tiers
from pallasopt.search.tiers import (
    MIN_CALL_STEPS,
    MIN_COMPILE_STEPS,
    compile_dims,
    compile_steps_cap,
    reduce_dims_for_compile,
)

STYLES = TEST_KERNELS / "styles"
BENCH = TEST_KERNELS.parent.parent / "bench" / "kernels"
FUSED_06 = BENCH / "fused_06_matmul_softmax.py"
FUSED_09 = BENCH / "fused_09_matmul_colmax.py"


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


def _reduced_call_steps(ir: KernelIR, dims: dict[str, int]) -> list[int]:
    from pallasopt.ir.trace import trace_calls

    assert ir.workload is not None
    return [c.steps for c in trace_calls(ir.workload, dims)]


def test_no_call_is_cut_below_the_floor_of_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """A matmul of 64 heavy steps (whole-N blocks) then a softmax of 1024 row steps: halving M down to the step cap
    would leave the matmul 2 steps (its one-time 8 MiB weight fetch then scaled x32); it keeps 16."""
    (tile,) = parse_pipeline("tile{call=0,axis1=4096}")
    ir = tile.apply(KernelIR.from_file(FUSED_06))
    assert [c.steps for c in ir.calls] == [64, 1024]
    dims, scale = reduce_dims_for_compile(ir, compile_steps_cap(ir))
    steps = _reduced_call_steps(ir, dims)
    assert steps == [MIN_CALL_STEPS, 256] and scale == 4.0 and dims["M"] == 2048
    # the dims cut both calls by the same ratio here: one scale for the module
    assert compile_dims(ir, compile_steps_cap(ir)).call_scales == ()
    # a call with under FLOOR_MIN_SHARE of the model's time gets no floor: cut to 2 + 32 steps, as without the rule
    light = compile_dims(ir, compile_steps_cap(ir), call_times=[0.05, 1.0])
    assert _reduced_call_steps(ir, light.dims) == [2, 32] and light.scale == 32.0
    heavy = compile_dims(ir, compile_steps_cap(ir), call_times=[0.6, 0.4])
    assert heavy.dims == dims
    monkeypatch.setattr(tiers, "MIN_CALL_STEPS", 1)
    dims, scale = reduce_dims_for_compile(ir, compile_steps_cap(ir))
    assert _reduced_call_steps(ir, dims)[0] < MIN_CALL_STEPS and scale > 4.0


def test_calls_cut_by_different_ratios_get_their_own_scales() -> None:
    """fused_09: a 128-tiled matmul whose grid walks M, N and K, then a column max over (256, 128) blocks whose grid
    walks N and M. Halving K cuts only the matmul's grid, so each call gets its own ratio."""
    ir = KernelIR.from_file(FUSED_09)
    reduced = compile_dims(ir, compile_steps_cap(ir))
    steps = _reduced_call_steps(ir, reduced.dims)
    full = [c.steps for c in ir.calls]
    assert reduced.call_scales == tuple(f / s for f, s in zip(full, steps, strict=True))
    assert len(set(reduced.call_scales)) == 2 and reduced.scale == sum(full) / sum(steps)


def test_the_floor_gives_way_to_a_module_with_too_many_steps() -> None:
    """The baseline (128 x 128 matmul tiles, 8-row softmax blocks: 2048 + 1024 steps) still comes down past the
    floor while it has more than FLOOR_GIVES_WAY_STEPS, then stops at the floor."""
    ir = KernelIR.from_file(FUSED_06)
    dims, scale = reduce_dims_for_compile(ir, compile_steps_cap(ir))
    steps = _reduced_call_steps(ir, dims)
    assert sum(steps) <= tiers.FLOOR_GIVES_WAY_STEPS and min(steps) >= MIN_CALL_STEPS
    assert scale == sum(c.steps for c in ir.calls) / sum(steps)
