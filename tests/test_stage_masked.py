"""stage-masked: an input block spanning a whole masked axis is fetched in pieces, the masked ones never
(before/after, the fetched bytes, declines, the oracle at a staged size, a ragged grid and a size that falls back)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.roofline import estimate_calls
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.registry import parse_pipeline
from pallasopt.passes.stage_masked import StageMaskedPass

ROOT = Path(__file__).parent.parent
WINDOW = Path(__file__).parent / "kernels" / "masked" / "window_softmax.py"
CAUSAL = ROOT / "bench" / "kernels" / "fused_33_causal_softmax_scores.py"
V5E = get_chip("v5e")


def load(path: Path, text: str | None = None) -> KernelIR:
    return KernelIR.from_source(text if text is not None else path.read_text(), str(path))


def _in_bytes(ir: KernelIR) -> int:
    (est,) = estimate_calls(ir.calls, V5E).calls
    return sum(t.bytes for t in est.traffic if t.operand == "in0")


def test_causal_rows_are_fetched_in_pieces_up_to_the_diagonal() -> None:
    ir = load(CAUSAL)
    assert StageMaskedPass.choices(ir, V5E) == tuple(
        StageMaskedPass(call=0, operand=0, block=b) for b in (256, 512, 1024)
    )
    base = parse_pipeline("tile{call=0,Q_ROWS=512}")[0].rewrite(ir)
    new = StageMaskedPass(call=0, operand=0, block=512).rewrite(base)
    (old_call,), (call,) = base.calls, new.calls
    assert call.grid == (*old_call.grid, 4) and call.inputs[0].block_shape == (1, 1, 512, 512)
    assert call.outputs[0].block_shape == old_call.outputs[0].block_shape == (1, 1, 512, 2048)
    assert [s.shape for s in call.scratch] == [(1, 1, 512, 2048)]
    # row block i needs pieces 0..i of 4: 1 + 2 + 3 + 4 = 10 of 16 fetched, the outputs written as before
    assert _in_bytes(new) * 16 == _in_bytes(base) * 10
    src = new.source
    assert "def _masked_softmax_kernel(s_ref_piece, o_ref, s_ref):" in src
    assert "jnp.minimum(j, (i * Q_ROWS + Q_ROWS - 1) // ((512 if S % 512 == 0 else S))" in src
    assert "pl.program_id(2)" not in src.split("def _body")[1].split("def causal_softmax")[0]  # read at the top


def test_a_window_mask_clamps_both_ends_and_the_squeezed_head_dim_is_kept() -> None:
    ir = load(WINDOW)
    assert StageMaskedPass.choices(ir, V5E) == (
        StageMaskedPass(call=0, operand=0, block=256),
        StageMaskedPass(call=0, operand=0, block=512),
    )
    new = StageMaskedPass(call=0, operand=0, block=256).rewrite(ir)
    (call,) = new.calls
    assert call.grid == (2, 16, 4) and call.inputs[0].block_shape == (None, 64, 256)
    assert [s.shape for s in call.scratch] == [(64, 1024)]
    # rows 64i..64i+63 see keys in (q - 256, q]: at most 2 pieces of 256 per row block, not 4
    assert _in_bytes(new) * 4 <= _in_bytes(ir) * 2
    assert "jnp.maximum(j, -(" in new.source and "pl.num_programs(2) - 1" in new.source


@pytest.mark.slow
def test_the_rewrite_passes_the_oracle_staged_ragged_and_whole() -> None:
    """S = 768 (three pieces of 256) with 80-row blocks (a ragged last block: pl.cdiv), and the module's own check
    size S = 640, where 256 does not divide S and the kernel takes the whole row as one piece."""
    text = WINDOW.read_text()
    staged = text.replace("ROWS = 64", "ROWS = 80").replace(
        'CHECK_DIMS = {"H": 2, "S": 640}', 'CHECK_DIMS = {"H": 2, "S": 768}'
    )
    assert staged != text
    sources = [StageMaskedPass(call=0, operand=0, block=256).rewrite(load(WINDOW, t)).source for t in (staged, text)]
    results = check_many(sources, str(WINDOW))
    assert [r.ok for r in results] == [True, True], [r.message for r in results]


@pytest.mark.slow
def test_a_wrong_clamp_fails_the_oracle() -> None:
    """The oracle sees stale pieces: with the upper clamp one piece short, the kernel reads stale keys."""
    text = WINDOW.read_text().replace('CHECK_DIMS = {"H": 2, "S": 640}', 'CHECK_DIMS = {"H": 2, "S": 768}')
    src = StageMaskedPass(call=0, operand=0, block=256).rewrite(load(WINDOW, text)).source
    broken = src.replace("(i * ROWS + ROWS - 1) //", "(i * ROWS - 1) //").replace(
        "- piece * piece_len + s_ref.shape[0] - 1 >= 0", "- piece * piece_len - 1 >= 0"
    )
    assert broken.count("(i * ROWS - 1) //") == 1 and "- piece * piece_len - 1 >= 0" in broken
    (result,) = check_many([broken], str(WINDOW))
    assert not result.ok


@pytest.mark.parametrize(
    "edit, reason",
    [
        # the row max is taken over the unmasked value: stale pieces would reach it
        (("    s = jnp.where(", "    top = jnp.max(s)\n    s = jnp.where("), "first use of `s` is not"),
        # the mask applies to a value computed from it, not to it
        (
            (
                "    s = jnp.where((k <= q) & (k > q - WINDOW), s, NEG)\n    p = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))",
                "    e = jnp.exp(s)\n    p = jnp.where((k <= q) & (k > q - WINDOW), e, 0.0)",
            ),
            "first use of `s` is not",
        ),
        # a reduction inside the read
        (("    s = s_ref[...] * 0.125", "    s = s_ref[...] * 0.125 - jnp.max(s_ref[...])"), "is not read once"),
        # the unmasked value is used after the mask
        (
            (
                "    s = jnp.where((k <= q) & (k > q - WINDOW), s, NEG)",
                "    t = jnp.where((k <= q) & (k > q - WINDOW), s, NEG)\n    s = t + s",
            ),
            "used unmasked after the mask",
        ),
        # an iota whose shape is not a literal tuple: which dims it walks is not read
        (
            (
                "    k = jax.lax.broadcasted_iota(jnp.int32, (rows, keys), 1)",
                "    k = jax.lax.broadcasted_iota(jnp.int32, s_ref.shape, 1)",
            ),
            "not literal shapes",
        ),
    ],
)
def test_declines(edit: tuple[str, str], reason: str) -> None:
    old, new = edit
    text = WINDOW.read_text()
    assert old in text
    with pytest.raises(PassNotApplicable, match=reason):
        StageMaskedPass(call=0, operand=0, block=256).apply(load(WINDOW, text.replace(old, new)))


def test_no_choice_without_an_iota_mask() -> None:
    text = WINDOW.read_text().replace("    s = jnp.where((k <= q) & (k > q - WINDOW), s, NEG)\n", "")
    assert StageMaskedPass.choices(load(WINDOW, text), V5E) == ()
    assert parse_pipeline("stage-masked{call=0,operand=0,block=512}") == (
        StageMaskedPass(call=0, operand=0, block=512),
    )
