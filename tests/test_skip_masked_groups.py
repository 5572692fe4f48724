"""skip-masked-groups: a loop step over groups (segments, experts) whose row mask masks every row of the block is
skipped. Before/after sources, declines, the search's view (chip-only) and the rewritten kernels checked in interpret
mode on random group sizes (a guard made wrong by hand fails that check)."""

from __future__ import annotations

import pytest
from conftest import ROOT, TEST_KERNELS

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.optimize import select_passes
from pallasopt.passes.skip_masked_groups import SkipMaskedGroupsPass

RAGGED = ROOT / "bench" / "kernels" / "llm_ragged_dot.py"
SEGMENTS = TEST_KERNELS / "loops" / "segment_scale.py"
GUARD = "@pl.when((start < _first_row + acc_ref.shape[0]) & (_first_row < end))"


def test_ragged_dot_guards_each_group_s_dot_and_a_wrong_guard_fails_the_oracle() -> None:
    ir = KernelIR.from_file(RAGGED)
    (choice,) = SkipMaskedGroupsPass.choices(ir, get_chip("v5e"))
    new = choice.apply(ir)
    src = new.source
    assert GUARD in src and "_first_row = pl.program_id(0) * tm" in src
    body = src[src.index(GUARD) :].splitlines()
    # the dot moved under the guard with the masked update; `end` (returned) stayed before it
    assert "part = jnp.dot(x, w_ref[g]" in body[2] and "acc_ref[...] += jnp.where" in body[3]
    assert src.index("end = start + sizes_ref[g]") < src.index(GUARD)
    # a guard that skips the group starting inside the tile must fail the same check
    wrong = src.replace("(start < _first_row + acc_ref.shape[0])", "(start < _first_row)")
    assert wrong != src
    good, bad = check_many([src, wrong], str(RAGGED))
    assert good.ok, good.message
    assert not bad.ok


def test_another_style_logical_and_and_a_flipped_comparison() -> None:
    ir = KernelIR.from_file(SEGMENTS)
    new = SkipMaskedGroupsPass().apply(ir)
    # `start <= rows` is `rows >= start`: some row of [first, first + BLOCK) is >= start iff start < first + BLOCK
    assert "@pl.when((start < _first_row + BLOCK) & (_first_row < end))" in new.source
    assert "_first_row = pl.program_id(0) * BLOCK" in new.source
    (r,) = check_many([new.source], str(SEGMENTS))
    assert r.ok, r.message


def _edited(old: str, new: str) -> KernelIR:
    src = SEGMENTS.read_text()
    assert old in src
    return KernelIR.from_source(src.replace(old, new), str(SEGMENTS))


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("rows < end), scaled, 0.0)", "rows < end), scaled, 1.0)", "is not 0"),
        ("jnp.logical_and(start <= rows, rows < end)", "g == 0", "no comparison of the mask reads a row index"),
        (
            "+ pl.program_id(0) * BLOCK",
            "+ jax.lax.broadcasted_iota(jnp.int32, (BLOCK, x_ref.shape[1]), 1)",
            "no comparison of the mask reads a row index",  # the base is an array, not one scalar per block
        ),
    ],
)
def test_declines(old: str, new: str, why: str) -> None:
    with pytest.raises(PassNotApplicable, match=why):
        SkipMaskedGroupsPass().apply(_edited(old, new))


def test_the_search_offers_it_only_where_a_chip_times_candidates() -> None:
    assert SkipMaskedGroupsPass.search_needs_hardware
    assert SkipMaskedGroupsPass not in select_passes(())
    assert SkipMaskedGroupsPass in select_passes((), hardware=True)
    assert SkipMaskedGroupsPass in select_passes(("skip-masked-groups",))
