"""split-k: a kernel whose blocks hold a dot's whole contraction gets a grid axis over pieces of it (before/after on
two kernel styles, the bf16 cast, every choice checked in interpret mode, a size the piece does not divide, the
declines, and a kernel that does not fit VMEM compiles for a TPU once split)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_compiler import needs_libtpu

from pallasopt.cost_model.compiler import compile_module
from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.registry import parse_pipeline
from pallasopt.passes.split_k import SplitKPass

ROOT = Path(__file__).resolve().parent.parent
LINEAR = ROOT / "tests" / "kernels" / "splitk" / "linear_softmax.py"
MODEL = ROOT / "tests" / "kernels" / "splitk" / "one_step_model.py"
V5E = get_chip("v5e")


def _edited(path: Path, edits: dict[str, str]) -> KernelIR:
    text = path.read_text()
    for old, new in edits.items():
        assert old in text
        text = text.replace(old, new)
    return KernelIR.from_source(text, str(path))


def test_spec_round_trips() -> None:
    (p,) = parse_pipeline("split-k{call=0,piece=256,vmem_mib=64}")
    assert p == SplitKPass(call=0, piece=256, vmem_mib=64) and p.spec() == "split-k{call=0,piece=256,vmem_mib=64}"


def test_the_contraction_gets_a_grid_axis_and_the_rest_runs_on_the_last_step() -> None:
    ir = KernelIR.from_file(LINEAR)
    # K = 2048 at the module's dims, 512 at CHECK_DIMS: the pieces that split both into several steps
    assert SplitKPass.choices(ir, V5E) == (SplitKPass(call=0, piece=128), SplitKPass(call=0, piece=256))
    new = SplitKPass(call=0, piece=256).apply(ir)
    call = new.calls[0]
    assert call.grid == (8, 8)
    assert [op.block_shape for op in call.operands] == [(8, 256), (256, 256), (1, 256), (8, 256)]
    assert [op.index_map.affine for op in call.inputs[:2]] == [((1, 0, 0), (0, 1, 0)), ((0, 0, 0), (0, 1, 0))]
    assert call.scratch and call.scratch[0].shape == (8, 256) and call.scratch[0].dtype == "float32"
    src = new.source
    assert "k_part = jnp.dot(x, w.T, preferred_element_type=jnp.float32)" in src
    assert "acc_ref[...] += k_part" in src
    assert "    def _finish():\n        logits = acc_ref[...] + b\n" in src  # the epilogue runs on the sum
    assert "grid=(M // BM, K // _split_k_piece(K))," in src
    assert "pl.BlockSpec((N, _split_k_piece(K)), lambda i, kk: (0, kk))," in src
    assert "SPLIT_K = 256" in src and "return SPLIT_K if k % SPLIT_K == 0 else k" in src
    assert SplitKPass.choices(new, V5E) == ()  # the blocks no longer hold the contraction


def test_every_choice_on_both_styles_passes_the_oracle() -> None:
    sources, names = [], []
    for path in (LINEAR, MODEL):
        ir = KernelIR.from_file(path)
        choices = SplitKPass.choices(ir, V5E)
        assert choices, path.name
        for c in choices:
            sources.append(c.apply(ir).source)
            names.append(f"{path.stem}: {c.spec()}")
    verdicts = check_many(sources[:2], str(LINEAR)) + check_many(sources[2:], str(MODEL))
    bad = [(n, v.message) for n, v in zip(names, verdicts, strict=True) if not v.ok]
    assert not bad, bad


def test_a_bf16_dot_is_summed_in_f32_and_cast_back_and_an_at_operator_becomes_matmul() -> None:
    new = SplitKPass(call=0, piece=128).apply(KernelIR.from_file(MODEL))
    src = new.source
    assert "k_part = jnp.matmul(x_block, w_block, preferred_element_type=jnp.float32)" in src
    assert "out = acc_ref[...].astype(jnp.bfloat16)" in src  # the original dot's dtype, as the rest expects
    assert "grid=(1, in_feat // _split_k_piece(in_feat))," in src  # in the PrefetchScalarGridSpec
    assert "scratch_shapes=[pltpu.VMEM((batch, out_feat), jnp.float32)]" in src
    assert new.calls[0].grid == (1, 32)


def test_a_size_the_piece_does_not_divide_runs_the_contraction_in_one_step() -> None:
    new = SplitKPass(call=0, piece=256).apply(KernelIR.from_file(LINEAR))
    text = new.source.replace(
        'CHECK_DIMS = {"M": 16, "K": 512, "N": 128}', 'CHECK_DIMS = {"M": 16, "K": 384, "N": 128}'
    )
    odd = KernelIR.from_source(text, str(LINEAR))
    assert odd.workload is not None and odd.workload.check_dims == {"M": 16, "K": 384, "N": 128}
    (verdict,) = check_many([text], str(LINEAR))
    assert verdict.ok, verdict.message


@pytest.mark.parametrize(
    ("edits", "why"),
    [
        (
            {
                "    o_ref[...] = (e / jnp.sum(e, axis=1, keepdims=True)).astype(o_ref.dtype)": "    o_ref[...] = (e / jnp.sum(e, axis=1, keepdims=True) + x[:, :1]).astype(o_ref.dtype)"
            },
            "used elsewhere",
        ),
        ({"logits = jnp.dot(x, w.T) + b": "logits = jnp.dot(x * 2.0, w.T) + b"}, r"computed \(mul\)"),
        (
            {
                "    m = jnp.max(logits, axis=1, keepdims=True)": "    logits = logits + jnp.dot(x_ref[...], w_ref[...].T)\n    m = jnp.max(logits, axis=1, keepdims=True)"
            },
            "2 dots",
        ),
        (
            {"    x = x_ref[...]\n": "    o_ref[...] = jnp.zeros_like(o_ref)\n    x = x_ref[...]\n"},
            "not a plain assignment",
        ),
        (
            {
                "grid=(M // BM,),": "grid=(M // BM, 2),",
                "pl.BlockSpec((BM, K), lambda i: (i, 0)),": "pl.BlockSpec((BM, K // 2), lambda i, k: (i, k)),",
                "pl.BlockSpec((N, K), lambda i: (0, 0)),": "pl.BlockSpec((N, K // 2), lambda i, k: (0, k)),",
                "pl.BlockSpec((1, N), lambda i: (0, 0)),": "pl.BlockSpec((1, N), lambda i, k: (0, 0)),",
                "out_specs=pl.BlockSpec((BM, N), lambda i: (i, 0)),": "out_specs=pl.BlockSpec((BM, N), lambda i, k: (i, 0)),",
            },
            "already splits the contraction",
        ),
    ],
    ids=["operand-reused", "operand-computed", "two-dots", "store-before", "already-split"],
)
def test_declines(edits: dict[str, str], why: str) -> None:
    ir = _edited(LINEAR, edits)
    assert SplitKPass.choices(ir, V5E) == ()
    with pytest.raises(PassNotApplicable, match=why):
        SplitKPass(call=0, piece=128).apply(ir)


@needs_libtpu
def test_a_weight_too_big_for_vmem_compiles_once_split() -> None:
    ir = KernelIR.from_file(LINEAR)
    dims = {"M": 64, "K": 16384, "N": 4096}  # a 256 MiB f32 weight in one block: more than a v5e's 128 MiB VMEM
    before = compile_module(ir.source, str(LINEAR), "linear_softmax", dims, "v5e")
    after = compile_module(SplitKPass(call=0, piece=128).apply(ir).source, str(LINEAR), "linear_softmax", dims, "v5e")
    assert not before.ok and "vmem" in (before.error or "").lower()
    assert after.ok, after.error
