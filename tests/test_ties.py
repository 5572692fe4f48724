"""The model's tie band: candidates the roofline model times within MODEL_TIE_BAND of its best alternate with the
fewest-step ones among them (cost_model/ties.py), in the tile pass's choice order and the funnel's compile order."""

from __future__ import annotations

from conftest import ROOT

from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.ties import MODEL_TIE_BAND, grid_steps, tie_order
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.registry import parse_pipeline
from pallasopt.passes.tile import TilePass
from pallasopt.search.beam import BEAM_CHOICES

V5E = get_chip("v5e")


def _order(items: list[tuple[float, tuple[int, int], str]]) -> list[str]:
    return [name for _, _, name in tie_order(items, lambda x: x[0], lambda x: x[1])]


def test_ties_alternate_model_order_with_fewest_steps() -> None:
    items = [
        (1.000, (64, 4), "a"),
        (1.001, (64, 4), "b"),
        (1.002, (64, 8), "c"),
        (1.010, (32, 1), "d"),  # in the band, fewest steps: second
        (1.020, (32, 2), "e"),  # in the band, next fewest: fourth
        (1.200, (1, 1), "f"),  # outside the band: stays after every tie, however few its steps
        (1.300, (2, 1), "g"),
    ]
    assert _order(items) == ["a", "d", "b", "e", "c", "f", "g"]


def test_equal_steps_break_on_the_carried_axis_then_model_order() -> None:
    items = [(1.0, (32, 4), "a"), (1.001, (32, 2), "b"), (1.002, (32, 1), "c"), (1.003, (32, 1), "d")]
    assert _order(items) == ["a", "c", "b", "d"]


def test_no_ties_keeps_the_model_order() -> None:
    step = 1.0 + 2 * MODEL_TIE_BAND
    items = [(step**i, (100 - i, 1), str(i)) for i in range(6)]
    assert _order(items) == [str(i) for i in range(6)]
    assert _order(items[:2]) == ["0", "1"]


def test_grid_steps_counts_the_accumulator_axis() -> None:
    ir = KernelIR.from_file(str(ROOT / "examples" / "matmul.py"))
    (call,) = ir.calls
    assert call.body.conditional_axes, "the example matmul zeroes its accumulator under pl.when(k == 0)"
    steps, carried = grid_steps(ir.calls)
    assert steps == call.steps
    assert carried == call.grid[call.body.conditional_axes[0]]


def test_the_whole_k_tile_reaches_the_beam() -> None:
    """fused_13 from its 1024x1024x256 state: the whole-K block (one step per output block) is 1.0% above the model's
    best and was its 14th choice, cut by the beam's 12; on the v5e chip it ran 1.643 ms against 1.724 for the model's
    first (bench/results/hw-v5e-2026-12-06d)."""
    ir = KernelIR.from_file(str(ROOT / "bench" / "kernels" / "fused_13_matmul_mish.py"))
    for p in parse_pipeline("tile{call=0,BLOCK0=1024,BLOCK1=1024,BLOCK2=256}"):
        ir = p.rewrite(ir)
    specs = [c.spec() for c in TilePass.choices(ir, V5E)][: BEAM_CHOICES["tile"]]
    assert "tile{call=0,BLOCK2=4096,vmem_mib=96}" in specs[:2], specs
