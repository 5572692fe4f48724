"""smem-partials: an output written one element per grid step is held whole in SMEM (before/after, the two store
forms, declines, every choice checked in interpret mode, and it compiles for a TPU where the original does not)."""

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
from pallasopt.passes.smem_partials import SmemPartialsPass

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "kernels" / "smem" / "block_partials.py"
V5E = get_chip("v5e")
ELEMENT_STORE = {"    o_ref[...] = jnp.sum(d * d).reshape((1, 1))": "    o_ref[0, 0] = jnp.sum(d * d)"}


def _edited(edits: dict[str, str]) -> KernelIR:
    text = FIXTURE.read_text()
    for old, new in edits.items():
        assert old in text
        text = text.replace(old, new)
    return KernelIR.from_source(text, str(FIXTURE))


def test_spec_round_trips() -> None:
    (p,) = parse_pipeline("smem-partials{call=0,output=2}")
    assert p == SmemPartialsPass(call=0, output=2) and p.spec() == "smem-partials{call=0,output=2}"


@pytest.mark.parametrize("edits", [{}, ELEMENT_STORE], ids=["block-store", "element-store"])
def test_the_output_moves_to_smem_and_each_step_stores_its_element(edits: dict[str, str]) -> None:
    ir = _edited(edits)
    assert SmemPartialsPass.choices(ir, V5E) == (SmemPartialsPass(call=0, output=2),)
    new = SmemPartialsPass(call=0, output=2).apply(ir)
    out = new.calls[0].operands[2]
    assert out.memory_space == "smem" and out.block_shape == out.shape == (8, 4)
    assert "out_specs=pl.BlockSpec(memory_space=pltpu.SMEM)," in new.source
    value = "jnp.reshape(jnp.sum(d * d).reshape((1, 1)), ())" if not edits else "jnp.sum(d * d)"
    assert f"o_ref[pl.program_id(0), pl.program_id(1)] = {value}" in new.source
    (verdict,) = check_many([new.source], str(FIXTURE))
    assert verdict.ok, verdict.message
    assert SmemPartialsPass.choices(new, V5E) == ()  # nothing left to move


@pytest.mark.parametrize(
    ("edits", "why"),
    [
        (
            {
                "    o_ref[...] = jnp.sum(d * d).reshape((1, 1))": "    o_ref[...] = jnp.sum(d * d).reshape((1, 1)) + o_ref[...]"
            },
            "other than storing into it",
        ),
        (
            {
                "        out_shape=jax.ShapeDtypeStruct(grid, jnp.float32),": "        out_shape=jax.ShapeDtypeStruct(grid, jnp.float32),\n        compiler_params=pltpu.CompilerParams(dimension_semantics=('parallel', 'arbitrary')),"
            },
            "parallel grid axis",
        ),
        (
            {
                "jax.ShapeDtypeStruct(grid, jnp.float32)": "jax.ShapeDtypeStruct(grid, jnp.bfloat16)",
                ".reshape((1, 1))": ".reshape((1, 1)).astype(o_ref.dtype)",
            },
            "one element per grid step",
        ),
        (
            {"lambda i, j: (i, j)),\n        out_shape": "lambda i, j: (j, i)),\n        out_shape"},
            "one element per grid step",
        ),
    ],
    ids=["read", "parallel", "bf16", "transposed-index"],
)
def test_declines(edits: dict[str, str], why: str) -> None:
    ir = _edited(edits)
    if "storing" not in why:  # what the traced facts show is never offered; the body is read by apply alone
        assert SmemPartialsPass.choices(ir, V5E) == ()
    with pytest.raises(PassNotApplicable, match=why):
        SmemPartialsPass(call=0, output=2).apply(ir)


@needs_libtpu
def test_it_compiles_for_tpu_where_the_original_does_not() -> None:
    ir = KernelIR.from_file(FIXTURE)
    before = compile_module(ir.source, str(FIXTURE), "mse", {}, "v5e")
    after = compile_module(SmemPartialsPass(call=0, output=2).apply(ir).source, str(FIXTURE), "mse", {}, "v5e")
    assert not before.ok and "block shape" in (before.error or "")
    assert after.ok, after.error
