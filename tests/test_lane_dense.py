"""lane-dense: elementwise kernels with a narrow minor dim re-blocked as (rows, 128) in the wrapper."""

from __future__ import annotations

from pathlib import Path

import pytest

from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.wrapper import wrapper_cost
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.accumulate import AccumulateInScratchPass
from pallasopt.passes.lane_dense import LaneDensePass
from pallasopt.passes.lane_dense_stats import LaneDenseStatsPass
from pallasopt.search.tiers import model_tier

KERNELS = Path(__file__).parent / "kernels" / "lane_dense"
GELU = KERNELS / "gelu64.py"
V5E = get_chip("v5e")


@pytest.fixture(scope="module")
def ir() -> KernelIR:
    return KernelIR.from_file(GELU)


def test_reblocks_a_64_wide_elementwise_kernel(ir: KernelIR) -> None:
    # (256, 64) f32 blocks hold 128 lane-dense rows; 2x and 4x that divide the 512 rows of the (1024, 64) arrays.
    assert LaneDensePass.choices(ir, V5E) == tuple(LaneDensePass(call=0, rows=r) for r in (128, 256, 512))
    new = LaneDensePass(call=0).apply(ir)
    call = new.calls[0]
    assert call.grid == (4,)
    assert {(o.shape, o.block_shape) for o in call.operands} == {((512, 128), (128, 128))}
    src = new.source
    assert "grid=(pl.cdiv(x.size // 128, 128),)," in src
    assert "in_specs=[pl.BlockSpec((128, 128), lambda i: (i, 0)), pl.BlockSpec((128, 128), lambda i: (i, 0))]," in src
    assert "out_specs=pl.BlockSpec((128, 128), lambda i: (i, 0))," in src
    assert "out_shape=jax.ShapeDtypeStruct((x.size // 128, 128), x.dtype)," in src
    assert ")(x.reshape(-1, 128), r.reshape(-1, 128)).reshape(x.shape)" in src
    assert (
        src.split("def _kernel")[1].split("def gelu_residual")[0]
        == ir.source.split("def _kernel")[1].split("def gelu_residual")[0]
    )  # the body is unchanged
    assert LaneDensePass(call=0, rows=512).apply(ir).calls[0].grid == (1,)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("g * jnp.sum(r_ref[...], axis=-1, keepdims=True)", "`reduce_sum` makes a \\(256,\\) value"),
        ("g + jax.lax.broadcasted_iota(jnp.int32, g.shape, 1)", "the body uses `iota`"),
        ("(g + r_ref[...]).T.T", "`transpose` makes a \\(64, 256\\) value"),
        ("g + r_ref[...] * pl.program_id(0)", "the body uses `program_id`"),
    ],
)
def test_declines_bodies_that_are_not_elementwise(body: str, why: str) -> None:
    ir = KernelIR.from_source(GELU.read_text().replace("g + r_ref[...]", body), str(GELU))
    assert LaneDensePass.choices(ir, V5E) == ()
    with pytest.raises(PassNotApplicable, match=f"not elementwise: {why}"):
        LaneDensePass(call=0).apply(ir)


def test_declines_a_broadcast_operand_and_a_lane_dense_call() -> None:
    bias = (
        GELU.read_text()
        .replace("pl.BlockSpec((BM, D), lambda i: (i, 0))]", "pl.BlockSpec((1, D), lambda i: (0, 0))]")
        .replace("(x, r)\n", "(x, r[:1])\n")
    )
    with pytest.raises(PassNotApplicable, match="same shape and block shape"):
        LaneDensePass(call=0).apply(KernelIR.from_source(bias, str(GELU)))
    wide = GELU.read_text().replace("D=64", "D=256")
    with pytest.raises(PassNotApplicable, match="already a multiple of 128"):
        LaneDensePass(call=0).apply(KernelIR.from_source(wide, str(GELU)))


def test_declines_rows_off_the_sublane_tile(ir: KernelIR) -> None:
    with pytest.raises(PassNotApplicable, match="sublane tile"):
        LaneDensePass(call=0, rows=12).apply(ir)


def test_the_model_charges_the_wrapper_relayouts(ir: KernelIR) -> None:
    new = LaneDensePass(call=0).apply(ir)
    assert wrapper_cost(ir).bytes == 0
    cost = wrapper_cost(new)
    # On TPU a reshape that moves the minor dim is a relayout: each of x, r and the result is read and written once.
    assert sorted(cost.ops) == ["reshape"] * 3 and cost.bytes == 3 * 2 * 1024 * 64 * 4
    before, after = model_tier(ir, V5E), model_tier(new, V5E)
    assert after.data["wrapper_s"] == pytest.approx(cost.bytes / V5E.delivered_hbm_bw_bytes_s)
    # The body's vector work no longer pays for 64 idle lanes of each vreg: half the VPU and EUP time.
    vpu = [c["vpu_s"] + c["eup_s"] for c in (before.data["calls"][0], after.data["calls"][0])]
    assert vpu[1] == pytest.approx(vpu[0] / 2)


def test_every_choice_matches_the_reference(ir: KernelIR) -> None:
    sources = [c.apply(ir).source for c in LaneDensePass.choices(ir, V5E)]
    results = check_many(sources, str(GELU), seeds=(0,))
    assert sources and all(r.ok for r in results), [r.message for r in results]


STATS = KERNELS / "sumsq_rows.py"


def test_stats_output_stored_lane_major() -> None:
    ir = KernelIR.from_file(STATS)
    assert LaneDenseStatsPass.choices(ir, V5E) == (LaneDenseStatsPass(call=0, output=0),)
    assert LaneDensePass.choices(ir, V5E) == ()  # a reduction, and the operands differ
    new = LaneDenseStatsPass(call=0, output=0).apply(ir)
    out = new.calls[0].outputs[0]
    assert (out.shape, out.block_shape, out.index_map.depends_on) == ((1, 1024), (1, 256), ((), (0,)))
    src = new.source
    assert "o_ref[...] = jnp.zeros_like(o_ref)\n" in src  # already the block's shape
    assert "o_ref[...] += jnp.sum(x * x, axis=-1, keepdims=True).reshape(o_ref.shape)" in src
    assert "out_specs=pl.BlockSpec((1, BM), lambda i, k: (0, i))," in src
    assert "out_shape=jax.ShapeDtypeStruct((1, M), jnp.float32)," in src
    assert ")(x).reshape(-1, 1)" in src
    cost = wrapper_cost(new)  # the (1, M) -> (M, 1) relayout: read and write M floats
    assert cost.ops == ("reshape",) and cost.bytes == 2 * 1024 * 4
    checked = check_many([src], str(STATS), seeds=(0,))
    assert checked[0].ok, checked[0].message


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("jnp.zeros_like(o_ref)", "jnp.zeros(o_ref.shape, jnp.float32)", "o_ref is used as `o_ref.shape`"),
        ("BM, BK = 256, 256", "BM, BK = 64, 256", "64-row block is not a multiple of 128"),
    ],
)
def test_stats_declines(old: str, new: str, why: str) -> None:
    source = STATS.read_text().replace(old, new)
    ir = KernelIR.from_source(source, str(STATS))
    assert LaneDenseStatsPass.choices(ir, V5E) == ()
    with pytest.raises(PassNotApplicable, match=why):
        LaneDenseStatsPass(call=0, output=0).apply(ir)


def test_stats_declines_a_wide_output(ir: KernelIR) -> None:
    with pytest.raises(PassNotApplicable, match="not a blocked \\(M, 1\\) array"):
        LaneDenseStatsPass(call=0, output=0).apply(ir)


def test_the_model_sees_both_sides_of_the_trade(ir: KernelIR) -> None:
    """The re-blocked body's vector work falls by the lane padding (4x for 32 lanes), while the wrapper pays a
    relayout per operand; on these standalone kernels the relayouts cost more (the pass pays only where the vector
    work saved exceeds them)."""
    act = KernelIR.from_file(KERNELS / "act32.py")
    same = LaneDensePass(call=0).apply(act)  # the same elements per block: 512 x 32 -> 128 x 128
    before, after = model_tier(act, V5E), model_tier(same, V5E)
    vector = [c["vpu_s"] + c["eup_s"] for c in (before.data["calls"][0], after.data["calls"][0])]
    assert vector[1] == pytest.approx(vector[0] / 4)
    saved = vector[0] - vector[1]
    assert after.data["wrapper_s"] == pytest.approx(4 * 65536 * 32 * 4 / V5E.delivered_hbm_bw_bytes_s)
    assert (after.time_s < before.time_s) == (saved > after.data["wrapper_s"])
    gelu = [model_tier(x, V5E).time_s for x in (ir, LaneDensePass(call=0).apply(ir))]
    assert gelu[1] > gelu[0]


def test_stats_after_accumulate_in_scratch_stores_once() -> None:
    """With the sum kept in a (BM, 1) scratch, the lane-major store (and its relayout) happens once per row block."""
    acc = AccumulateInScratchPass(call=0, output=0).apply(KernelIR.from_file(STATS))
    assert LaneDenseStatsPass.choices(acc, V5E) == (LaneDenseStatsPass(call=0, output=0),)
    new = LaneDenseStatsPass(call=0, output=0).apply(acc)
    assert new.source.count(".reshape(o_ref.shape)") == 1
    assert new.calls[0].outputs[0].block_shape == (1, 256) and new.calls[0].scratch[0].shape == (256, 1)
    checked = check_many([new.source], str(STATS), seeds=(0,))
    assert checked[0].ok, checked[0].message
