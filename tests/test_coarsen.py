"""coarsen: a grid axis walking one-row blocks runs `by` rows per step (before/after, declines, every choice
checked in interpret mode)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_compiler import needs_libtpu

from pallasopt.cost_model.compiler import compile_module
from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.coarsen import CoarsenPass
from pallasopt.passes.registry import parse_pipeline
from pallasopt.passes.tile import TilePass

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "kernels" / "coarsen" / "row_prefix.py"
CONV_BN = ROOT / "bench" / "kernels" / "fused_22_conv_bn_relu.py"
V5E = get_chip("v5e")


def test_spec_round_trips() -> None:
    (p,) = parse_pipeline("coarsen{call=0,axis=1,by=4}")
    assert p == CoarsenPass(call=0, axis=1, by=4) and p.spec() == "coarsen{call=0,axis=1,by=4}"


def test_rows_per_step_and_the_body_loop() -> None:
    ir = KernelIR.from_file(FIXTURE)
    assert CoarsenPass.choices(ir, V5E) == tuple(CoarsenPass(call=0, axis=0, by=r) for r in (2, 4, 8))
    new = CoarsenPass(call=0, axis=0, by=4).apply(ir)
    (c,) = new.calls
    assert c.grid == (16,) and [o.block_shape for o in c.operands] == [(4, 256), (4, 256), (4, 128)]
    assert c.scratch == ir.calls[0].scratch  # the running sum's scratch is not walked: one row still
    # the rows per step read off a walked block (the last walked ref, an output), not the literal 4
    assert "for r in range(s_ref.shape[0]):" in new.source and "(pl.program_id(0) * s_ref.shape[0] + r)" in new.source
    assert "x_ref[r, :]" in new.source and "acc_ref[0, :]" in new.source and "grid=(M // 4,)" in new.source


@pytest.mark.slow
def test_a_later_tile_of_the_coarsened_block_keeps_the_loop_in_step() -> None:
    """`tile` sees `by` in the grid and specs as a block knob. Seen on the chip (session 31): fused_22's
    `coarsen{by=4},...,tile{axis1=14}` looped over 4 rows of its 14-row block and left the other rows unwritten."""
    ir = KernelIR.from_file(FIXTURE)
    coarse = CoarsenPass(call=0, axis=0, by=4).apply(ir)
    retiled = [p.apply(coarse) for p in TilePass.choices(coarse, V5E)]
    assert {r.calls[0].operands[0].block_shape[0] for r in retiled} == {8, 16, 32, 64}
    checked = check_many([r.source for r in retiled], str(FIXTURE))
    assert all(c.ok for c in checked), [(r.recipe, c.message) for r, c in zip(retiled, checked, strict=True)]


def _edited(edits: dict[str, str]) -> KernelIR:
    text = FIXTURE.read_text()
    for old, new in edits.items():
        assert old in text
        text = text.replace(old, new)
    return KernelIR.from_source(text, str(FIXTURE))


@pytest.mark.parametrize(
    ("edits", "by", "why"),
    [
        ({"jnp.abs(x_ref[0, :])": "jnp.abs(x_ref[...])"}, 2, r"x_ref\[...\] is read"),
        ({"jnp.abs(x_ref[0, :])": "jnp.abs(x_ref[0:1, :])"}, 2, "not at a literal 0"),
        ({"(s_ref.shape[1],)": "(s_ref.shape[0] * 128,)"}, 2, "grows with the rows"),
        ({"jnp.abs(x_ref[0, :])": "jnp.abs(_row(x_ref))"}, 2, "other than indexed at a literal row"),
        ({}, 3, "not a multiple of 3"),
        (
            {
                "    s_ref[0, :] = jnp.full(": "    if s_ref.dtype == jnp.int8:\n        return\n    s_ref[0, :] = jnp.full("
            },
            2,
            "returns",
        ),
        ({"pl.BlockSpec((1, 128), lambda i: (i, 0))": "pl.BlockSpec((1, 128), lambda i: (i // 2, 0))"}, 2, "index"),
    ],
)
def test_declines(edits: dict[str, str], by: int, why: str) -> None:
    if "_row(x_ref)" in edits.get("jnp.abs(x_ref[0, :])", ""):
        edits = {**edits, "def running_mean": "def _row(ref):\n    return ref[0, :]\n\n\ndef running_mean"}
    with pytest.raises(PassNotApplicable, match=why):
        CoarsenPass(call=0, axis=0, by=by).apply(_edited(edits))


def test_a_literal_block_axis_is_not_offered() -> None:
    """fused_22's batchnorm call tiles rows 256 at a time: nothing to coarsen there; its conv's two axes walk
    one-row blocks (the image, the output row)."""
    ir = KernelIR.from_file(CONV_BN)
    got = {(p.call, p.axis) for p in CoarsenPass.choices(ir, V5E) if isinstance(p, CoarsenPass)}
    assert got == {(0, 0), (0, 1)}


@pytest.mark.slow
def test_every_choice_and_conv_then_fuse_match_the_reference() -> None:
    """Every choice on the fixture, and fused_22's conv coarsened by 8 rows then fused with its batchnorm (the
    consumer runs on the finished 8-row block), re-traced and checked in interpret mode."""
    ir = KernelIR.from_file(FIXTURE)
    results = [c.apply(ir) for c in CoarsenPass.choices(ir, V5E)]
    checked = check_many([r.source for r in results], str(FIXTURE))
    assert all(c.ok for c in checked), [(r.recipe, c.message) for r, c in zip(results, checked, strict=True)]
    conv = KernelIR.from_file(CONV_BN)
    both = conv
    for p in parse_pipeline("coarsen{call=0,axis=1,by=8},fuse{producer=0}"):
        both = p.apply(both)
    assert len(both.calls) == 1 and both.calls[0].grid == (32, 7)
    (c,) = check_many([both.source], str(CONV_BN))
    assert c.ok, c.message


SCALAR = ROOT / "tests" / "kernels" / "coarsen" / "row_mean_scalar.py"


def test_a_one_element_store_becomes_a_one_element_block_store() -> None:
    """JAXBench's 44_ConvTranspose2d_..._Mean (gpt53) stores one element per row (`o_ref[0, 0] = s / n`); its
    coarsened kernel still failed to lower ("Cannot store scalars to VMEM"), so the search found nothing for it. The
    loop now stores a (1, 1) block; every choice matches the reference."""
    ir = KernelIR.from_file(SCALAR)
    made = [p.apply(ir) for p in CoarsenPass.choices(ir, V5E)]
    assert [c.calls[0].operands[1].block_shape for c in made] == [(2, 1), (4, 1), (8, 1)]
    assert all(
        "o_ref[pl.ds(r, 1), pl.ds(0, 1)] = jnp.full((1, 1), s / vals.shape[0], o_ref.dtype)" in c.source for c in made
    )
    assert all("vals = x_ref[r, :]" in c.source for c in made)  # a row read stays a read
    checked = check_many([c.source for c in made], str(SCALAR))
    assert all(c.ok for c in checked), [c.message for c in checked]


@needs_libtpu
def test_the_coarsened_one_element_store_lowers_for_tpu() -> None:
    ir = CoarsenPass(call=0, axis=0, by=8).apply(KernelIR.from_file(SCALAR))
    rep = compile_module(ir.source, str(SCALAR), "row_mean", {}, "v5e")
    assert rep.ok, rep.error
