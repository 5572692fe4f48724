"""reshape-in-kernel: a wrapper reshape that moves TPU's minor dim becomes a VMEM reshape inside the kernel."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from pallasopt.analysis import analyze_ir
from pallasopt.cost_model.compiler import libtpu_available
from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.reshape_in_kernel import ReshapeInKernelPass, reshape_groups
from pallasopt.search.tiers import Tiers, model_tier

HERE = Path(__file__).parent / "kernels" / "reshape"
PAIRS = HERE / "pair_sum.py"
WINDOWS = HERE / "window_stats.py"
MAXPOOL = Path(__file__).parents[1] / "bench" / "kernels" / "fused_29_maxpool2x2.py"
V5E = get_chip("v5e")


def _function(source: str, name: str) -> str:
    module = cst.parse_module(source)
    (fn,) = [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name]
    return module.code_for_node(fn)


def test_reshape_groups() -> None:
    r = range
    assert reshape_groups((64, 112, 112, 128), (64, 56, 2, 56, 256)) == (
        (r(0, 1), r(0, 1)),
        (r(1, 2), r(1, 3)),
        (r(2, 4), r(3, 5)),
    )
    assert reshape_groups((4, 6), (4, 1, 6, 1)) == ((r(0, 1), r(0, 2)), (r(1, 2), r(2, 4)))
    assert reshape_groups((1, 4, 6), (24,)) == ((r(0, 3), r(0, 1)),)
    assert reshape_groups((4, 6), (5, 5)) is None


def test_rows_of_merged_dims_become_rows_of_the_source() -> None:
    """(B, T, D) -> (B, T/2, 2D) with the batch squeezed: the block of tb rows of 2D lanes is 2tb rows of x; the
    scale's reshape keeps the minor dim and is left alone."""
    ir = KernelIR.from_file(PAIRS)
    assert ReshapeInKernelPass.choices(ir, V5E) == (ReshapeInKernelPass(call=0, operand=0),)
    new = ReshapeInKernelPass(call=0, operand=0).apply(ir)
    x = new.calls[0].inputs[0]
    assert (x.shape, x.block_shape) == ((4, 128, 64), (None, 32, 64))
    assert new.calls[0].grid == ir.calls[0].grid and len(new.calls[0].scratch) == 1
    wrapper = _function(new.source, "pair_sum")
    assert "jnp.reshape" not in wrapper and ")(x, s.reshape(1, D))" in wrapper
    assert "pl.BlockSpec((None, ((tb) * (2 * D)) // (x.shape[2]), x.shape[2]), lambda b, t: (b, t, 0))" in wrapper
    assert "scratch_shapes=[pltpu.VMEM((tb, 2 * D), x.dtype)]" in wrapper
    kernel = _function(new.source, "_pair_sum_kernel")
    assert "def _pair_sum_kernel(x_ref_flat, s_ref, o_ref, x_ref):" in kernel
    assert "x_ref[...] = x_ref_flat[...].reshape(x_ref.shape)" in kernel  # f32: no round trip through 32 bits


def test_an_entry_under_jax_jit_is_rewritten_the_same() -> None:
    """Entries decorated with `@jax.jit` trace the call inside a `jit` equation: the reshape is looked up there."""
    source = PAIRS.read_text().replace("def pair_sum(", "@jax.jit\ndef pair_sum(")
    ir = KernelIR.from_source(source, str(PAIRS))
    assert ReshapeInKernelPass.choices(ir, V5E) == (ReshapeInKernelPass(call=0, operand=0),)
    new = ReshapeInKernelPass(call=0, operand=0).apply(ir)
    assert new.calls[0].inputs[0].shape == (4, 128, 64)
    assert "@jax.jit" in new.source and "jnp.reshape" not in _function(new.source, "pair_sum")


def test_a_bf16_block_is_reshaped_through_f32_and_the_index_map_keeps_its_order() -> None:
    ir = KernelIR.from_file(WINDOWS)
    new = ReshapeInKernelPass(call=0, operand=0).apply(ir)
    x = new.calls[0].inputs[0]
    assert (x.shape, x.block_shape) == ((2, 256, 128), (1, 32, 128))
    assert x.index_map.block_index((3, 1)) == (1, 3, 0)  # grid (t, n) -> (n, t, 0), as before
    kernel = _function(new.source, "_window_kernel")
    assert "x_ref[...] = x_ref_flat[...].astype(jnp.float32).reshape(x_ref.shape).astype(x_ref.dtype)" in kernel


def test_the_model_sees_the_copy_leave_hbm() -> None:
    ir = KernelIR.from_file(WINDOWS)
    new = ReshapeInKernelPass(call=0, operand=0).apply(ir)
    before, after = model_tier(ir, V5E), model_tier(new, V5E)
    assert before.data["wrapper_s"] > 0 and after.data["wrapper_s"] == 0
    assert after.time_s < before.time_s


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("xr = jnp.reshape(x, (B, T // 2, 2 * D))", "xr = jnp.reshape(x, (B, T // 2, 2 * D)) * 2.0", "not made by"),
        (  # the lanes are split over two blocks: a block is half of each row pair, not a box of x
            "pl.BlockSpec((None, tb, 2 * D), lambda b, t: (b, t, 0))",
            "pl.BlockSpec((None, tb, D), lambda b, t: (b, t, 0))",  # the body's x[:, D:] is then empty
            "does not take every reshaped dim after the first whole",
        ),
        ("    o_ref[...] = (x", "    x_ref[0, 0] = 0.0\n    o_ref[...] = (x", "stores to"),
        ("    )(xr, s.reshape(1, D))", "    )(xr, s.reshape(1, D)) + xr[:, :, :D]", "read elsewhere"),
        ("lambda b, t: (b, t, 0)),\n            pl", "_imap),\n            pl", "not a lambda"),
    ],
)
def test_declines(old: str, new: str, why: str) -> None:
    source = PAIRS.read_text()
    assert old in source
    source = source.replace(old, new)
    source = source.replace("(x[:, :D] + x[:, D:])", "(x + x)") if "(None, tb, D)" in new else source
    if "_imap" in new:
        source = source.replace("def pair_sum(", "def _imap(b, t):\n    return (b, t, 0)\n\n\ndef pair_sum(")
    ir = KernelIR.from_source(source, str(PAIRS))
    assert ReshapeInKernelPass.choices(ir, V5E) == ()
    with pytest.raises(PassNotApplicable, match=why):
        ReshapeInKernelPass(call=0, operand=0).apply(ir)


def test_a_reshape_that_keeps_the_minor_dim_is_declined() -> None:
    """(B, T, D) -> (B, T/2, 2, D) splits a leading dim: no copy on TPU, nothing to gain."""
    source = PAIRS.read_text().replace("jnp.reshape(x, (B, T // 2, 2 * D))", "jnp.reshape(x, (B, T // 2, 2, D))")
    source = source.replace("(None, tb, 2 * D), lambda b, t: (b, t, 0)", "(None, tb, 2, D), lambda b, t: (b, t, 0, 0)")
    source = source.replace("(x[:, :D] + x[:, D:])", "(x[:, 0] + x[:, 1])")
    ir = KernelIR.from_source(source, str(PAIRS))
    assert ReshapeInKernelPass.choices(ir, V5E) == ()
    with pytest.raises(PassNotApplicable, match="keeps the minor dim"):
        ReshapeInKernelPass(call=0, operand=0).apply(ir)


@pytest.mark.slow
def test_every_choice_matches_the_reference() -> None:
    for path in (PAIRS, WINDOWS, MAXPOOL):
        ir = KernelIR.from_file(path)
        sources = [c.apply(ir).source for c in ReshapeInKernelPass.choices(ir, V5E)]
        results = check_many(sources, str(path))
        assert sources and all(r.ok for r in results), (path, [r.message for r in results])


@pytest.mark.tpu_compiler
@pytest.mark.skipif(not libtpu_available(), reason="needs libtpu (extra 'tpu')")
def test_the_compiler_profiles_the_bf16_reshape_and_charges_the_relayout() -> None:
    """libtpu's static profile aborts on a packed-bf16 relayout in a kernel; through f32 it gives an estimate. On
    fused_29 (HBM-bound, 205 MB input) the kernel's relayout is cheaper than the wrapper's copy; on the small
    window fixture (a 4-row to lanes relayout, 16 steps) it costs more than the copy it saves, and the compiler
    tier says so (the model does not charge in-kernel relayouts: the search's compile tier decides)."""
    for path, faster in ((MAXPOOL, True), (WINDOWS, False)):
        ir = KernelIR.from_file(path)
        new = ReshapeInKernelPass(call=0, operand=0).apply(ir)
        before, after = Tiers(V5E).compiler(ir), Tiers(V5E).compiler(new)
        assert before is not None and after is not None
        assert before.time_s is not None and after.time_s is not None, after.message
        assert (after.time_s < before.time_s) == faster, (path.name, before.time_s, after.time_s)


@pytest.mark.tpu_compiler
@pytest.mark.skipif(not libtpu_available(), reason="needs libtpu (extra 'tpu')")
def test_analyze_shows_xla_as_the_bench_estimates_it() -> None:
    _, compiled = analyze_ir(KernelIR.from_file(WINDOWS), "v5e", compile=True)
    assert compiled is not None
    ref = compiled["reference (XLA)"]
    assert ref["ok"] and ref["time_s"] > 0, ref
    assert "floor" in ref["method"] or "static schedule" in ref["method"], ref
