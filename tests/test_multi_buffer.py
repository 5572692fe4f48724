"""multi-buffer (and dma-overlap, its depth-2 single-axis form): manual copies served by a k-slot ring. Before/after
source, declines, every choice run by the TPU interpreter's race detector against the reference, a broken ring caught,
and the roofline model seeing both the hidden latency and the VMEM the slots cost."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TEST_KERNELS

from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.roofline import estimate_call, manual_dma_depth
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check, check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.multi_buffer import MultiBufferPass
from pallasopt.passes.registry import parse_pipeline

V5E = get_chip("v5e")
PAGED = TEST_KERNELS / "paged_attention_manual_dma.py"
COPY = TEST_KERNELS / "dma_copy_scale.py"
MOE = TEST_KERNELS / "moe_expert_tiles_manual_dma.py"


def apply(ir: KernelIR, spec: str) -> KernelIR:
    (p,) = parse_pipeline(spec)
    return p.apply(ir)


def added(before: str, after: str) -> list[str]:
    import difflib

    return [line[2:].strip() for line in difflib.ndiff(before.splitlines(), after.splitlines()) if line[:2] == "+ "]


@pytest.fixture(scope="module")
def paged() -> KernelIR:
    return KernelIR.from_file(PAGED)


def test_ring_along_the_page_axis_recomputes_the_future_page(paged: KernelIR) -> None:
    assert paged.calls[0].body.dma_serialized
    new = apply(paged, "multi-buffer{depth=3}")
    got = added(paged.source, new.source)
    assert "def _k_copy_for(p, slot):" in got
    assert "page = pages_ref[b, p]" in got  # the page-table lookup is repeated for the future step
    assert "return pltpu.make_async_copy(k_hbm.at[h, page], k_buf.at[slot], k_sem.at[slot])" in got
    assert "@pl.when(p + 2 < pl.num_programs(2))" in got
    assert "_k_copy_for(p + 2, (p + 2) % 3).start()" in got
    assert "_v_copy_for(p + 2, (p + 2) % 3).start()" in got
    assert "_k_copy_for(1, 1).start()" in got  # the prologue fills two slots
    assert "_k_copy_for(p, _k_copy_slot).wait()" in got
    assert "pltpu.VMEM((3, PAGE, D), jnp.float32)," in got
    assert "pltpu.SemaphoreType.DMA((3,))," in got
    facts = new.calls[0]
    assert not facts.body.dma_serialized and manual_dma_depth(facts) == 3
    assert [s.shape[0] for s in facts.scratch[:4]] == [3, 3, 3, 3]


def test_grid_scope_runs_one_ring_across_rows(paged: KernelIR) -> None:
    new = apply(paged, "multi-buffer{depth=4,scope=grid}")
    got = added(paged.source, new.source)
    assert "_ring_t = (b * pl.num_programs(1) + h) * pl.num_programs(2) + p" in got
    assert "def _k_copy_for(b, h, p, slot):" in got  # the wait passes this step's indices: no division
    assert "def _ring_at(_t):" in got  # a future linear step back into (b, h, p)
    assert "p = _t % pl.num_programs(2)" in got and "h = _t // pl.num_programs(2) % pl.num_programs(1)" in got
    assert "@pl.when(_ring_t == 0)" in got
    assert "_at = _ring_at(_ring_t + 3)" in got
    assert "_v_copy_for(*_at, (_ring_t + 3) % 4).start()" in got
    assert "_k_copy_for(b, h, p, _k_copy_slot).wait()" in got


def test_grid_ring_fetches_the_next_tiles_expert_before_the_tile_ends() -> None:
    moe = KernelIR.from_file(MOE)
    new = apply(moe, "multi-buffer{depth=3,scope=grid}")
    got = added(moe.source, new.source)
    assert "expert = tile_expert_ref[i]" in got  # the expert of the tile k - 1 steps ahead, looked up again
    assert "return pltpu.make_async_copy(w_hbm.at[expert, pl.ds(k * TK, TK)], w_buf.at[slot], sem.at[slot])" in got
    assert "_copy_for(*_at, (_ring_t + 2) % 3).start()" in got
    r = check(new.source, str(MOE), seeds=(5, 6))
    assert r.ok and r.mode == "interpret-tpu-races", r.message


def test_choices_cover_depths_and_scopes(paged: KernelIR) -> None:
    specs = {p.spec() for p in MultiBufferPass.choices(paged, V5E)}
    assert specs == {f"multi-buffer{{call=0,depth={d},scope={s}}}" for d in (2, 3, 4) for s in ("axis", "grid")}
    single_axis = {p.spec() for p in MultiBufferPass.choices(KernelIR.from_file(COPY), V5E)}
    assert single_axis == {f"multi-buffer{{call=0,depth={d},scope=axis}}" for d in (2, 3, 4)}


# Every choice (6 on the paged and MoE kernels, 3 on the copy) x 3 seeds in the TPU interpreter with DMA simulation
# and the race detector: minutes per kernel on 2 shared cores (over pytest's 600 s default when the machine is loaded).
@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("path", [PAGED, COPY, MOE], ids=lambda p: p.stem)
def test_every_choice_passes_the_race_detector_and_the_oracle(path: Path) -> None:
    ir = KernelIR.from_file(path)
    sources = [p.apply(ir).source for p in MultiBufferPass.choices(ir, V5E)]
    assert len(sources) >= 3
    for r in check_many(sources, str(path), timeout_s=2300):
        assert r.ok and r.mode == "interpret-tpu-races", r.message


def test_a_ring_that_refills_the_slot_being_read_is_caught() -> None:
    ir = KernelIR.from_file(COPY)
    good = apply(ir, "multi-buffer{depth=3}").source
    assert "_copy_for(i + 2, (i + 2) % 3).start()" in good
    bad = good.replace("_copy_for(i + 2, (i + 2) % 3).start()", "_copy_for(i + 2, i % 3).start()")
    # The TPU interpreter hangs on it (seen: the check's child idle at ~1% CPU until its deadline, 300 s by default):
    # the check's own deadline ends it. 60 s is ~10x what the good ring's check takes here.
    r = check(bad, str(COPY), seeds=(1, 2), timeout_s=60)
    assert not r.ok, "a copy into the slot this step reads must not pass"


def test_dma_overlap_is_the_depth_two_ring() -> None:
    ir = KernelIR.from_file(COPY)
    assert apply(ir, "dma-overlap{call=0}").source == apply(ir, "multi-buffer{depth=2}").source


def _write(tmp_path: Path, name: str, *edits: tuple[str, str]) -> KernelIR:
    src = COPY.read_text()
    for old, new in edits:
        assert old in src
        src = src.replace(old, new)
    path = tmp_path / name
    path.write_text(src)
    return KernelIR.from_file(path)


def test_declines(example_irs, tmp_path: Path) -> None:
    with pytest.raises(PassNotApplicable, match="no manual DMA"):
        apply(example_irs["softmax"], "multi-buffer{depth=3}")
    racy = KernelIR.from_file(TEST_KERNELS / "dma_race.py")  # compute between its start and its wait
    with pytest.raises(PassNotApplicable, match="started and waited on at once"):
        apply(racy, "multi-buffer{depth=3}")
    with pytest.raises(PassNotApplicable, match="depth must be one of"):
        apply(KernelIR.from_file(COPY), "multi-buffer{depth=7}")
    # The index comes from a scratch ref the kernel writes: k - 1 steps ahead it may hold something else.
    from_scratch = _write(
        tmp_path,
        "from_scratch.py",
        ("def kernel(x_hbm, o_ref, buf, sem):", "def kernel(x_hbm, o_ref, buf, sem, off_ref):"),
        ("pltpu.SemaphoreType.DMA]", "pltpu.SemaphoreType.DMA, pltpu.SMEM((1,), jnp.int32)]"),
        (
            "    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(i * BLOCK, BLOCK)], buf, sem)",
            "    off_ref[0] = i * BLOCK\n    start = off_ref[0] + 0 * i\n"
            "    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(start, BLOCK)], buf, sem)",
        ),
    )
    assert from_scratch.calls[0].body.dma_serialized
    with pytest.raises(PassNotApplicable, match="reads off_ref"):
        apply(from_scratch, "multi-buffer{depth=3}")
    # A parallel ring axis would be split between cores: the chain must run in order.
    parallel = _write(
        tmp_path,
        "parallel.py",
        (
            "        scratch_shapes=[",
            '        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),\n        scratch_shapes=[',
        ),
    )
    with pytest.raises(PassNotApplicable, match="marked parallel"):
        apply(parallel, "multi-buffer{depth=3}")
    assert MultiBufferPass.choices(parallel, V5E) == ()


def test_model_sees_hidden_latency_and_slot_vmem(paged: KernelIR) -> None:
    est = {1: estimate_call(paged.calls[0], V5E)}
    for d in (2, 3, 4):
        est[d] = estimate_call(apply(paged, f"multi-buffer{{depth={d}}}").calls[0], V5E)
    assert [est[d].dma_depth for d in (1, 2, 3, 4)] == [1, 2, 3, 4]
    # 16-token f32 pages (8 KiB): the copies are latency-bound, so each extra slot in flight shortens the estimate.
    assert est[1].time_s > est[2].time_s > est[3].time_s > est[4].time_s
    assert est[3].dma_latency_s == pytest.approx(est[2].dma_latency_s / 2)
    # The bytes moved do not change, only how much of the copies' latency hides.
    assert {e.bytes for e in est.values()} == {est[1].bytes}
    assert est[1].bytes >= 2 * 16 * 128 * 4 * paged.calls[0].steps
    slot = 2 * 16 * 128 * 4  # one K page and one V page in f32
    assert [est[d + 1].vmem_bytes - est[d].vmem_bytes for d in (2, 3)] == [slot, slot]
    assert est[2].vmem_bytes - est[1].vmem_bytes == slot


def test_model_stops_rewarding_depth_once_bandwidth_binds(tmp_path: Path) -> None:
    # 1 MiB blocks: 1.3 us of transfer per copy against 1 us of latency. Two copies in flight already keep HBM busy,
    # so a fourth slot buys nothing and costs another block of VMEM.
    big = _write(tmp_path, "big.py", ("BLOCK = 8", "BLOCK = 512"), ("M=64, N=128", "M=4096, N=512"))
    e3, e4 = (estimate_call(apply(big, f"multi-buffer{{depth={d}}}").calls[0], V5E) for d in (3, 4))
    assert e4.vmem_bytes - e3.vmem_bytes == 512 * 512 * 4
    assert e4.time_s == pytest.approx(e3.time_s) and e3.time_s == pytest.approx(e3.dma_s + e3.edge_s)
