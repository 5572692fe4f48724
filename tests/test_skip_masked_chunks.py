"""skip-masked-chunks: an in-kernel fori_loop over key chunks narrowed to the chunks its iota mask leaves unmasked.
Before/after sources, declines, the cost model's view (loops simulated per sampled grid step) and the rewritten
kernels checked numerically in interpret mode (a bound made wrong by hand fails that check)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT, TEST_KERNELS

from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.roofline import estimate_call
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.ir.loops import grid_samples
from pallasopt.passes.skip_masked_chunks import SkipMaskedChunksPass

WINDOW_LOOP = TEST_KERNELS / "loops" / "window_loop_attention.py"
GQA = ROOT / "bench" / "kernels" / "llm_gqa_attention.py"


def _changed(before: str, after: str) -> list[str]:
    return [b for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]


def test_gqa_mask_in_a_helper_bounds_the_loop_at_the_diagonal() -> None:
    ir = KernelIR.from_file(GQA)
    (choice,) = SkipMaskedChunksPass.choices(ir, get_chip("v5e"))
    new = choice.apply(ir)
    (line,) = _changed(ir.source, new.source)
    # the mask is read through `_online_step(..., qi * block_q, j * block_k)`; the bound is in the kernel's names
    assert "fori_loop(0, jnp.minimum(S // block_k, (qi * block_q + block_q - 1) // block_k + 1), body, init)" in line


def test_window_gets_both_bounds_and_passes_the_oracle() -> None:
    ir = KernelIR.from_file(WINDOW_LOOP)
    new = SkipMaskedChunksPass().apply(ir)
    (line,) = _changed(ir.source, new.source)
    assert "jnp.maximum(0, " in line and "jnp.minimum(seq // CHUNK, (qi * BLOCK_Q + BLOCK_Q - 1) // CHUNK + 1)" in line
    # a wrong upper bound (the diagonal chunk dropped) must fail the same check
    wrong = new.source.replace("// CHUNK + 1)", "// CHUNK)")
    assert wrong != new.source
    good, bad = check_many([new.source, wrong], str(WINDOW_LOOP))
    assert good.ok, good.message
    assert not bad.ok


def test_cost_model_sees_the_skipped_chunks() -> None:
    ir = KernelIR.from_file(WINDOW_LOOP)
    new = SkipMaskedChunksPass().apply(ir)
    chip = get_chip("v5e")
    before, after = ir.calls[0], new.calls[0]
    flops = [c.body.mxu_flops for c in (before, after)]
    # S=256 at the default dims, 4 query blocks of 64 rows, 4 chunks of 64: a window of 96 needs 2 or 3 chunks per
    # query block (1, 2, 3, 3 by hand: the loop runs 2.25 chunks on average, not 4)
    assert flops[1] == pytest.approx(flops[0] * 2.25 / 4, rel=0.01)
    assert "averaged over" in after.body.loop_note
    assert estimate_call(after, chip).time_s < estimate_call(before, chip).time_s


def test_grid_samples_cover_every_axis_end_to_end() -> None:
    samples = grid_samples((2, 32, 64))
    assert len(samples) == 8
    assert [int(s[2]) for s in samples] == [0, 9, 18, 27, 36, 45, 54, 63]
    assert {int(s[0]) for s in samples} == {0, 1}
    small = grid_samples((2, 3))
    assert sorted((int(a), int(b)) for a, b in small) == [(i, j) for i in range(2) for j in range(3)]
    assert all(isinstance(x, np.ndarray) for s in small for x in s)


@pytest.mark.parametrize(
    "edit, reason",
    [
        ("s = jnp.where((cols <= rows) & (rows - cols < window), s, NEG)", "no jnp.where"),
        ("s = jnp.where((cols <= rows) & (rows - cols < window), s, 1.0)", "is not 0 or a large negative value"),
        ("s = jnp.where((cols <= rows) | (rows - cols < window), s, NEG)", "has an `|`"),
    ],
)
def test_declines(edit: str, reason: str, tmp_path) -> None:
    src = WINDOW_LOOP.read_text()
    line = "s = jnp.where((cols <= rows) & (rows - cols < window), s, NEG)"
    if reason == "no jnp.where":
        edit = "s = jnp.where(s > 0, s, NEG)"
    path = tmp_path / "k.py"
    path.write_text(src.replace(line, edit))
    with pytest.raises(PassNotApplicable, match=reason.replace("|", r"\|")):
        SkipMaskedChunksPass().apply(KernelIR.from_file(path))


def test_no_choice_without_a_loop(example_irs) -> None:
    for ir in example_irs.values():
        assert SkipMaskedChunksPass.choices(ir, get_chip("v5e")) == ()


@pytest.mark.parametrize("loop", [-1, 1, 7])
def test_a_loop_number_out_of_range_declines(loop: int) -> None:
    # -1 once indexed from the end (an IndexError on a kernel with no loop): found by the property test in CI
    ir = KernelIR.from_file(WINDOW_LOOP)
    with pytest.raises(PassNotApplicable, match=f"no loop #{loop}: the kernel has 1 fori_loop"):
        SkipMaskedChunksPass(loop=loop).apply(ir)


class _StaticEstimate:
    """An executor whose every compile answers one static estimate (no libtpu)."""

    name = "fake"

    def run(self, job):
        from pallasopt.cost_model.compiler import CompileReport

        return CompileReport(ok=True, target="v5e", estimated_cycles=15_000, estimated_s=1e-5)

    def slots(self) -> int:
        return 1

    def unavailable(self, needs) -> str | None:
        return None


def test_compiler_tier_gives_no_time_for_a_loop_it_counts_once() -> None:
    from pallasopt.search.tiers import UNCOUNTED_LOOP, Tiers

    ir = KernelIR.from_file(WINDOW_LOOP)
    tiers = Tiers(get_chip("v5e"), executor=_StaticEstimate())  # type: ignore[arg-type]
    before = tiers.compiler(ir)
    after = tiers.compiler(SkipMaskedChunksPass().apply(ir))
    assert before is not None and before.ok and before.time_s is not None  # a static trip count is counted
    assert after is not None and after.ok and after.time_s is None and UNCOUNTED_LOOP in after.message
