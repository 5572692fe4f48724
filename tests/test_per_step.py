"""Per-grid-step evaluation in the roofline model: `pl.when` branches and index maps evaluated on every grid point,
with scalar-prefetch tables materialized from `make_inputs` (no compiler, no TPU).

Expected counts are worked out by hand in each test. Before per-step evaluation the model weighted a `pl.when` on
program ids by 1 / (largest grid extent it reads) and counted a data-dependent block as fetched at every step.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import TEST_KERNELS

from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.roofline import estimate_call
from pallasopt.ir.facts import CallFacts
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.ir.steps import NotEvaluable, evaluate, fetch_count, grid_indices

V5E = get_chip("v5e")

HEADER = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
"""

# Causal attention-like loop: grid (q blocks, kv blocks) = (4, 4); the score matmul runs only where kv <= q (SKIP),
# and the kv block index is clamped to the diagonal (CLAMP), so skipped steps keep the block they already hold.
CAUSAL = (
    HEADER
    + """
def kernel(q_ref, k_ref, o_ref):
    i, j = pl.program_id(0), pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    def step():
        o_ref[...] += jnp.dot(q_ref[...], k_ref[...].T, preferred_element_type=jnp.float32)

    if SKIP:
        pl.when(j <= i)(step)
    else:
        step()


def causal(q, k):
    s = q.shape[0]
    return pl.pallas_call(
        kernel,
        grid=(s // 128, s // 128),
        in_specs=[
            pl.BlockSpec((128, 128), lambda i, j: (i, 0)),
            pl.BlockSpec((128, 128), lambda i, j: (jnp.minimum(i, j) if CLAMP else j, 0)),
        ],
        out_specs=pl.BlockSpec((128, 128), lambda i, j: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((s, 128), jnp.float32),
    )(q, k)


def reference(q, k):
    return jnp.dot(q, k.T, preferred_element_type=jnp.float32)


def make_inputs(key, S=512):
    kq, kk = jax.random.split(key)
    return (
        jax.random.normal(kq, (S, 128), jnp.float32).astype(jnp.bfloat16),
        jax.random.normal(kk, (S, 128), jnp.float32).astype(jnp.bfloat16),
    )
"""
)

# Block-sparse matmul (the pattern of the Pallas TPU sparse tutorial): a checkerboard block mask over (row block i,
# k block kk) of a 4x4 grid, half the blocks zero. `mask` gates the matmul; `pin` maps a skipped block to the block
# its row keeps (the previous valid one), so a skipped step fetches nothing. Both are scalar-prefetch tables that
# make_inputs builds with jnp (no randomness).
SPARSE = (
    HEADER
    + """
def kernel(mask_ref, pin_ref, x_ref, y_ref, o_ref):
    i, kk = pl.program_id(0), pl.program_id(1)

    @pl.when(kk == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    @pl.when(mask_ref[i, kk] != 0)
    def _acc():
        o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def sparse(mask, pin, x, y):
    m, k = x.shape
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=2,
        grid=(m // 128, k // 128),
        in_specs=[
            pl.BlockSpec((128, 128), lambda i, kk, mask, pin: (i, pin[i, kk])),
            pl.BlockSpec((128, 128), lambda i, kk, mask, pin: (pin[i, kk], 0)),
        ],
        out_specs=pl.BlockSpec((128, 128), lambda i, kk, mask, pin: (i, 0)),
    )
    return pl.pallas_call(kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct((m, 128), jnp.float32))(
        mask, pin, x, y
    )


def reference(mask, pin, x, y):
    dense = jnp.repeat(jnp.repeat(mask, 128, 0), 128, 1).astype(x.dtype) * x
    return jnp.dot(dense, y, preferred_element_type=jnp.float32)


def make_inputs(key, M=512, K=512):
    kx, ky = jax.random.split(key)
    rows, cols = jnp.arange(M // 128)[:, None], jnp.arange(K // 128)[None, :]
    valid = (rows + cols) % 2 == 0
    pin = jnp.where(valid, cols, jnp.where(cols == 0, 1, cols - 1)).astype(jnp.int32)
    return (
        valid.astype(jnp.int32),
        pin,
        jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.bfloat16),
        jax.random.normal(ky, (K, 128), jnp.float32).astype(jnp.bfloat16),
    )
"""
)


@functools.cache
def traced(source: str) -> CallFacts:
    (call,) = KernelIR.from_source(source, "<test>.py").calls
    return call


def causal(skip: bool, clamp: bool) -> CallFacts:
    return traced(CAUSAL.replace("SKIP", str(skip)).replace("CLAMP", str(clamp)))


def fetches(call: CallFacts) -> dict[str, tuple[int, str]]:
    return {t.operand: (t.fetches, t.method) for t in estimate_call(call, V5E).traffic}


def test_causal_skip_charges_the_matmul_on_the_lower_triangle_only() -> None:
    full = estimate_call(causal(skip=False, clamp=False), V5E)
    skipped = estimate_call(causal(skip=True, clamp=False), V5E)
    # kv <= q holds on 4 + 3 + 2 + 1 = 10 of the 16 steps (the old 1/extent weighting gave 4 of 16).
    assert skipped.mxu_s == pytest.approx(full.mxu_s * 10 / 16)
    assert any("evaluated per grid step" in n for n in skipped.notes)
    # Step overhead is paid on every step, skipped or not.
    assert skipped.overhead_s == pytest.approx(full.overhead_s)


def test_clamped_kv_map_does_not_refetch_on_skipped_steps() -> None:
    # kv block min(q, kv) over q = 0..3, kv = 0..3: 0000 0111 0122 0123, a new block 9 times (16 unclamped).
    assert fetches(causal(skip=True, clamp=True))["in1"] == (9, "enumerated")
    assert fetches(causal(skip=True, clamp=False))["in1"] == (16, "closed-form")


def test_block_sparse_tables_are_materialized_and_evaluated() -> None:
    call = traced(SPARSE)
    assert call.prefetch is not None, call.prefetch_note
    mask, pin = call.prefetch
    assert mask.tolist() == [[1, 0, 1, 0], [0, 1, 0, 1], [1, 0, 1, 0], [0, 1, 0, 1]]
    assert pin.tolist()[:2] == [[0, 0, 2, 2], [1, 1, 1, 3]]
    # Each row fetches 2 distinct x blocks and 2 distinct y blocks (pinned runs 0,0,2,2 / 1,1,1,3): 8, not 16.
    got = fetches(call)
    assert got["in0"] == (8, "data") and got["in1"] == (8, "data")
    # Half the steps run the matmul: the MXU time is half of a dense 512x512x128 matmul's 16 block products.
    dense_block = 2 * 128 * 128 * 128 / V5E.device_peak_flops("bfloat16")
    assert estimate_call(call, V5E).mxu_s == pytest.approx(8 * dense_block)


def test_a_table_program_already_evaluated_is_served_without_a_compile(monkeypatch) -> None:
    """Tables are computed once per program (jaxpr text + constants): a re-trace of the same module (a pass's
    candidate) compiles nothing; a module whose tables differ gets its own values."""
    import jax

    from pallasopt.ir import prefetch

    monkeypatch.setattr(prefetch, "_VALUES", type(prefetch._VALUES)())
    first = KernelIR.from_source(SPARSE, "<a>.py").calls[0].prefetch
    assert first is not None and len(prefetch._VALUES) == 1
    compiles = []
    real_jit = jax.jit
    monkeypatch.setattr(jax, "jit", lambda f, *a, **k: compiles.append(f) or real_jit(f, *a, **k))
    again = KernelIR.from_source(SPARSE, "<b>.py").calls[0].prefetch
    assert again is not None and not compiles and len(prefetch._VALUES) == 1
    assert all((x == y).all() for x, y in zip(first, again, strict=True))
    other = KernelIR.from_source(SPARSE.replace("(rows + cols) % 2 == 0", "rows >= cols"), "<c>.py").calls[0]
    assert other.prefetch is not None and len(prefetch._VALUES) == 2
    assert other.prefetch[0].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


def test_without_tables_the_model_says_so_and_keeps_the_closed_form() -> None:
    import dataclasses

    call = dataclasses.replace(traced(SPARSE), prefetch=None, prefetch_note="scalar-prefetch values not known")
    got = fetches(call)
    assert got["in0"] == (16, "structural")
    assert "scalar-prefetch values not known" in estimate_call(call, V5E).notes


def test_grid_indices_visit_the_last_axis_fastest_and_follow_an_order() -> None:
    i, j = grid_indices((2, 3))
    assert i.tolist() == [0, 0, 0, 1, 1, 1] and j.tolist() == [0, 1, 2, 0, 1, 2]
    i, j = grid_indices((2, 3), order=(1, 0))
    assert i.tolist() == [0, 1, 0, 1, 0, 1] and j.tolist() == [0, 0, 1, 1, 2, 2]


def test_fetch_count_counts_changes_of_any_block_dim() -> None:
    assert fetch_count([np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1])]) == 3
    assert fetch_count([np.array([2, 2, 2])]) == 1


def test_interpreter_refuses_what_it_does_not_model() -> None:
    import jax
    import jax.numpy as jnp

    closed = jax.make_jaxpr(lambda i: jnp.sin(i.astype(jnp.float32)))(np.int32(0))
    with pytest.raises(NotEvaluable):
        evaluate(closed.jaxpr, closed.consts, [np.arange(3, dtype=np.int32)])
    # lax.div / lax.rem truncate toward zero, unlike numpy's floor division.
    closed = jax.make_jaxpr(lambda i: (jax.lax.div(i, 2), jax.lax.rem(i, 2)))(np.int32(0))
    q, r = evaluate(closed.jaxpr, closed.consts, [np.array([-3, 3], dtype=np.int32)])
    assert q.tolist() == [-1, 1] and r.tolist() == [-1, 1]


def test_a_table_computed_from_a_float_input_is_not_materialized() -> None:
    src = SPARSE.replace(
        "    return pl.pallas_call(kernel, grid_spec=spec",
        "    mask = (x[::128, ::128] > 100).astype(jnp.int32)\n    return pl.pallas_call(kernel, grid_spec=spec",
    )
    call = traced(src)
    assert call.prefetch is None
    assert "entry input 2" in call.prefetch_note and "not an integer array" in call.prefetch_note
    assert fetches(call)["in0"] == (16, "structural")


def test_first_step_init_costs_the_same_as_the_old_weighting() -> None:
    import dataclasses

    # pl.when(j == 0) runs on 1 of grid[1] steps: per-step evaluation agrees with the 1 / extent weighting, so the
    # dense kernels the model was validated on (the matmul tutorial tables) keep their estimates.
    call = causal(skip=False, clamp=False)
    assert len(call.body.branchings) == 1
    aggregate = dataclasses.replace(call, body=dataclasses.replace(call.body, branchings=()))
    assert estimate_call(call, V5E).time_s == pytest.approx(estimate_call(aggregate, V5E).time_s)


def test_a_predicate_is_evaluated_on_the_axes_it_reads_with_the_same_sums() -> None:
    """`j == 0` reads axis 1 only, `j <= i` both: each branching records its axes, and the per-step sums over the
    sub-grid of the axes read (each point standing for the steps it covers) equal those over every step."""
    import dataclasses

    init_only, both = causal(skip=False, clamp=False), causal(skip=True, clamp=False)
    assert [b.axes for b in init_only.body.branchings] == [(1,)]
    assert [b.axes for b in both.body.branchings] == [(1,), (0, 1)]
    for call in (init_only, both):
        unknown = dataclasses.replace(
            call,
            body=dataclasses.replace(
                call.body, branchings=tuple(dataclasses.replace(b, axes=None) for b in call.body.branchings)
            ),
        )
        assert estimate_call(call, V5E).time_s == pytest.approx(estimate_call(unknown, V5E).time_s, rel=1e-12)
        assert estimate_call(call, V5E).mxu_s == pytest.approx(estimate_call(unknown, V5E).mxu_s, rel=1e-12)


def test_a_predicate_from_a_jitted_helper_reading_program_id_has_unknown_axes() -> None:
    """A helper under jax.jit that calls program_id itself: the outer jaxpr shows no program_id feeding the
    predicate, so which axes it reads is unknown (None: evaluated on every step), never "none"."""
    src = (
        CAUSAL.replace("SKIP", "False")
        .replace("CLAMP", "False")
        .replace("    @pl.when(j == 0)", "    @pl.when(_first())")
        + "\n\n@jax.jit\ndef _first():\n    return pl.program_id(1) == 0\n"
    )
    (b,) = traced(src).body.branchings
    assert b.axes is None


# A hand-pipelined body (the shape of tokamax's megablox gmm under emit_pipeline): no grid, one `fori_loop` whose
# bound is read from an SMEM input, a manual copy of one x block per iteration, and the matmul on even iterations
# only. A static count sees one iteration (one DMA, one dot, an unbounded loop); the simulation runs it.
LOOP = (
    HEADER
    + """
def kernel(n_ref, x_hbm, w_ref, o_ref, buf, sem):
    o_ref[...] = jnp.zeros_like(o_ref)

    def body(i, carry):
        cp = pltpu.make_async_copy(x_hbm.at[pl.ds(i * ROWS, ROWS)], buf, sem)
        cp.start()
        cp.wait()

        @pl.when(i % 2 == 0)
        def _acc():
            o_ref[...] += jnp.dot(buf[...], w_ref[...], preferred_element_type=jnp.float32)

        return carry

    jax.lax.fori_loop(0, n_ref[0], body, 0)


def looped(n, x, w):
    return pl.pallas_call(
        kernel,
        in_specs=[
            pl.BlockSpec(memory_space=pltpu.SMEM),
            pl.BlockSpec(memory_space=pl.ANY),
            pl.BlockSpec((128, 128), lambda: (0, 0)),
        ],
        out_specs=pl.BlockSpec((ROWS, 128), lambda: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((ROWS, 128), jnp.float32),
        scratch_shapes=[pltpu.VMEM((ROWS, 128), jnp.bfloat16), pltpu.SemaphoreType.DMA],
    )(n, x, w)


def reference(n, x, w):
    return jnp.dot(x[: ROWS * n[0]].reshape(-1, ROWS, 128)[::2].sum(0), w, preferred_element_type=jnp.float32)


def make_inputs(key, N=TRIPS):
    kx, kw = jax.random.split(key)
    return (
        jnp.array([N], jnp.int32),
        jax.random.normal(kx, (N * ROWS, 128), jnp.float32).astype(jnp.bfloat16),
        jax.random.normal(kw, (128, 128), jnp.float32).astype(jnp.bfloat16),
    )
"""
)


def looped(trips: int, rows: int = 128, bound: str = "n_ref[0]") -> CallFacts:
    src = LOOP.replace("TRIPS", str(trips)).replace("ROWS", str(rows)).replace("n_ref[0]", bound)
    return traced(src)


def test_a_loop_with_an_smem_bound_is_simulated_trips_dmas_and_branches() -> None:
    call = looped(5)
    body = call.body
    assert not body.has_unbounded_loop
    assert body.inner_steps == 5
    assert body.dma_bytes == 5 * 128 * 128 * 2  # one 128x128 bf16 block per iteration
    (dot,) = body.dots
    assert dot.count == pytest.approx(3)  # iterations 0, 2, 4 of 5
    est = estimate_call(call, V5E)
    assert [(t.method, t.bytes) for t in est.traffic if t.method == "simulated"] == [("simulated", body.dma_bytes)]
    assert not any(t.operand == "in1" for t in est.traffic)  # the raw x ref is not charged a second time
    assert V5E.inner_step_overhead_s == 0.0  # not fitted: an inner iteration costs what a grid step does
    assert est.overhead_s == pytest.approx(6 * V5E.step_overhead_s)  # the step and its 5 inner iterations


def test_a_long_loop_is_extrapolated_from_the_simulated_iterations() -> None:
    from pallasopt.ir.loops import MAX_SIMULATED

    trips = 3 * MAX_SIMULATED + 1
    body = looped(trips, rows=8).body
    assert body.inner_steps == trips
    assert body.dma_bytes == pytest.approx(trips * 8 * 128 * 2, rel=1e-6)
    assert body.dots[0].count == pytest.approx(trips / 2)  # even iterations among the simulated ones: one half
    assert f"{MAX_SIMULATED} of {trips} iterations" in body.loop_note


def test_a_loop_bound_the_simulation_cannot_evaluate_keeps_the_static_count() -> None:
    # The bound is computed from a vector read (w's first element): not scalar SMEM arithmetic.
    body = looped(5, bound="w_ref[0, 0].astype(jnp.int32)").body
    assert body.has_unbounded_loop
    assert body.inner_steps == 0 and body.dma_bytes == 0
    assert body.dots[0].count == 1


# A grid sized at run time (splash attention's active blocks, megablox's active tiles): the extent is a scalar the
# wrapper computes from a small integer input, passed to the pallas_call ahead of the scalar-prefetch tables.
ACTIVE = (
    HEADER
    + """
def kernel(idx_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2


def active(mask, x):
    idx = jnp.nonzero(mask, size=mask.shape[0], fill_value=0)[0].astype(jnp.int32)
    n = jnp.sum(mask != 0).astype(jnp.int32)
    spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(n,),
        in_specs=[pl.BlockSpec((128, 128), lambda i, idx: (idx[i], 0))],
        out_specs=pl.BlockSpec((128, 128), lambda i, idx: (idx[i], 0)),
    )
    return pl.pallas_call(kernel, grid_spec=spec, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(idx, x)


def reference(mask, x):
    return x * 2


def make_inputs(key, M=1024):
    mask = jnp.array([1, 0, 1, 1, 0, 0, 1, 0], jnp.int32)
    return mask, jax.random.normal(key, (M, 128), jnp.float32)
"""
)


def test_a_run_time_grid_extent_is_materialized_and_the_tables_follow_it() -> None:
    call = traced(ACTIVE)
    assert call.dynamic_axes == (0,)
    assert call.grid == (4,)  # four active blocks, not 1024 / 128 = 8
    assert call.prefetch is not None
    np.testing.assert_array_equal(call.prefetch[0], [0, 2, 3, 6, 0, 0, 0, 0])  # the table, not the extent
    assert fetches(call)["in0"] == (4, "data")


def test_tables_are_cached_by_the_ops_they_need_not_by_every_input_shape(monkeypatch) -> None:
    """A dim that changes only float inputs (the head size D of a paged decode) leaves the page-table program as it
    was: `make_inputs` is traced whole, so before `_pruned` the float inputs' shapes were in the cache key and each
    such dim set compiled the table program again (paged attention's check-dim derivation: 0.4 s a trace). A dim the
    table depends on (the batch) still gets its own values."""
    from pallasopt.ir import prefetch
    from pallasopt.ir.trace import trace_calls

    monkeypatch.setattr(prefetch, "_VALUES", type(prefetch._VALUES)())
    ir = KernelIR.from_file(TEST_KERNELS / "gather" / "paged_decode.py")
    assert ir.workload is not None and ir.calls[0].prefetch is not None
    n = len(prefetch._VALUES)
    (wider,) = trace_calls(ir.workload, {**ir.dims, "D": 256, "Hq": 8})
    assert len(prefetch._VALUES) == n and wider.prefetch is not None
    assert all((x == y).all() for x, y in zip(wider.prefetch, ir.calls[0].prefetch, strict=True))
    (batch,) = trace_calls(ir.workload, {**ir.dims, "B": 4})
    assert len(prefetch._VALUES) == n + 1 and batch.prefetch is not None and batch.prefetch[1].shape[0] == 4
