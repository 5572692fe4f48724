"""epilogue: the wrapper's elementwise work on a call's result moves into the kernel (before/after, declines,
every choice checked in interpret mode, fewer HBM bytes in the model tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.wrapper import wrapper_cost
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.epilogue import EpiloguePass
from pallasopt.passes.registry import parse_pipeline
from pallasopt.search.tiers import model_tier

KERNELS = Path(__file__).parent / "kernels" / "epilogue"
V5E = get_chip("v5e")


def load(name: str) -> KernelIR:
    return KernelIR.from_file(KERNELS / f"{name}.py")


def test_spec_round_trips() -> None:
    (p,) = parse_pipeline("epilogue{call=2}")
    assert p == EpiloguePass(call=2) and p.spec() == "epilogue{call=2}"


def test_bias_and_activation_statements_move_before_the_store() -> None:
    ir = load("matmul_bias_relu")
    assert EpiloguePass.choices(ir, V5E) == (EpiloguePass(call=0),)
    new = EpiloguePass(call=0).apply(ir)
    (call,) = new.calls
    # The (N,) bias becomes a (1, N) input blocked like the output's columns; the product accumulates in a VMEM
    # scratch block and the epilogue is stored on the last K step.
    assert [(o.shape, o.block_shape) for o in call.inputs[2:]] == [((1, 256), (1, 128))]
    assert call.inputs[2].index_map.affine == ((0, 0, 0, 0), (0, 1, 0, 0))
    assert [(s.shape, s.dtype) for s in call.scratch] == [((128, 128), "float32")]
    src = new.source
    assert "    _e0 = jnp.expand_dims(b, (0,))\n" in src
    assert "        o = o + _e0\n        o = jax.nn.relu(o)\n        return o\n" in src
    assert "pl.BlockSpec((1, BLOCK), lambda i, j, k: (0, j))," in src
    assert "@pl.when(_last)" in src and "refs[3][...] = _epilogue(refs[-1][...], refs[2][...])" in src
    assert "    )(x, w, _e0)\n    return y\n" in src  # `y = y + b` is gone, `return relu(y)` returns y


def test_cast_and_residual_in_one_expression_with_grid_spec() -> None:
    ir = load("scale_residual_cast")
    new = EpiloguePass(call=0).apply(ir)
    (call,) = new.calls
    assert call.outputs[0].dtype == "bfloat16"  # the call writes the cast result: half the bytes
    assert [(o.shape, o.block_shape) for o in call.inputs[1:]] == [((256, 384), (128, 128))]
    src = new.source
    assert "o = (o * SCALE + _e0).astype(jnp.bfloat16)" in src  # the module constant stays a Python value
    assert "return pl.pallas_call(_epilogue_kernel, grid_spec=grid_spec," in src
    assert "scratch_shapes=[pltpu.VMEM((128, 128), jnp.float32)]," in src  # inside the PrefetchScalarGridSpec


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (0, "passed to jnp.sum, which is not an elementwise function"),
        (1, "its value t is not read by the next statement"),  # reshaped, then used as it is
        (2, "y is read again after the next statement"),
    ],
)
def test_declines(call: int, why: str) -> None:
    ir = load("declines")
    with pytest.raises(PassNotApplicable, match=why):
        EpiloguePass(call=call).apply(ir)


def test_an_operand_from_an_earlier_call_is_read_as_an_input() -> None:
    ir = load("declines")
    assert EpiloguePass.choices(ir, V5E) == (EpiloguePass(call=3),)
    new = EpiloguePass(call=3).apply(ir)
    assert "    _e0 = z + y\n    _e1 = y\n" in new.source and "o = _e0 + jnp.tanh(o + _e1)" in new.source


@pytest.mark.parametrize("name", ["matmul_bias_relu", "scale_residual_cast", "declines"])
def test_every_choice_matches_the_reference_and_moves_fewer_bytes(name: str) -> None:
    ir = load(name)
    results = [c.apply(ir) for c in EpiloguePass.choices(ir, V5E)]
    assert results
    for new in results:  # the wrapper's fusion no longer reads the result back (model tier, v5e)
        assert wrapper_cost(new).bytes < wrapper_cost(ir).bytes
        assert model_tier(new, V5E).data["wrapper_s"] < model_tier(ir, V5E).data["wrapper_s"]
    checked = check_many([r.source for r in results], str(KERNELS / f"{name}.py"), seeds=(0,))
    bad = [(r.recipe, c.message) for r, c in zip(results, checked, strict=True) if not c.ok]
    assert not bad, bad
