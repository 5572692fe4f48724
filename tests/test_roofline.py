"""The roofline model's rules, checked on facts traced from small kernel sources (no compiler, no TPU).

Expected counts are worked out by hand in each test: the pipeline fetches a block only when its block index changes
between consecutive grid steps (last grid axis fastest); VMEM = buffers x block bytes padded to the native tile,
plus scratch; block shapes follow the (8, 128)-or-full-dim rule; megacore splits "parallel" axes on v4/v5p only.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.roofline import (
    block_fetches,
    estimate_call,
    explain,
    legality_problems,
    padded_block_bytes,
    vmem_footprint,
)
from pallasopt.ir.facts import CallFacts, Operand
from pallasopt.ir.kernel_ir import KernelIR

V5E, V5P, V6E = get_chip("v5e"), get_chip("v5p"), get_chip("v6e")

HEADER = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
"""

# Matmul with k innermost. M=256, N=384, K=512 with 128-blocks: grid (gi, gj, gk) = (2, 3, 4).
MATMUL = (
    HEADER
    + """
def kernel(x_ref, y_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)


def matmul(x, y):
    m, k = x.shape
    _, n = y.shape
    return pl.pallas_call(
        kernel,
        grid=(m // 128, n // 128, k // 128),
        in_specs=[
            pl.BlockSpec((128, 128), lambda i, j, kk: (i, kk)),
            pl.BlockSpec((128, 128), lambda i, j, kk: (kk, j)),
        ],
        out_specs=pl.BlockSpec((128, 128), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        compiler_params=pltpu.CompilerParams(dimension_semantics=SEMANTICS),
    )(x, y)


def reference(x, y):
    return jnp.dot(x, y, preferred_element_type=jnp.float32)


def make_inputs(key, M=256, N=384, K=512):
    kx, ky = jax.random.split(key)
    return (
        jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.bfloat16),
        jax.random.normal(ky, (K, N), jnp.float32).astype(jnp.bfloat16),
    )
"""
)

# Grid (gi, gk, gj) = (2, 4, 3): j innermost, so the x block (i, k) stays put along j and is fetched gi*gk times.
# A (16, 128) f32 accumulator scratch and a bias whose block never moves.
SWAPPED = (
    HEADER
    + """
def kernel(x_ref, y_ref, b_ref, o_ref, acc_ref):
    acc_ref[...] = jnp.dot(x_ref[...], y_ref[...], preferred_element_type=jnp.float32)
    o_ref[...] = acc_ref[...] + b_ref[...]


def swapped(x, y, b):
    m, k = x.shape
    _, n = y.shape
    return pl.pallas_call(
        kernel,
        grid=(m // 128, k // 128, n // 128),
        in_specs=[
            pl.BlockSpec((128, 128), lambda i, kk, j: (i, kk)),
            pl.BlockSpec((128, 128), lambda i, kk, j: (kk, j)),
            pl.BlockSpec((1, 128), lambda i, kk, j: (0, 0)),
        ],
        out_specs=pl.BlockSpec((128, 128), lambda i, kk, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
        scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32)],
    )(x, y, b)


def reference(x, y, b):
    return jnp.dot(x, y, preferred_element_type=jnp.float32) + b


def make_inputs(key, M=256, N=384, K=512):
    kx, ky, kb = jax.random.split(key, 3)
    return (
        jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.bfloat16),
        jax.random.normal(ky, (K, N), jnp.float32).astype(jnp.bfloat16),
        jax.random.normal(kb, (1, 128), jnp.float32),
    )
"""
)

# Row-wise scale of an (R, C) bf16 array by a (1, C) bf16 weight; the block shape and buffering are parameters.
ROWS = (
    HEADER
    + """
def kernel(x_ref, w_ref, o_ref):
    o_ref[...] = x_ref[...] * w_ref[...]


def scale_rows(x, w):
    r, c = x.shape
    return pl.pallas_call(
        kernel,
        grid=(r // BR, c // BC),
        in_specs=[
            pl.BlockSpec((BR, BC), lambda i, j: (i, j)),
            pl.BlockSpec((1, BC), lambda i, j: (0, j)WMODE),
        ],
        out_specs=pl.BlockSpec((BR, BC), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((r, c), x.dtype),
    )(x, w)


def reference(x, w):
    return x * w


def make_inputs(key, R=64, C=512):
    kx, kw = jax.random.split(key)
    return (
        jax.random.normal(kx, (R, C), jnp.float32).astype(jnp.bfloat16),
        jax.random.normal(kw, (1, C), jnp.float32).astype(jnp.bfloat16),
    )
"""
)


@functools.cache
def traced(source: str) -> CallFacts:
    (call,) = KernelIR.from_source(source, "<test>.py").calls
    return call


def matmul(semantics: str = "None") -> CallFacts:
    return traced(MATMUL.replace("SEMANTICS", semantics))


def rows(br: int = 16, bc: int = 128, wmode: str = "", r: int = 64, c: int = 512) -> CallFacts:
    src = ROWS.replace("BR", str(br)).replace("BC", str(bc)).replace("WMODE", wmode)
    return traced(src.replace("R=64, C=512", f"R={r}, C={c}"))


def op(call: CallFacts, name: str) -> Operand:
    return next(o for o in call.operands if o.name == name)


def traffic(call: CallFacts, chip=V5E) -> dict[str, tuple[int, int]]:
    return {t.operand: (t.fetches, t.bytes) for t in estimate_call(call, chip).traffic}


# --- HBM traffic -----------------------------------------------------------------------------------------------


def test_matmul_k_innermost_refetches_every_step() -> None:
    call = matmul()
    assert call.grid == (2, 3, 4)
    block_bf16, block_f32 = 128 * 128 * 2, 128 * 128 * 4
    # x (i, k) and y (k, j) change at every step (k is innermost): 2*3*4 = 24 fetches each.
    # The output (i, j) changes only when j or i does: 2*3 = 6 write-backs, i.e. each output block once.
    assert traffic(call) == {
        "in0": (24, 24 * block_bf16),
        "in1": (24, 24 * block_bf16),
        "out0": (6, 6 * block_f32),
    }
    # x is re-read once per output column tile: 24 fetches = gj (3) x the 8 distinct x blocks.
    assert estimate_call(call, V5E).bytes == 24 * block_bf16 * 2 + 6 * block_f32


def test_revisited_block_is_not_refetched_when_the_inner_axis_leaves_it_alone() -> None:
    call = traced(SWAPPED)
    assert call.grid == (2, 4, 3)
    # x (i, k): constant along the innermost j, so it is fetched gi*gk = 8 times (each distinct block once).
    # y (k, j): changes every step: 2*4*3 = 24. Output (i, j): j changes every step, so 24 write-backs.
    # Bias (0, 0): never moves, fetched once.
    f = {k: v[0] for k, v in traffic(call).items()}
    assert f == {"in0": 8, "in1": 24, "in2": 1, "out0": 24}


def test_grid_order_changes_the_fetch_count() -> None:
    x = op(matmul(), "in0")  # x depends on axes 0 and 2
    assert block_fetches(x, (2, 3, 4)) == (24, "closed-form")
    # Visiting axis 2 before axis 1 (j innermost): x stays put along j -> 2*4 fetches.
    assert block_fetches(x, (2, 3, 4), order=(0, 2, 1)) == (8, "closed-form")


def test_block_that_never_moves_is_fetched_once() -> None:
    call = rows(br=16, bc=512)  # grid (4, 1): the weight's block index (0, j) is always (0, 0)
    assert call.grid == (4, 1)
    assert block_fetches(op(call, "in1"), call.grid) == (1, "closed-form")
    assert traffic(call)["in1"] == (1, 512 * 2)
    assert traffic(call)["in0"] == (4, 4 * 16 * 512 * 2)


def test_non_affine_index_map_is_enumerated() -> None:
    call = rows(br=8, bc=128)  # grid (8, 4)
    x = op(call, "in0")
    halved = dataclasses.replace(
        x,
        index_map=dataclasses.replace(
            x.index_map, affine=None, fn=lambda idx: (idx[0] // 2, idx[1]), depends_on=((0,), (1,))
        ),
    )
    # Row-major over (8, 4): the block index (i // 2, j) changes at every step because j moves innermost.
    assert block_fetches(halved, (8, 4)) == (32, "enumerated")
    # With a single column the pairs of rows share a block: 4 distinct runs.
    assert block_fetches(halved, (8, 1)) == (4, "enumerated")


# --- VMEM ------------------------------------------------------------------------------------------------------


def test_vmem_is_two_buffers_of_each_block_plus_scratch() -> None:
    mm = matmul()
    assert vmem_footprint(mm, V5E) == 2 * (128 * 128 * 2 + 128 * 128 * 2 + 128 * 128 * 4)
    sw = traced(SWAPPED)
    # The (128, 128) f32 scratch is counted once, on top of the pipelined blocks.
    assert vmem_footprint(sw, V5E) - vmem_footprint(dataclasses.replace(sw, scratch=()), V5E) == 128 * 128 * 4


def test_vmem_pads_blocks_to_the_native_tile() -> None:
    # libtpu 0.0.42.1 measured (docs/cost-model.md, finding 3): rows pad to a multiple of 8 whatever the dtype,
    # lanes to 128, and a 1-row block takes one 32-bit row.
    call = rows(br=8, bc=128)
    x, w = op(call, "in0"), op(call, "in1")
    assert padded_block_bytes(x, V5E) == 8 * 128 * 2
    assert padded_block_bytes(w, V5E) == 1 * 128 * 4
    # x, the weight (it follows the column axis) and out all move: two buffers each.
    assert vmem_footprint(call, V5E) == 2 * 8 * 128 * 2 + 2 * 1 * 128 * 4 + 2 * 8 * 128 * 2
    narrow = rows(br=4, bc=128)  # 4 rows pad to 8
    assert padded_block_bytes(op(narrow, "in0"), V5E) == 8 * 128 * 2


def test_buffered_one_halves_that_operand() -> None:
    call = rows(br=16, bc=128, wmode=", pipeline_mode=pl.Buffered(1)")
    assert op(call, "in1").buffer_count == 1
    assert vmem_footprint(call, V5E) == 2 * 16 * 128 * 2 + 1 * 128 * 4 + 2 * 16 * 128 * 2
    assert not legality_problems(call, V5E)


def test_single_step_grid_is_single_buffered() -> None:
    call = rows(br=64, bc=512)  # the whole array in one block: grid (1, 1)
    assert call.steps == 1
    assert vmem_footprint(call, V5E) == 64 * 512 * 2 + 1 * 512 * 4 + 64 * 512 * 2


def test_vmem_verdict_uses_the_scoped_limit_with_a_margin() -> None:
    # 2 x (x + out) blocks of (512, 4096) bf16 = 16 MiB, plus the weight: over 90% of v5e's 16 MiB, under v6e's 32.
    call = rows(br=512, bc=4096, r=1024, c=4096)
    assert estimate_call(call, V5E).fits_vmem is False
    assert estimate_call(call, V6E).fits_vmem is True
    raised = dataclasses.replace(call, vmem_limit_bytes=64 << 20)
    assert estimate_call(raised, V5E).fits_vmem is True


# --- legality --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("br", "bc", "legal"),
    [
        (8, 128, True),  # (8, 128) multiples
        (16, 256, True),
        (4, 128, False),  # second-to-last 4: neither a multiple of 8 nor the full 64
        (8, 64, False),  # last 64: neither a multiple of 128 nor the full 512
        (64, 512, True),  # full dims are always allowed
    ],
)
def test_block_shape_rule(br: int, bc: int, legal: bool) -> None:
    call = rows(br=br, bc=bc)
    problems = [p for p in legality_problems(call, V5E) if p.startswith("in0")]
    assert (not problems) is legal, problems
    assert estimate_call(call, V5E).legal is legal


def test_full_dim_that_is_not_a_multiple_is_legal() -> None:
    call = rows(br=4, bc=96, r=4, c=96)  # the block is the whole (4, 96) array
    assert not legality_problems(call, V5E)


def test_buffered_three_is_rejected() -> None:
    call = rows(br=16, bc=128, wmode=", pipeline_mode=pl.Buffered(3)")
    problems = legality_problems(call, V5E)
    assert any("Buffered(3)" in p for p in problems), problems
    est = estimate_call(call, V5E)
    assert not est.legal and est.bound == "illegal" and not est.ok


def test_gpu_targets_skip_the_tpu_block_rule() -> None:
    assert legality_problems(rows(br=4, bc=128), get_chip("h100")) == []


# --- megacore --------------------------------------------------------------------------------------------------


def test_megacore_split_needs_a_megacore_chip_and_parallel_semantics() -> None:
    par = matmul('("parallel", "parallel", "arbitrary")')
    arb = matmul('("arbitrary", "arbitrary", "arbitrary")')
    none = matmul()
    assert par.dimension_semantics == ("parallel", "parallel", "arbitrary")
    assert estimate_call(par, V5P).megacore_split is True
    assert estimate_call(par, V5E).megacore_split is False  # one TensorCore
    assert estimate_call(par, V6E).megacore_split is False
    assert estimate_call(arb, V5P).megacore_split is False
    assert estimate_call(none, V5P).megacore_split is False


def test_megacore_halves_on_core_time_but_not_hbm_time() -> None:
    par = matmul('("parallel", "parallel", "arbitrary")')
    arb = matmul('("arbitrary", "arbitrary", "arbitrary")')
    split, serial = estimate_call(par, V5P), estimate_call(arb, V5P)
    assert split.overhead_s == pytest.approx(serial.overhead_s / 2)
    assert split.mxu_s == pytest.approx(serial.mxu_s / 2)
    assert split.dma_s == pytest.approx(serial.dma_s)  # HBM bandwidth is shared by the two cores


def test_parallel_axis_of_one_step_does_not_split() -> None:
    par = matmul('("parallel", "arbitrary", "arbitrary")')
    one = dataclasses.replace(par, grid=(1, 3, 4))
    assert estimate_call(one, V5P).megacore_split is False


# --- time composition ------------------------------------------------------------------------------------------


def test_time_is_max_of_dma_and_compute_plus_overhead_plus_edges() -> None:
    for call in (matmul(), traced(SWAPPED), rows()):
        e = estimate_call(call, V5E)
        compute = max(e.mxu_s, e.vpu_s + e.eup_s)
        assert e.time_s == pytest.approx(max(e.dma_s, compute + e.overhead_s) + e.edge_s)
        assert e.overhead_s == pytest.approx(call.steps * V5E.step_overhead_s)


def test_small_blocks_are_step_overhead_bound() -> None:
    e = estimate_call(rows(br=8, bc=128, r=512, c=512), V5E)
    assert e.bound == "step-overhead"


def test_vector_serial_charges_that_fraction_of_the_smaller_unit_on_top() -> None:
    call = traced(SWAPPED)  # matmul plus a bias add: both MXU and VPU time
    base = estimate_call(call, V5E)
    assert V5E.vector_serial == 0.0  # only tpu7x has a fitted value: v5e's dense estimates are unchanged
    assert base.vpu_s > 0 and base.mxu_s > 0
    e = estimate_call(call, dataclasses.replace(V5E, vector_serial=0.5))
    compute = max(base.mxu_s, base.vpu_s + base.eup_s) + 0.5 * min(base.mxu_s, base.vpu_s + base.eup_s)
    assert e.time_s == pytest.approx(max(e.dma_s, compute + e.overhead_s) + e.edge_s)
    assert e.time_s > base.time_s or e.bound == "memory"


# --- delivered HBM bandwidth ----------------------------------------------------------------------------------


def test_dma_time_is_bytes_over_the_bandwidth_the_chip_delivers() -> None:
    call = rows(br=256, bc=512, r=4096, c=512)
    full = estimate_call(call, dataclasses.replace(V5E, hbm_efficiency=1.0))
    half = estimate_call(call, dataclasses.replace(V5E, hbm_efficiency=0.5))
    assert full.bytes == half.bytes and full.dma_s > 0
    assert half.dma_s == pytest.approx(2 * full.dma_s)
    assert full.dma_s == pytest.approx(full.bytes / V5E.device_hbm_bw_bytes_s)
    # The fitted v5e figure (hardware.py) is what a plain estimate uses.
    assert estimate_call(call, V5E).dma_s == pytest.approx(full.dma_s / V5E.hbm_efficiency)


def test_explain_names_the_delivered_bandwidth() -> None:
    call = rows(br=256, bc=512, r=4096, c=512)
    assert "573 GB/s (0.70 of 819)" in explain(estimate_call(call, V5E), V5E)
    assert "1640 GB/s;" in explain(estimate_call(call, V6E), V6E)  # no measurement: the datasheet figure
