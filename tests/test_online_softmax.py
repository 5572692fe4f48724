"""online-softmax: the jaxpr form matcher, before/after sources, declines with reasons, and the rewritten kernels
checked numerically in interpret mode on fresh inputs (the oracle)."""

from __future__ import annotations

import difflib

import pytest
from conftest import ROOT, TEST_KERNELS

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.online_softmax import OnlineSoftmaxPass, _form
from pallasopt.passes.registry import parse_pipeline

BENCH = ROOT / "bench" / "kernels"
V5E = get_chip("v5e")


def added(before: str, after: str) -> list[str]:
    return [ln[2:].strip() for ln in difflib.ndiff(before.splitlines(), after.splitlines()) if ln.startswith("+ ")]


def apply(ir: KernelIR, spec: str) -> KernelIR:
    (p,) = parse_pipeline(spec)
    return p.apply(ir)


def declines(ir: KernelIR, spec: str) -> str:
    with pytest.raises(PassNotApplicable) as e:
        apply(ir, spec)
    return e.value.reason


@pytest.fixture(scope="module")
def lse_ir() -> KernelIR:
    return KernelIR.from_file(BENCH / "fused_12_matmul_logsumexp.py")


def test_form_of_the_logsumexp_row_kernel(lse_ir: KernelIR) -> None:
    form = _form(lse_ir, lse_ir.calls[1])
    assert (form.kind, form.output, form.chunked, form.rows, form.row_len) == ("logsumexp", 0, ((0, 1),), 128, 4096)
    assert "no row max" in declines(lse_ir, "online-softmax{call=0,chunk=512}")  # the matmul call


def test_logsumexp_before_after(lse_ir: KernelIR) -> None:
    choices = [p.spec() for p in OnlineSoftmaxPass.choices(lse_ir, V5E)]
    # lane-aligned chunks that split the row at the traced dims (N=4096) and at CHECK_DIMS (N=512)
    assert choices == [f"online-softmax{{call=1,chunk={c}}}" for c in (128, 256, 512)]
    new = apply(lse_ir, "online-softmax{call=1,chunk=512}")
    got = added(lse_ir.source, new.source)
    for line in (
        "SOFTMAX_CHUNK = 512  # row elements per step of the online softmax",
        "def _lse_kernel(h_ref, o_ref, m_scratch, l_scratch):",
        "@pl.when(chunk_id == 0)",
        "m_new = jnp.maximum(m_prev, jnp.max(s_chunk, axis=1, keepdims=True))",
        "l_scratch[...] = alpha * l_scratch[...] + jnp.sum(p, axis=1, keepdims=True)",
        "@pl.when(chunk_id == pl.num_programs(1) - 1)",
        "o_ref[...] = (m_scratch[...] + jnp.log(l_scratch[...])).reshape(o_ref.shape).astype(o_ref.dtype)",
        "grid=(M // rows, N // SOFTMAX_CHUNK),",
        "in_specs=[pl.BlockSpec((rows, SOFTMAX_CHUNK), lambda i, c: (i, c))],",
        "out_specs=pl.BlockSpec((rows, 1), lambda i, c: (i, 0)),",
        "scratch_shapes=[pltpu.VMEM((rows, 1), jnp.float32), pltpu.VMEM((rows, 1), jnp.float32)],",
    ):
        assert line in got, line
    call = new.calls[1]
    assert call.grid == (64, 8) and call.inputs[0].block_shape == (128, 512)
    assert call.revisited_axes() == (1,)  # the chunk axis is a reduction the output stays fixed along
    assert [s.shape for s in call.scratch] == [(128, 1), (128, 1)]
    assert new.recipe == ("online-softmax{call=1,chunk=512}",)


def test_attention_before_after() -> None:
    ir = KernelIR.from_file(TEST_KERNELS / "whole_key_attention.py")
    form = _form(ir, ir.calls[0])
    assert (form.kind, form.chunked, form.value_input, form.dot_dtypes) == (
        "attention",
        ((1, 0), (2, 0)),
        2,
        ("bfloat16", "bfloat16"),
    )
    new = apply(ir, "online-softmax{chunk=256}")
    got = added(ir.source, new.source)
    for line in (
        "acc_scratch[...] = alpha * acc_scratch[...] + jnp.dot(",
        "_p.astype(jnp.bfloat16), v_ref[...].astype(jnp.bfloat16), preferred_element_type=jnp.float32",
        "o_ref[...] = (acc_scratch[...] / l_scratch[...]).reshape(o_ref.shape).astype(o_ref.dtype)",
        "grid=(BH, S // BLOCK_Q, S // SOFTMAX_CHUNK),",
        "pl.BlockSpec((None, SOFTMAX_CHUNK, D), lambda b, i, c: (b, c, 0)),",
        'compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),',
    ):
        assert line in got, line
    call = new.calls[0]
    assert call.grid == (16, 64, 32) and call.dimension_semantics == ("parallel", "parallel", "arbitrary")
    assert call.inputs[1].index_map.block_index((3, 5, 7)) == (3, 7, 0)  # K walks the key chunks
    assert [s.shape for s in call.scratch] == [(128, 1), (128, 1), (128, 128)]


def test_declines_with_reasons(lse_ir: KernelIR) -> None:
    assert "not a positive multiple of 128" in declines(lse_ir, "online-softmax{call=1,chunk=100}")
    assert "does not split the row of 4096" in declines(lse_ir, "online-softmax{call=1,chunk=384}")
    reasons = {
        "fused_23_softmax_vocab": "a whole-row softmax output",
        "llm_linear_cross_entropy": "already keeps state",  # it is online already
        "llm_gqa_attention": "['scan']",  # an in-kernel fori_loop over key chunks
    }
    for stem, want in reasons.items():
        ir = KernelIR.from_file(BENCH / f"{stem}.py")
        assert not OnlineSoftmaxPass.choices(ir, V5E), stem
        assert want in declines(ir, "online-softmax{chunk=128}"), stem


MASKED = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _kernel(x_ref, o_ref):
    s = x_ref[...]
    cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
    s = jnp.where(cols < 200, s, -1e30)
    m = jnp.max(s, axis=1, keepdims=True)
    o_ref[...] = m + jnp.log(jnp.sum(jnp.exp(s - m), axis=1, keepdims=True)) + EXTRA


def lse(x):
    return pl.pallas_call(
        _kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 1), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((x.shape[0], 1), jnp.float32),
    )(x)


def reference(x):
    return jax.nn.logsumexp(x, axis=1, keepdims=True)


def make_inputs(key, M=16, N=1024):
    return (jax.random.normal(key, (M, N), jnp.float32),)
"""


def test_declines_what_chunking_would_change() -> None:
    masked = KernelIR.from_source(MASKED.replace(" + EXTRA", ""), "masked.py")
    assert "column positions (iota)" in declines(masked, "online-softmax{chunk=256}")
    plain = MASKED.replace("    cols = jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)\n", "")
    plain = plain.replace("    s = jnp.where(cols < 200, s, -1e30)\n", "")
    extra = KernelIR.from_source(plain.replace("EXTRA", "jnp.sum(s)"), "extra.py")
    assert "neither max + log(sum(exp(s - max)))" in declines(extra, "online-softmax{chunk=256}")
    ok = KernelIR.from_source(plain.replace(" + EXTRA", ""), "plain.py")
    assert apply(ok, "online-softmax{chunk=256}").calls[0].grid == (2, 4)


@pytest.mark.slow
def test_every_vocab_choice_matches_the_reference() -> None:
    """The 256k-vocabulary test kernel (CHECK_DIMS: V=1024): every chunk the pass offers, on the oracle's seeds.
    The tile pass retunes the chunk constant from there (the SOFTMAX_CHUNK knob)."""
    path = TEST_KERNELS / "vocab_logsumexp.py"
    ir = KernelIR.from_file(path)
    choices = OnlineSoftmaxPass.choices(ir, V5E)
    assert [p.chunk for p in choices] == [128, 256, 512, 1024]  # type: ignore[attr-defined]
    new = [p.apply(ir) for p in choices]
    assert new[0].calls[0].grid == (64, 2048) and new[0].calls[0].inputs[0].block_shape == (16, 128)
    results = check_many([n.source for n in new], str(path))
    bad = [(p.spec(), r.status, r.message) for p, r in zip(choices, results, strict=True) if not r.ok]
    assert not bad, bad


@pytest.mark.slow
def test_attention_rewrite_matches_the_reference() -> None:
    """The smallest chunk (4 key chunks per row at CHECK_DIMS) on the oracle's seeds. The attention form's other
    choices are checked on examples/attention.py by test_passes.py::test_every_choice_on_every_example."""
    path = TEST_KERNELS / "whole_key_attention.py"
    ir = KernelIR.from_file(path)
    (r,) = check_many([apply(ir, "online-softmax{chunk=128}").source], str(path))
    assert r.ok, r.message


def test_the_chunk_is_a_tile_knob() -> None:
    """The chunk the pass writes is a module constant the tile pass finds by tracing and retunes."""
    from pallasopt.passes.tile import knobs_of

    ir = KernelIR.from_file(TEST_KERNELS / "vocab_logsumexp.py")
    new = apply(ir, "online-softmax{chunk=1024}")
    knobs = {k.name: (k.axes, k.value) for k in knobs_of(new)}
    assert knobs["SOFTMAX_CHUNK"] == ((1,), 1024) and knobs["ROWS"] == ((0,), 16)
    bigger = apply(new, "tile{call=0,ROWS=128,SOFTMAX_CHUNK=4096}")
    assert bigger.calls[0].grid == (8, 64) and bigger.calls[0].inputs[0].block_shape == (128, 4096)


def test_cross_entropy_before_after() -> None:
    """lse minus the label's logit, picked with an iota compare over the row: the chunk's iota gets its offset."""
    ir = KernelIR.from_file(TEST_KERNELS / "whole_row_cross_entropy.py")
    form = _form(ir, ir.calls[0])
    assert (form.kind, form.chunked, form.label_input) == ("cross-entropy", ((0, 1),), 1)
    new = apply(ir, "online-softmax{chunk=256}")
    got = added(ir.source, new.source)
    for line in (
        "_cols = chunk_id * SOFTMAX_CHUNK + jax.lax.broadcasted_iota(jnp.int32, s_chunk.shape, 1)",
        "picked_scratch[...] += jnp.sum(",
        "jnp.where(_cols == lab_ref[...].reshape(s_chunk.shape[0], 1), s_chunk, 0.0),",
    ):
        assert line in got, line
    assert any("- picked_scratch[...]).reshape(o_ref.shape)" in g for g in got), got
    call = new.calls[0]
    assert call.grid == (64, 128) and [o.block_shape for o in call.inputs] == [(8, 256), (8, 1)]


@pytest.mark.slow
def test_cross_entropy_rewrite_matches_the_reference() -> None:
    """8 chunks per row at CHECK_DIMS (V=1024); a wrong chunk offset on the iota fails this check (tried by hand)."""
    path = TEST_KERNELS / "whole_row_cross_entropy.py"
    ir = KernelIR.from_file(path)
    (r,) = check_many([apply(ir, "online-softmax{chunk=128}").source], str(path))
    assert r.ok, r.message
