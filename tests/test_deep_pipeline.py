"""pipeline: a call's grid runs as an emit_pipeline inside a kernel with no grid, moving inputs held in 3 or 4
buffers. Before/after sources, every choice re-traced and checked in interpret mode on kernels of several styles
(a matmul accumulating over a reduction axis, a paged decode gathering through a non-contiguous page table, a
CompilerParams shared with `.replace`), a broken rewrite caught, declines, the facts the model reads, and the rule
that keeps it out of a search that cannot time candidates."""

from __future__ import annotations

import pytest
from conftest import ROOT, TEST_KERNELS

from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.roofline import manual_dma_depth, vmem_footprint
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.optimize import select_passes
from pallasopt.passes.deep_pipeline import PipelinePass

V5E = get_chip("v5e")
MATMUL = ROOT / "examples" / "matmul.py"
PAGED = TEST_KERNELS / "gather" / "paged_decode.py"
SHARED_PARAMS = TEST_KERNELS / "styles" / "factory_gelu.py"


@pytest.fixture(scope="module")
def matmul() -> KernelIR:
    return KernelIR.from_file(MATMUL)


@pytest.fixture(scope="module")
def paged() -> KernelIR:
    return KernelIR.from_file(PAGED)


def test_choices_are_depths_three_and_four(matmul) -> None:
    assert [p.spec() for p in PipelinePass.choices(matmul, V5E)] == [
        "pipeline{call=0,depth=3}",
        "pipeline{call=0,depth=4}",
    ]
    assert PipelinePass.choices(matmul, get_chip("h100")) == ()


def test_the_grid_moves_into_the_kernel_and_the_body_is_untouched(matmul) -> None:
    new = PipelinePass(depth=3).apply(matmul)
    (before,), (after,) = matmul.calls, new.calls
    assert before.grid != () and after.grid == ()
    assert {o.memory_space for o in after.operands} == {"any"}
    src = new.source
    assert "_pipeline_kernel(" in src and "grid=()," in src and "in_specs=_pipeline_hbm([" in src
    body = matmul.source[matmul.source.index("def matmul_kernel") : matmul.source.index("def matmul(")]
    assert body in src
    # the inner pipeline's buffers are the body's own allocations: the moving inputs' rings have 3 slots
    sems = sorted(s.shape for s in after.scoped if s.dtype == "dma_sem")
    assert sems.count((3,)) == 2 and (2,) in sems
    assert manual_dma_depth(after) == 3
    # the model counts their VMEM: 3 buffers of each moving input block and 2 of the output
    blocks = {o.name: o.block_bytes for o in before.operands}
    assert vmem_footprint(after, V5E) >= 3 * (blocks["in0"] + blocks["in1"]) + 2 * blocks["out0"]


def test_the_steps_stay_steps_for_the_model(matmul) -> None:
    """The inner pipeline's loop is simulated: its iterations pay a step's overhead and its DMAs move the blocks the
    grid fetched, so the roofline sees the same work in both forms."""
    from pallasopt.cost_model.roofline import estimate_call

    new = PipelinePass(depth=3).apply(matmul)
    (before,), (after,) = matmul.calls, new.calls
    assert after.body.inner_steps == before.steps
    old, now = estimate_call(before, V5E), estimate_call(after, V5E)
    assert now.time_s == pytest.approx(old.time_s, rel=0.05)
    assert sum(t.bytes for t in now.traffic) == pytest.approx(sum(t.bytes for t in old.traffic), rel=0.02)


def test_every_choice_passes_the_oracle(matmul, paged) -> None:
    shared = KernelIR.from_file(SHARED_PARAMS)
    cases = [(ir, p) for ir in (matmul, paged, shared) for p in PipelinePass.choices(ir, V5E)]
    assert len(cases) == 6
    news = [p.apply(ir) for ir, p in cases]
    assert "PARAMS.replace(dimension_semantics=None)" in news[-1].source  # the shared constant is left alone
    for (ir, p), r in zip(cases, check_many([n.source for n in news], str(PAGED)), strict=True):
        assert r.ok, f"{ir.path} {p.spec()}: {r.message}"
        assert r.mode == "interpret-tpu-races"  # the inner pipeline's DMAs run under the race detector


def test_a_wrong_table_binding_fails_the_oracle(paged) -> None:
    """The check can fail: the index maps given the scalar-prefetch tables in the wrong order gather wrong pages."""
    new = PipelinePass(depth=3).apply(paged)
    wrong = new.source.replace("index_map(*idx, *head)", "index_map(*idx, *head[::-1])")
    assert wrong != new.source
    (r,) = check_many([wrong], str(PAGED))
    assert not r.ok, r.message


def test_declines_name_why(matmul) -> None:
    for path, why in [
        (TEST_KERNELS / "dma_copy_scale.py", "manual DMA"),
        (TEST_KERNELS / "styles" / "aliased_axpy.py", "aliases inputs to outputs"),
    ]:
        ir = KernelIR.from_file(path)
        assert PipelinePass.choices(ir, V5E) == ()
        with pytest.raises(PassNotApplicable, match=why):
            PipelinePass(depth=3).apply(ir)
    once = PipelinePass(depth=3).apply(matmul)  # no grid left to pipeline
    with pytest.raises(PassNotApplicable, match="no grid axis"):
        PipelinePass(depth=3).apply(once)


EMPTY_GRID = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _kernel(x_ref, y_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + y_ref[...]


def fused_op(x, y):
    m, n = x.shape
    spec = pl.BlockSpec((8, 128), lambda i, j: (i, j))
    return pl.pallas_call(
        _kernel,
        grid=(m // 8, n // 128),
        in_specs=[spec, spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
    )(x, y)


def reference(x, y):
    return x * 2.0 + y


def make_inputs(key, M=64, N=8):
    kx, ky = jax.random.split(key)
    return (jax.random.normal(kx, (M, N), jnp.float32), jax.random.normal(ky, (M, N), jnp.float32))
"""


def test_an_empty_grid_declines(tmp_path) -> None:
    # a (8, 128) block on a (64, 8) array floors to grid (8, 0): pallas_call runs nothing and emit_pipeline raises
    # at trace time (found by the property test in CI)
    path = tmp_path / "empty.py"
    path.write_text(EMPTY_GRID)
    ir = KernelIR.from_file(path)
    assert ir.calls[0].grid == (8, 0)
    assert PipelinePass.choices(ir, V5E) == ()
    with pytest.raises(PassNotApplicable, match="a grid axis with no steps"):
        PipelinePass(depth=3).apply(ir)


@pytest.mark.parametrize("n", [8, 200], ids=["block-wider-than-array", "partial-last-block"])
def test_a_block_that_does_not_divide_its_array_declines(tmp_path, n: int) -> None:
    # with a cdiv grid, emit_pipeline DMAs the ragged block with a run-time size: the trace's DMA count crashed on it
    # ("int() argument ... not 'Var'", found by the property test, session 33) and the TPU interpreter rejects it
    path = tmp_path / "ragged.py"
    path.write_text(
        EMPTY_GRID.replace("grid=(m // 8, n // 128)", "grid=(pl.cdiv(m, 8), pl.cdiv(n, 128))").replace("N=8", f"N={n}")
    )
    ir = KernelIR.from_file(path)
    assert PipelinePass.choices(ir, V5E) == ()
    with pytest.raises(PassNotApplicable, match="does not divide its array"):
        PipelinePass(depth=3).apply(ir)


def test_the_search_offers_it_only_where_it_can_time_candidates() -> None:
    assert "pipeline" not in {p.name for p in select_passes([])}
    assert "pipeline" in {p.name for p in select_passes([], hardware=True)}
    assert [p.name for p in select_passes(["pipeline", "tile"])] == ["pipeline", "tile"]


def test_a_dma_of_run_time_size_is_counted_at_its_bound() -> None:
    ir = KernelIR.from_file(TEST_KERNELS / "pipeline" / "ragged_emit_pipeline.py")
    (c,) = ir.calls
    assert c.grid == () and c.body.has_dma  # traced: the DMA count took the whole dim where the size is traced
