"""fold-last-step: a reduction's last update added inside its finalize (before/after, declines, every choice on
every kernel it applies to checked in interpret mode)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.fold_last_step import FoldLastStepPass
from pallasopt.passes.registry import parse_pipeline

ROOT = Path(__file__).resolve().parent.parent
MOMENTS = ROOT / "tests" / "kernels" / "fold" / "row_moments.py"
BENCH = ROOT / "bench" / "kernels"
MISH = BENCH / "fused_13_matmul_mish.py"
V5E = get_chip("v5e")


def _run(path: Path, recipe: str) -> KernelIR:
    ir = KernelIR.from_file(path)
    for p in parse_pipeline(recipe):
        ir = p.apply(ir)
    return ir


def _edited(path: Path, edits: dict[str, str]) -> KernelIR:
    text = path.read_text()
    for old, new in edits.items():
        assert old in text, old
        text = text.replace(old, new)
    return KernelIR.from_source(text, str(path))


def test_spec_round_trips() -> None:
    (p,) = parse_pipeline("fold-last-step{call=0}")
    assert p == FoldLastStepPass(call=0) and p.spec() == "fold-last-step{call=0}"


def test_the_last_update_moves_into_the_finalize() -> None:
    ir = KernelIR.from_file(MISH)
    assert FoldLastStepPass.choices(ir, V5E) == (FoldLastStepPass(call=0),)
    new = FoldLastStepPass().apply(ir)
    dot = "jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)"
    assert (
        f"    @pl.when(k != pl.num_programs(2) - 1)\n    def _accumulate():\n        o_ref[...] += {dot}" in new.source
    )
    assert f"        total = o_ref[...] + {dot}\n        o_ref[...] = _mish(total)" in new.source
    assert new.calls[0].grid == ir.calls[0].grid and new.source.count(dot) == 2


def test_a_scratch_the_finalize_only_reads() -> None:
    """The fixture's sum of squares: a scratch the finalize reads and never writes, reset at k == 0 and dead after;
    its `q = q + E` form; the sum before it is not followed by the finalize and stays as it is."""
    new = FoldLastStepPass().apply(KernelIR.from_file(MOMENTS))
    assert (
        "    s_ref[...] += jnp.sum(x, axis=1, keepdims=True)\n\n    @pl.when(k != pl.num_programs(1) - 1)" in new.source
    )
    assert "total = q_ref[...] + jnp.sum(x * x, axis=1, keepdims=True)" in new.source
    assert "jnp.broadcast_to(total / K - mean * mean, var_ref.shape)" in new.source


def test_an_assign_first_reduction_is_zeroed_then_folded() -> None:
    """fused_07 assigns the first step's product (`@pl.when(k == 0)`) and adds the others (`@pl.when(k > 0)`): the
    first becomes a zeroing, the add an every-step update, which then folds."""
    path = BENCH / "fused_07_matmul_min_tanh.py"
    new = FoldLastStepPass().apply(KernelIR.from_file(path))
    assert "    @pl.when(k == 0)\n    def _():\n        o_ref[...] = jnp.zeros_like(o_ref)" in new.source
    assert "@pl.when(k != pl.num_programs(2) - 1)\n    def _accumulate():\n        o_ref[...] += part" in new.source
    assert "total = o_ref[...] + part\n        o_ref[...] = jnp.tanh(jnp.minimum(total, CLAMP_MAX))" in new.source
    assert "k > 0" not in new.source
    # `s > 0` is the complement of `s == 0` only for a step index: a name bound otherwise is left alone
    other = _edited(path, {"k = pl.program_id(2)": "k = pl.program_id(2) - 1"})
    with pytest.raises(PassNotApplicable, match="no `R"):
        FoldLastStepPass().apply(other)


def test_after_fuse_and_after_accumulate_in_scratch() -> None:
    fused = _run(BENCH / "fused_02_matmul_gelu.py", "fuse{producer=0},fold-last-step")
    assert "jax.nn.gelu(total, approximate=True)" in fused.source and len(fused.calls) == 1
    acc = _run(MISH, "accumulate-in-scratch,fold-last-step")
    assert "acc_ref[...] = _mish(total)" in acc.source and "o_ref[...] = acc_ref[...].astype(o_ref.dtype)" in acc.source


@pytest.mark.parametrize(
    ("path", "edits", "why"),
    [
        (MISH, {"o_ref[...] = _mish(o_ref[...])": "o_ref[...] += _mish(o_ref[...])"}, "other than whole"),
        (MISH, {"o_ref[...] = _mish(o_ref[...])": "o_ref[0:8, :] = _mish(o_ref[...])[0:8, :]"}, "other than whole"),
        (
            MISH,
            {"o_ref[...] = _mish(o_ref[...])": "o_ref[...] = _mish(o_ref[...]) + o_ref[0:1, :]"},
            "other than as o_ref",
        ),
        (MISH, {"o_ref[...] = _mish(o_ref[...])": "x_ref[...] = _mish(o_ref[...])"}, "an output"),
        (MISH, {"w_ref[...], preferred_element_type": "o_ref[...], preferred_element_type"}, "reads o_ref itself"),
        (MOMENTS, {"        q_ref[...] = jnp.zeros_like(q_ref)\n": ""}, "not reset"),
        (
            MOMENTS,
            {"var_ref.shape)\n": "var_ref.shape)\n\n    var_ref[0:1, 0:1] = q_ref[0:1, 0:1]\n"},
            "used after the finalize",
        ),
        (BENCH / "llm_large_gemm.py", {}, "no `R"),
    ],
)
def test_declines(path: Path, edits: dict[str, str], why: str) -> None:
    with pytest.raises(PassNotApplicable, match=why):
        FoldLastStepPass().apply(_edited(path, edits))


@pytest.mark.slow
def test_every_kernel_it_applies_to_matches_the_reference() -> None:
    """Every bench kernel the pass is offered on, the fixture, and the fused / scratch-accumulator chains, re-traced
    and checked in interpret mode."""
    cases: list[tuple[Path, KernelIR]] = []
    for path in [MOMENTS, *sorted(BENCH.glob("fused_0*.py")), *sorted(BENCH.glob("fused_1*.py"))]:
        ir = KernelIR.from_file(path)
        cases += [(path, c.apply(ir)) for c in FoldLastStepPass.choices(ir, V5E)]
    cases.append(
        (BENCH / "fused_02_matmul_gelu.py", _run(BENCH / "fused_02_matmul_gelu.py", "fuse{producer=0},fold-last-step"))
    )
    cases.append((MISH, _run(MISH, "accumulate-in-scratch,fold-last-step")))
    assert len(cases) >= 6, [str(p.name) for p, _ in cases]
    for path, new in cases:
        (c,) = check_many([new.source], str(path))
        assert c.ok, (path.name, new.recipe, c.message)
