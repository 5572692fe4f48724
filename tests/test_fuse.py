"""fuse: producer-consumer fusion of pallas_calls (before/after, declines, every choice checked in interpret mode)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.fuse import FusePass
from pallasopt.passes.registry import parse_pipeline

KERNELS = Path(__file__).parent / "kernels" / "fuse"
V5E = get_chip("v5e")


def load(name: str) -> KernelIR:
    return KernelIR.from_file(KERNELS / f"{name}.py")


def run(ir: KernelIR, spec: str) -> KernelIR:
    for p in parse_pipeline(spec):
        ir = p.apply(ir)
    return ir


def test_spec_round_trips() -> None:
    (p,) = parse_pipeline("fuse{producer=1,retile=true}")
    assert p == FusePass(producer=1, retile=True) and p.spec() == "fuse{producer=1,retile=true}"
    assert FusePass(producer=1).spec() == "fuse{producer=1,retile=false}"


def test_reduction_consumer_runs_on_the_finished_block() -> None:
    ir = load("matmul_colmax")
    assert FusePass.choices(ir, V5E) == (FusePass(producer=0),)
    new = run(ir, "fuse{producer=0}")
    (fused,) = new.calls
    # The consumer's order (columns, rows) outside, the matmul's K innermost: the (1, N) max is carried in the
    # output block across rows and K, and the product only ever sits in a VMEM scratch.
    assert fused.grid == (2, 4, 2)
    assert [s.shape for s in fused.scratch] == [(128, 128)]
    assert [(o.shape, o.block_shape) for o in fused.outputs] == [((1, 256), (1, 128))]
    src = new.source
    assert "h = jax.eval_shape(lambda: _matmul(x, w))" in src  # `M, N = h.shape` still reads it
    assert "grid=(N // BLOCK, M // ROWS, pl.cdiv(x.shape[1], BLOCK))," in src
    assert "@pl.when(pl.program_id(2) == pl.num_programs(2) - 1)" in src
    assert "    _pid1 = pl.program_id(1)" in src  # hoisted out of the nested pl.when (interpret mode needs it)
    assert "jnp.max(o_ref[...], axis=0, keepdims=True)" in src
    assert ")(x, w)" in src.split("def matmul_colmax")[1]


@pytest.mark.slow
def test_an_entry_under_jax_jit_fuses_the_same() -> None:
    """`@jax.jit` on the entry traces both calls inside a `jit` equation: the dataflow is read there."""
    source = (KERNELS / "matmul_colmax.py").read_text().replace("def matmul_colmax(", "@jax.jit\ndef matmul_colmax(")
    ir = KernelIR.from_source(source, str(KERNELS / "matmul_colmax.py"))
    assert FusePass.choices(ir, V5E) == (FusePass(producer=0),)
    new = run(ir, "fuse{producer=0}")
    assert len(new.calls) == 1 and "@jax.jit" in new.source
    (result,) = check_many([new.source], str(KERNELS / "matmul_colmax.py"))
    assert result.ok, result.message


def test_ragged_grid_and_a_second_input() -> None:
    new = run(load("ragged_rowsum"), "fuse{producer=0}")
    (fused,) = new.calls
    assert fused.grid == (4, 2) and len(fused.inputs) == 2  # x and the residual r; y never reaches HBM
    assert "y = pl.pallas_call" not in new.source  # nothing else read y: the statement is gone


def test_consumer_of_two_producers_fuses_both() -> None:
    ir = load("two_producers")
    assert len(ir.calls) == 3
    once = run(ir, "fuse{producer=1}")
    assert len(once.calls) == 2
    both = run(once, "fuse{producer=0}")
    (fused,) = both.calls
    # The consumer is elementwise, so it takes the producers' (64, 128) blocks instead of its own (128, 256).
    assert fused.grid == (4, 2) and all(o.block_shape == (64, 128) for o in fused.operands)


def test_a_norm_then_its_scaling_fuse_over_whole_rows() -> None:
    """The consumer walks the columns the producer reduces (it needs every row sum before its first block): the fused
    call takes one step over whole rows, and reads x once for both bodies."""
    ir = load("rms_rows")
    assert ir.calls[0].grid == (4, 3) and ir.calls[1].grid == (4, 3)
    assert FusePass.choices(ir, V5E) == (FusePass(producer=0),)
    new = FusePass(producer=0).apply(ir)
    (fused,) = new.calls
    assert fused.grid == (4, 1)
    assert [(o.name, o.block_shape) for o in fused.operands] == [
        ("in0", (64, 384)),
        ("in1", (1, 384)),
        ("out0", (64, 384)),
    ]
    src = new.source
    assert "grid=(pl.cdiv(M, ROWS), 1)," in src  # one step at any N: the blocks read x's width
    assert "pl.BlockSpec((ROWS, x.shape[1]), lambda g0, g1: (g0, g1))" in src
    assert "def _fused_sumsq_scale(x_ref, g_ref, o_ref, s_ref, *, n):" in src  # x_ref serves both bodies
    assert ")(x, g.reshape(1, N))" in src


def test_whole_columns_when_the_walked_axis_is_the_consumers_first() -> None:
    """Column sums, then the columns centred: the axis taken whole is the consumer's axis 0 (its rows), and the
    fused blocks span the rows (`x.shape[0]`); a map walking that axis backwards declines (`False == 0` in Python
    must not read as axis 0)."""
    path = KERNELS / "col_center.py"
    new = FusePass(producer=0).apply(load("col_center"))
    (fused,) = new.calls
    assert fused.grid == (1, 2) and [o.block_shape for o in fused.operands] == [(256, 128), (256, 128)]
    assert "grid=(1, N // TN)," in new.source and "pl.BlockSpec((x.shape[0], TN)" in new.source
    text = path.read_text().replace(
        "out_specs=pl.BlockSpec((TM, TN), lambda i, j: (i, j)),",
        "out_specs=pl.BlockSpec((TM, TN), lambda i, j: (M // TM - 1 - i, j)),",
    )
    assert "M // TM - 1 - i" in text
    with pytest.raises(PassNotApplicable, match="out0 block dim 0 is not indexed by that axis alone"):
        FusePass(producer=0).apply(KernelIR.from_source(text, str(path)))


def test_whole_rows_past_the_default_vmem_raise_the_limit() -> None:
    """Whole rows grow with the array: where the fused blocks overflow the default scoped VMEM (16 MiB on a v5e),
    the choice carries the limit that holds them, and the fused call is given it."""
    path = KERNELS / "rms_rows.py"
    text = path.read_text().replace("M=200, N=384", "M=200, N=65536")
    ir = KernelIR.from_source(text, str(path))
    (choice,) = FusePass.choices(ir, V5E)
    assert choice == FusePass(producer=0, vmem_mib=64) and choice.spec() == "fuse{producer=0,retile=false,vmem_mib=64}"
    (fused,) = choice.apply(ir).calls
    assert fused.vmem_limit_bytes == 64 * 2**20
    assert FusePass.choices(load("rms_rows"), V5E) == (FusePass(producer=0),)  # 384 columns fit the default


def test_an_array_rebound_between_the_calls_is_read_twice() -> None:
    path = KERNELS / "rms_rows.py"
    text = path.read_text().replace(")(x)\n    return", ")(x)\n    x = -x\n    return")
    assert "x = -x" in text
    (fused,) = FusePass(producer=0).apply(KernelIR.from_source(text, str(path))).calls
    assert [o.block_shape for o in fused.inputs] == [(64, 384), (64, 384), (1, 384)]


def test_whole_rows_decline_a_reversed_walk() -> None:
    path = KERNELS / "rms_rows.py"
    text = path.read_text().replace("lambda i, j: (0, j)", "lambda i, j: (0, 2 - j)")
    with pytest.raises(
        PassNotApplicable, match=r"consumer's grid axis 1 .* in2 block dim 1 is not indexed by that axis"
    ):
        FusePass(producer=0).apply(KernelIR.from_source(text, str(path)))


@pytest.mark.parametrize(
    ("name", "producer", "why"),
    [
        ("declines", 0, "also a result"),
        ("declines", 2, "several outputs"),
        ("matmul_colmax", 1, "no pallas_call #1 followed by another"),
    ],
)
def test_declines(name: str, producer: int, why: str) -> None:
    with pytest.raises(PassNotApplicable, match=why):
        FusePass(producer=producer).apply(load(name))


def test_retile_aligns_a_reduction_consumer_first() -> None:
    path = KERNELS / "matmul_colmax.py"
    ir = KernelIR.from_source(path.read_text().replace("ROWS = 128", "ROWS = 256"), str(path))
    assert ir.calls[1].inputs[0].block_shape == (256, 128)
    with pytest.raises(PassNotApplicable, match=r"not elementwise .*tile them alike first"):
        FusePass(producer=0).apply(ir)  # a column max is not elementwise: its blocks cannot just change
    assert FusePass.choices(ir, V5E) == (FusePass(producer=0, retile=True),)
    new = FusePass(producer=0, retile=True).apply(ir)
    assert "ROWS = 128" in new.source and len(new.calls) == 1  # the tile pass re-tiled the consumer, then fused
    assert new.recipe == ("fuse{producer=0,retile=true}",)


def test_elementwise_consumer_through_a_reshape_to_rows() -> None:
    """The consumer reads the producer's (B, S, N) output as (B * S, N) rows with per-column (1, N) rows: it runs on
    the producer's blocks, its rows follow their last dim, and the fused result is reshaped back to rows."""
    ir = load("reshape_rows")
    assert FusePass.choices(ir, V5E) == (FusePass(producer=0),)
    new = FusePass(producer=0).apply(ir)
    (fused,) = new.calls
    assert fused.grid == (2, 4)
    assert fused.outputs[0].shape == (2, 256, 256) and fused.outputs[0].dtype == "bfloat16"
    assert [o.block_shape for o in fused.inputs[2:]] == [(1, 256), (1, 256)]
    assert ".reshape((B * S, N))" in new.source and "*rows" in new.source
    assert "pltpu.VMEM((TS, N), jnp.float32)" in new.source  # written in names: right at any size


@pytest.mark.parametrize(
    ("edits", "why"),
    [
        ({"jnp.reshape(h, (B * S, N))": "jnp.reshape(h, (B * S * 2, N // 2))"}, r"reshaped \(2, 256, 256\)"),
        (
            {
                "(h_ref, s_ref, b_ref, o_ref)": "(h_ref, s_ref, b_ref, r_ref, o_ref)",
                "+ b_ref[...]": "+ b_ref[...] + r_ref[...]",
                "vec, vec]": "vec, vec, pl.BlockSpec((TM, TN), lambda i, j: (i, j))]",
                "*rows)": "*rows, jnp.reshape(x[..., :1] * 0 + 1, (B * S, 1)) * jnp.ones((1, N)))",
            },
            "in3 are read in rows too",
        ),
    ],
)
def test_reshape_declines(edits: dict[str, str], why: str) -> None:
    path = KERNELS / "reshape_rows.py"
    text = path.read_text()
    for old, new in edits.items():
        assert old in text
        text = text.replace(old, new)
    with pytest.raises(PassNotApplicable, match=why):
        FusePass(producer=0).apply(KernelIR.from_source(text, str(path)))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "recipes"),
    [
        ("matmul_colmax", ["fuse{producer=0}", "tile{call=1,ROWS=256},fuse{producer=0,retile=true}"]),
        ("ragged_rowsum", ["fuse{producer=0}"]),
        ("two_producers", ["fuse{producer=1}", "fuse{producer=1},fuse{producer=0}"]),
        ("helpers_with_keywords", ["fuse{producer=0}"]),
        ("reshape_rows", ["fuse{producer=0}"]),
        ("rms_rows", ["fuse{producer=0}", "tile{call=0,ROWS=128},fuse{producer=0}"]),
        ("col_center", ["fuse{producer=0}"]),
    ],
)
def test_fused_kernels_match_the_reference(name: str, recipes: list[str]) -> None:
    """Every fusion (and every choice fuse offers) re-traces to one call fewer and passes the oracle."""
    ir = load(name)
    results = [run(ir, r) for r in recipes]
    results += [c.apply(ir) for c in FusePass.choices(ir, V5E)]
    results = list({r.source: r for r in results}.values())  # a choice may repeat a recipe: check it once
    for new in results:
        assert len(new.calls) < len(ir.calls)
    checked = check_many([r.source for r in results], str(KERNELS / f"{name}.py"))
    bad = [(r.recipe, c.message) for r, c in zip(results, checked, strict=True) if not c.ok]
    assert not bad, bad


def test_fuse_after_online_softmax_keeps_the_producers_blocks_in_names() -> None:
    """The producer's blocks `(tm, K)` read the wrapper's names: the fused call (in the same function) keeps them,
    so it is right at CHECK_DIMS too (written as the traced (128, 512) it failed the oracle there)."""
    ir = load("matmul_lse_local_blocks")
    new = run(ir, "online-softmax{call=1,chunk=128},fuse{producer=0}")
    assert len(new.calls) == 1
    assert "in_specs=[pl.BlockSpec((tm, K), lambda g0, g1: (g0, 0)), pl.BlockSpec((K, tn)," in new.source
    assert "pltpu.VMEM((tm, tn), jnp.float32)" in new.source
    (checked,) = check_many([new.source], str(KERNELS / "matmul_lse_local_blocks.py"), seeds=(0, 1))
    assert checked.ok, checked.message


def test_kernels_bound_by_partial_in_helpers_that_take_the_intermediate() -> None:
    """fused_14's style (and most LLM-written kernels'): each pallas_call in its own helper, kernels bound keywords
    with functools.partial, the consumer's helper taking the intermediate as a parameter. fuse used to decline
    ("a kernel is passed through functools.partial", then "cannot find where h is assigned"). The keywords stay
    keyword-only parameters of the fused kernel (the consumer's `scale` renamed: the producer has one), the helper
    gains the producer's operands as keywords and keeps the intermediate's shape, which it still reads."""
    new = run(load("helpers_with_keywords"), "fuse{producer=0}")
    (fused,) = new.calls
    assert fused.grid == (2, 4, 2) and [s.shape for s in fused.scratch] == [(128, 128), (128, 128)]
    src = new.source
    assert "def _fused_matmul_mean_square(x_ref, w_ref, _o_ref, acc_ref, o_ref, *, scale, steps, _scale=1.0):" in src
    assert "o_ref[...] = acc_ref[...] * scale" in src and "_o_ref[...] = _o_ref[...] * _scale" in src
    assert "functools.partial(_fused_matmul_mean_square, scale=SCALE, steps=N // cols, _scale=1.0 / N)," in src
    assert "def _mean_square(h, rows=128, cols=128, *, x, w):" in src
    assert "    h = jax.eval_shape(lambda: _matmul(x, w))\n    return _mean_square(h, x=x, w=w)" in src
    assert "pltpu.VMEM(((128), (128)), jnp.float32)" in src  # the helper's defaults tm, tn: its call passes none


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (("scale=SCALE)", "scale=K / 512)"), "the producer's kernel keyword K / 512 reads names local to its function"),
        (("def reference(", "def _also(y):\n    return _mean_square(y)\n\n\ndef reference("), "called 2 times"),
        (
            ("    h = _matmul(x, w)\n", "    h = _matmul(x, w, 128)\n"),
            r"scratch pltpu.VMEM\(\(tm, \(128\)\).* reads names local",
        ),
    ],
)
def test_helper_declines(edit: tuple[str, str], why: str) -> None:
    path = KERNELS / "helpers_with_keywords.py"
    text = path.read_text()
    assert edit[0] in text
    ir = KernelIR.from_source(text.replace(*edit), str(path))
    with pytest.raises(PassNotApplicable, match=why):
        FusePass(producer=0).apply(ir)
