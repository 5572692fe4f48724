"""Untying a tile knob that one name sets along several axes (`ir/knobs.untie`, `tile{untie=NAME,...}`), and fusing
the matmul it frees (bench fused_09: a 128-tiled matmul whose M, N and K blocks are one `BLOCK`, then a column max)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from conftest import ROOT

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check, check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.ir.knobs import tied, untie
from pallasopt.passes.registry import parse_pipeline
from pallasopt.passes.tile import TilePass, knobs_of

V5E = get_chip("v5e")
BENCH = ROOT / "bench" / "kernels"


def apply(ir: KernelIR, spec: str) -> KernelIR:
    for p in parse_pipeline(spec):
        ir = p.apply(ir)
    return ir


def blocks(ir: KernelIR, call: int = 0) -> list[tuple[int | None, ...]]:
    return [o.block_shape for o in ir.calls[call].operands]


MODULE = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK = 128


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * {scale}


def _helper(BLOCK):  # a local that shadows the constant: not the constant
    return BLOCK


def double(x):
    m, n = x.shape
    return pl.pallas_call(
        _kernel,
        grid=(m // BLOCK, n // BLOCK),
        in_specs=[pl.BlockSpec((BLOCK, BLOCK), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((BLOCK, BLOCK), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
    )(x)


def reference(x):
    return x * 2.0


def make_inputs(key, M=512, N=1024):
    return (jax.random.normal(key, (M, N), jnp.float32),)
"""


def test_a_module_constant_is_untied_into_one_literal_per_read(tmp_path) -> None:
    path = tmp_path / "double.py"
    path.write_text(textwrap.dedent(MODULE.format(scale="2.0")))
    ir = KernelIR.from_file(path)
    (knob,) = knobs_of(ir)
    assert knob.name == "BLOCK" and knob.axes == (0, 1) and tied(knob, knobs_of(ir))
    src = untie(ir.module, knob).code
    assert "BLOCK = 128" in src  # the binding stays
    assert "grid=(m // 128, n // 128)" in src and "pl.BlockSpec((128, 128), lambda i, j: (i, j))" in src
    assert "def _helper(BLOCK):  # a local that shadows the constant: not the constant\n    return BLOCK" in src
    # the sizes of the untied module name one knob per axis; the rewrite leaves the constant alone
    new = apply(ir, "tile{call=0,untie=BLOCK,axis0=256,axis1=512}")
    assert blocks(new) == [(256, 512), (256, 512)] and new.calls[0].grid == (2, 2)
    assert "BLOCK = 128" in new.source and "grid=(m // 256, n // 512)" in new.source
    assert new.recipe[-1] == "tile{call=0,untie=BLOCK,axis0=256,axis1=512}"


def test_a_name_the_kernel_body_reads_is_not_untied(tmp_path) -> None:
    path = tmp_path / "double.py"
    path.write_text(textwrap.dedent(MODULE.format(scale="(2.0 + 0 * BLOCK)")))
    ir = KernelIR.from_file(path)
    (knob,) = knobs_of(ir)
    with pytest.raises(ValueError, match="read in the kernel body '_kernel'"):
        untie(ir.module, knob)
    with pytest.raises(PassNotApplicable, match="kernel body"):
        apply(ir, "tile{call=0,untie=BLOCK,axis0=256}")
    assert not any(p.untie for p in TilePass.choices(ir, V5E))  # tied choices only


def test_untie_declines_a_knob_that_is_not_tied(example_irs) -> None:
    with pytest.raises(PassNotApplicable, match="nothing to untie"):
        apply(example_irs["matmul"], "tile{call=0,untie=bm,bm=256}")


def test_a_parameter_default_is_untied_in_its_function() -> None:
    """fused_14: `def _matmul(x, w, block: int = 128)` sets M, N and K of the matmul."""
    ir = KernelIR.from_file(BENCH / "fused_14_matmul_hardtanh_mean.py")
    knob = next(k for k in knobs_of(ir) if k.call == 0 and k.name == "block")
    src = untie(ir.module, knob).code
    assert "def _matmul(x: jax.Array, w: jax.Array, block: int = 128)" in src
    assert "grid=(M // 128, N // 128, K // 128)" in src
    assert "def _hardtanh_mean(h: jax.Array, block: int = 256)" in src and "grid=(M // block, N // block)" in src


@pytest.fixture(scope="module")
def fused_09() -> KernelIR:
    return KernelIR.from_file(BENCH / "fused_09_matmul_colmax.py")


def test_choices_offer_each_axis_its_own_size(fused_09: KernelIR) -> None:
    choices = TilePass.choices(fused_09, V5E)
    untied = [p for p in choices if p.untie]
    assert untied and all(p.untie == "BLOCK" and p.call == 0 for p in untied)
    # none of them is a tied choice spelled another way: the three axes never all move by one ratio
    for p in untied:
        sizes = dict(p.sizes)
        ratios = {sizes.get(f"axis{a}", 128) / 128 for a in range(3)}
        assert len(ratios) > 1, p.spec()
    # and the model ranks an untied one first: the matmul's best blocks are not square
    assert choices[0].untie == "BLOCK"


def test_untie_then_fuse_checks_in_interpret_mode(fused_09: KernelIR) -> None:
    tiled = apply(fused_09, "tile{call=0,untie=BLOCK,axis0=1024,axis1=1024,axis2=512}")
    assert blocks(tiled) == [(1024, 512), (512, 1024), (1024, 1024)]
    assert blocks(tiled, 1) == blocks(fused_09, 1)  # the column max keeps its own (untied) blocks
    fused = apply(tiled, "fuse{producer=0,retile=true}")
    assert len(fused.calls) == 1
    (result,) = check_many([fused.source], str(fused.path))
    assert result.ok, result.message


@pytest.mark.slow
def test_a_whole_k_producer_fuses_and_stays_right_where_its_axes_have_more_steps(fused_09: KernelIR) -> None:
    """With whole-N and whole-K blocks the matmul's N and K axes have one step at the default size. Their index-map
    rows are fitted by probing index 1 anyway (`trace._fit_affine`), so they say `(i, j)` / `(k, j)` as written and
    the fused kernel's grid extents and maps walk N and K at a size where they have two steps each (the oracle's
    dims never exceed the defaults: this checks above them)."""
    whole = apply(fused_09, "tile{call=0,untie=BLOCK,axis1=2048,axis2=1024}")
    assert whole.calls[0].grid[1:] == (1, 1)
    x, w = whole.calls[0].inputs
    assert x.index_map.affine == ((1, 0, 0, 0), (0, 0, 1, 0)) and w.index_map.affine == ((0, 0, 1, 0), (0, 1, 0, 0))
    fused = apply(whole, "fuse{producer=0,retile=true}")
    assert len(fused.calls) == 1
    for dims in ({}, {"M": 256, "K": 2048, "N": 4096}):
        result = check(fused.source, str(fused_09.path), dims=dims)
        assert result.ok, (dims, result.message)


def test_untie_keeps_the_tree_otherwise_intact(fused_09: KernelIR) -> None:
    knob = next(k for k in knobs_of(fused_09) if k.call == 0)
    before = fused_09.module
    after = untie(before, knob)
    assert isinstance(after, cst.Module) and after is not before
    changed = [(a, b) for a, b in zip(before.code.splitlines(), after.code.splitlines(), strict=True) if a != b]
    assert changed and all("BLOCK" in a and "BLOCK" not in b for a, b in changed)


def test_check_dims_never_make_a_block_overhang_its_array(tmp_path) -> None:
    """A grid extent written as a constant traces at any size: stepping N down under the 1024-wide block would read
    past the array (padding, NaN), a check at dims the kernel was never meant for. The derived dims keep N."""
    from pallasopt.harness.check_dims import derive_check_dims
    from pallasopt.workload import load_source

    text = textwrap.dedent(MODULE.format(scale="2.0"))
    text = text.replace("grid=(m // BLOCK, n // BLOCK)", "grid=(m // BLOCK, 1)").replace(
        "pl.BlockSpec((BLOCK, BLOCK)", "pl.BlockSpec((BLOCK, 1024)"
    )
    path = tmp_path / "whole_rows.py"
    path.write_text(text)
    dims = derive_check_dims(load_source(text, str(path)))
    assert dims["N"] == 1024 and dims["M"] < 512, dims
