"""gather-widen: a page-table gather fetches k pages per grid step. Before/after sources, every choice re-traced and
checked in interpret mode on a small paged decode with a non-contiguous page table, the ragged paged layout (its
block extent is a product and its scratch is shaped like the block), declines, the size guard, and the model."""

from __future__ import annotations

import pytest
from conftest import ROOT, TEST_KERNELS

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.gather_widen import GatherWidenPass
from pallasopt.search.tiers import model_tier
from pallasopt.workload import load_source

V5E = get_chip("v5e")
BENCH = ROOT / "bench" / "kernels"
PAGED = TEST_KERNELS / "gather" / "paged_decode.py"


@pytest.fixture(scope="module")
def paged() -> KernelIR:
    return KernelIR.from_file(PAGED)


def test_choices_are_the_widths_the_table_axis_divides(paged) -> None:
    # 16 pages per sequence: k = 2, 4, 8 (16 would leave one step: nothing left to pipeline)
    assert [p.spec() for p in GatherWidenPass.choices(paged, V5E)] == [
        f"gather-widen{{call=0,k={k}}}" for k in (2, 4, 8)
    ]


def test_the_rewrite_passes_each_page_k_times_and_scales_the_block_extent(paged) -> None:
    new = GatherWidenPass(k=4).apply(paged)
    (before,), (after,) = paged.calls, new.calls
    assert before.grid == (2, 2, 16) and after.grid == (2, 2, 4)
    assert len(after.inputs) == 1 + 2 * 4 and len(after.scratch) == len(before.scratch) + 2
    src = new.source
    assert "functools.partial(_kernel, page_size=page_size * 4)" in src
    assert "*_gather_widen_specs(kv_spec, 2, 4), *_gather_widen_specs(kv_spec, 2, 4)" in src
    assert ")(lengths, page_indices, q4, *[k_pages] * 4, *[v_pages] * 4)" in src
    assert "_gather_widen_buffer(kv_spec, k_pages, 4, 0)" in src
    # the body itself is untouched
    body = paged.source[paged.source.index("def _kernel") : paged.source.index("def paged_decode")]
    assert body in src
    assert model_tier(new, V5E).time_s < model_tier(paged, V5E).time_s  # 4x fewer steps, same bytes


def test_every_choice_passes_the_oracle(paged) -> None:
    news = [p.apply(paged) for p in GatherWidenPass.choices(paged, V5E)]
    for r, p in zip(check_many([n.source for n in news], str(PAGED)), GatherWidenPass.choices(paged, V5E), strict=True):
        assert r.ok, f"{p.spec()}: {r.message}"


def test_a_wrong_page_order_fails_the_oracle(paged) -> None:
    """The check can fail: copy j placed at slot k-1-j (pages reversed within a step) is caught."""
    new = GatherWidenPass(k=4).apply(paged)
    wrong = new.source.replace("idx[axis] = idx[axis] * k + j", "idx[axis] = idx[axis] * k + (k - 1 - j)")
    assert wrong != new.source
    (r,) = check_many([wrong], str(PAGED))
    assert not r.ok and r.status == "mismatch", r.message


def test_sizes_the_width_does_not_divide_raise_a_clear_error(paged) -> None:
    import jax

    new = GatherWidenPass(k=4).apply(paged)
    w = load_source(new.source, "widened.py")
    args = w.make_inputs(jax.random.key(0), max_len=48)  # 6 pages per sequence
    with pytest.raises(ValueError, match=r"gather-widen\{k=4\}.*6, not a multiple of 4"):
        w.entry(*args)


def test_ragged_paged_layout_scales_a_product_extent_and_its_block_shaped_scratch() -> None:
    ir = KernelIR.from_file(BENCH / "llm_ragged_paged_attention.py")
    new = GatherWidenPass(k=2).apply(ir)
    src = new.source
    assert "functools.partial(_kernel, page_size=page_size * 2, group=Hq // (two_hkv // 2))" in src
    assert "pltpu.VMEM(((page_size * two_hkv) * 2, D), jnp.float32)" in src  # the f32 page copy grows too
    assert new.calls[0].grid[1] * 2 == ir.calls[0].grid[1]
    assert model_tier(new, V5E).time_s < model_tier(ir, V5E).time_s


def test_declines_name_why(paged) -> None:
    manual = KernelIR.from_file(TEST_KERNELS / "paged_attention_manual_dma.py")
    with pytest.raises(PassNotApplicable, match="manual DMA"):
        GatherWidenPass(k=2).apply(manual)
    flash = KernelIR.from_file(BENCH / "llm_flash_attention.py")
    with pytest.raises(PassNotApplicable, match="no scalar-prefetch"):
        GatherWidenPass(k=2).apply(flash)
    assert GatherWidenPass.choices(flash, V5E) == ()
    # the body turns program_id into positions, and the page size is a literal nobody can scale
    fixed = paged.source.replace(
        "functools.partial(_kernel, page_size=page_size)", "functools.partial(_kernel, page_size=8)"
    )
    ir = KernelIR.from_source(fixed, str(PAGED))
    with pytest.raises(PassNotApplicable, match="no kernel parameter is bound to the block extent 'page_size'"):
        GatherWidenPass(k=2).apply(ir)
    with pytest.raises(PassNotApplicable, match="not a multiple of 3"):
        GatherWidenPass(k=3).apply(paged)


def test_aliased_inputs_are_declined(paged) -> None:
    from dataclasses import replace

    from pallasopt.passes.gather_widen import analyse

    aliased = replace(paged.calls[0], input_output_aliases=((2, 0),))
    assert "aliases inputs to outputs" in str(analyse(aliased))
