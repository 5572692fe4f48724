"""Kernels written in styles the bench suite does not use (tests/kernels/styles): loading, facts and passes."""

from __future__ import annotations

import pytest
from conftest import ROOT, TEST_KERNELS

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.accumulate import AccumulateInScratchPass
from pallasopt.passes.registry import parse_pipeline
from pallasopt.passes.tile import TilePass, knobs_of, ragged_axis
from pallasopt.workload import inspect_source

STYLES = TEST_KERNELS / "styles"
V5E = get_chip("v5e")


def load(name: str) -> KernelIR:
    return KernelIR.from_file(STYLES / f"{name}.py")


def apply(ir: KernelIR, spec: str) -> KernelIR:
    (p,) = parse_pipeline(spec)
    return p.apply(ir)


@pytest.mark.parametrize("path", sorted(STYLES.glob("*.py")), ids=lambda p: p.stem)
def test_style_kernels_load_and_trace(path) -> None:
    ir = KernelIR.from_file(path)
    assert ir.calls and all(c.grid for c in ir.calls)


def test_entry_reaching_pallas_call_through_a_class_method() -> None:
    # `softmax` builds a RowSoftmax whose __call__ calls pl.pallas_call: the class is a helper, never the entry.
    path = STYLES / "class_softmax.py"
    assert inspect_source(path.read_text(), str(path)).entry == "softmax"


def test_where_reset_of_scratch_state_makes_the_axis_sequential() -> None:
    # `carry = jnp.where(program_id(1) == 0, 0, carry_ref[...])` carries state along axis 1 without any pl.when:
    # "parallel" there would split the carry across megacore TensorCores.
    ir = load("carried_cumsum")
    assert ir.calls[0].body.conditional_axes == (1,)
    assert apply(ir, "dimension-semantics").calls[0].dimension_semantics == ("parallel", "arbitrary")
    # A where on an input read (ragged-edge masking) is not state: only the pl.when axis of the reduction counts.
    assert load("ragged_rowsum").calls[0].body.conditional_axes == (1,)


def test_shared_module_compiler_params_are_edited_at_the_call_site() -> None:
    ir = load("factory_gelu")
    assert ir.calls[0].dimension_semantics == ("parallel", "arbitrary")
    definition = 'PARAMS = pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))'
    sem = apply(ir, "dimension-semantics")
    assert sem.calls[0].dimension_semantics == ("parallel", "parallel")
    assert definition in sem.source and "PARAMS.replace(" in sem.source
    # grid-order must carry the semantics along with the axes (it used to leave a shared constant unpermuted).
    new = apply(ir, "grid-order{call=0,order=1:0}")
    assert new.calls[0].grid == (ir.calls[0].grid[1], ir.calls[0].grid[0])
    assert new.calls[0].dimension_semantics == ("arbitrary", "parallel")
    assert definition in new.source
    (result,) = check_many([new.source], new.path)
    assert result.ok, result.message


def test_accumulate_in_scratch_skips_outputs_that_are_only_written() -> None:
    # The output block is written once from an existing f32 scratch: a second accumulator would only add a copy.
    path = STYLES / "squeezed_bmm.py"
    source = path.read_text().replace("def _bmm_kernel(*refs):", "def _bmm_kernel(x_ref, y_ref, o_ref, acc_ref):")
    source = source.replace("    x_ref, y_ref, o_ref, acc_ref = refs\n", "")
    ir = KernelIR.from_source(source, str(path))
    assert AccumulateInScratchPass.choices(ir, V5E) == ()
    with pytest.raises(PassNotApplicable, match="only writes"):
        AccumulateInScratchPass(call=0, output=0).apply(ir)
    # A kernel that accumulates in its output ref is still offered the rewrite.
    assert AccumulateInScratchPass.choices(load("jit_static_matmul"), V5E) == (AccumulateInScratchPass(0, 0),)


def test_tile_on_a_ragged_cdiv_grid_predicts_ceil_extents_and_stays_correct() -> None:
    # 10000 x 3000 with cdiv grids and a partial last block: sizes that do not divide the array are fine here,
    # and the new extent is ceil(size / block) (79 steps for 128 rows), not old_extent * old / new (80).
    ir = load("ragged_rowsum")
    assert ir.calls[0].grid == (40, 6)
    specs = {p.spec() for p in TilePass.choices(ir, V5E)}
    assert specs, "no tile choices on a ragged cdiv grid"
    new = apply(ir, "tile{call=0,bm=128,bn=1024}")
    assert new.calls[0].grid == (79, 3)
    (res,) = check_many([new.source], str(STYLES / "ragged_rowsum.py"), seeds=(3, 4))
    assert res.ok, res.message


def test_tile_keeps_dividing_sizes_on_a_floor_grid() -> None:
    # The matmul example's grid is M // bm: a size that does not divide the array is never offered there.
    ir = KernelIR.from_file(ROOT / "examples" / "matmul.py")
    assert not any(ragged_axis(ir.calls[0], a) for a in range(len(ir.calls[0].grid)))
    for p in TilePass.choices(ir, V5E):
        new = p.predict(ir)[0]
        for op in new.operands:
            assert all(b is None or n % b == 0 for n, b in zip(op.shape, op.block_shape, strict=True))


def test_tile_on_a_wrapper_padded_array_offers_non_dividing_sizes_and_stays_correct() -> None:
    # The wrapper pads M and N to multiples of BM/BN (1000 x 1100 -> 1024 x 1152): the arrays follow the blocks, so
    # BN=256 (1152 % 256 != 0) is a fine size, and BM=16 pads 1000 rows to 1008 (63 steps), not 1024 / 16 = 64.
    # Halving BM leaves 1024 unchanged (1000 pads to 1024 at 64 too): discovery must still see the padding.
    ir = load("padded_matmul")
    assert ir.calls[0].grid == (8, 9)
    knobs = {k.name: k for k in knobs_of(ir)}
    assert knobs["BM"].padded == ((0, 0), (2, 0)) and knobs["BN"].padded == ((1, 1), (2, 1))
    specs = {p.spec() for p in TilePass.choices(ir, V5E)}
    assert {"tile{call=0,BN=256}", "tile{call=0,BM=256,BN=512}"} <= specs
    wide = apply(ir, "tile{call=0,BM=256,BN=256}")
    assert wide.calls[0].grid == (4, 5) and wide.calls[0].operands[1].shape == (384, 1280)
    thin = apply(ir, "tile{call=0,BM=16}")
    assert thin.calls[0].grid == (63, 9)
    results = check_many([wide.source, thin.source], str(STYLES / "padded_matmul.py"), seeds=(3, 4))
    assert all(r.ok for r in results), [r.message for r in results]
    # A kernel that does not pad has no padded dims (its sizes must keep dividing the array).
    assert not any(k.padded for k in knobs_of(KernelIR.from_file(ROOT / "examples" / "matmul.py")))


WIDE_768 = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM = 128


def _scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0 + 1.0


def scale(x):
    return pl.pallas_call(
        _scale_kernel,
        grid=(x.shape[0] // BM,),
        in_specs=[pl.BlockSpec((BM, 256), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((BM, 256), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def reference(x):
    return x * 2.0 + 1.0


def make_inputs(key, m=768):
    return (jax.random.normal(key, (m, 256), jnp.float32),)
"""


def test_tile_offers_the_whole_axis_and_its_halves_on_a_dim_with_few_power_of_two_divisors(tmp_path) -> None:
    # 768 = 3 x 256: powers of two that divide it stop at 256; the whole axis (768) and its half and quarter are
    # the other sizes that tile it, and a 56-row grid of a CNN, or a 3072-wide MLP, is the same case.
    path = tmp_path / "wide768.py"
    path.write_text(WIDE_768)
    ir = KernelIR.from_file(path)
    specs = {p.spec() for p in TilePass.choices(ir, V5E)}
    assert {"tile{call=0,BM=768}", "tile{call=0,BM=384}", "tile{call=0,BM=192}", "tile{call=0,BM=256}"} <= specs
    whole = apply(ir, "tile{call=0,BM=384}")
    assert whole.calls[0].grid == (2,) and whole.calls[0].operands[0].block_shape == (384, 256)
    (res,) = check_many([whole.source], str(path), seeds=(3, 4))
    assert res.ok, res.message


BIG_ROWS = WIDE_768.replace("BM = 128", "BM = 1024").replace("256", "1024").replace("m=768", "m=4096")


def test_tile_past_the_scoped_vmem_limit_raises_the_limit_in_the_same_move(tmp_path) -> None:
    # (1024, 1024) f32 blocks in and out, double-buffered: 16 MiB, the whole default scoped limit of v5e. Bigger
    # blocks only compile with a higher `vmem_limit_bytes`: tile offers them with the limit (one move), not as
    # a vmem-limit step that gains nothing by itself followed by a tile.
    path = tmp_path / "big_rows.py"
    path.write_text(BIG_ROWS)
    ir = KernelIR.from_file(path)
    assert ir.calls[0].operands[0].block_shape == (1024, 1024) and ir.calls[0].vmem_limit_bytes is None
    specs = {p.spec() for p in TilePass.choices(ir, V5E)}
    assert {"tile{call=0,BM=2048,vmem_mib=64}", "tile{call=0,BM=512}"} <= specs
    assert not any("BM=2048" in s and "vmem_mib" not in s for s in specs)
    new = apply(ir, "tile{call=0,BM=2048,vmem_mib=64}")
    assert new.calls[0].grid == (2,) and new.calls[0].vmem_limit_bytes == 64 * 2**20
    assert "vmem_limit_bytes=64 * 1024 * 1024" in new.source
    (res,) = check_many([new.source], str(path), seeds=(3, 4))
    assert res.ok, res.message
    # Blocks far under the limit: no choice touches it.
    small = tmp_path / "wide768.py"
    small.write_text(WIDE_768)
    assert not any("vmem_mib" in p.spec() for p in TilePass.choices(KernelIR.from_file(small), V5E))
