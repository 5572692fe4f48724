"""epilogue, further reach: a caller's epilogue on a helper's returned call (moved into the helper, or into a copy
for that call site), and an epilogue after a reshape of the call's result (operands brought to the output's
layout). Before/after, declines, and every choice checked in interpret mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.epilogue import EpiloguePass

KERNELS = Path(__file__).parent / "kernels" / "epilogue"
V5E = get_chip("v5e")


def load(name: str) -> KernelIR:
    return KernelIR.from_file(KERNELS / f"{name}.py")


def test_a_callers_epilogue_moves_into_the_helper_it_calls_once() -> None:
    ir = load("helper_return")
    assert EpiloguePass.choices(ir, V5E) == (EpiloguePass(call=0),)
    new = EpiloguePass(call=0).apply(ir)
    (call,) = new.calls
    assert [(o.shape, o.block_shape) for o in call.inputs[2:]] == [((1, 256), (1, 128))]
    src = new.source
    assert "def _mm(x, w, *, _ce0):" in src and "_mm_epilogue" not in src  # one caller: edited in place
    assert "        o = jax.nn.gelu(o + _e0)\n" in src
    assert "    _ce0 = b\n    y = _mm(x, w, _ce0=_ce0)\n    return y\n" in src


def test_a_helper_called_twice_gets_a_copy_for_the_call_site_with_the_epilogue() -> None:
    ir = load("helper_shared")
    assert len(ir.calls) == 2 and ir.calls[0].span == ir.calls[1].span
    assert EpiloguePass.choices(ir, V5E) == (EpiloguePass(call=0),)
    new = EpiloguePass(call=0).apply(ir)
    src = new.source
    assert "def _mm(x, w):" in src and "def _mm_epilogue(x, w, *, _ce0):" in src
    assert "    h = _mm_epilogue(x, w1, _ce0=_ce0)\n    return _mm(h, w2)\n" in src
    assert [len(c.inputs) for c in new.calls] == [3, 2]  # the second site's call is untouched


def test_the_call_whose_caller_returns_it_as_it_is_declines() -> None:
    with pytest.raises(PassNotApplicable, match=r"the caller of _mm \(line 33\): .*returns it as it is"):
        EpiloguePass(call=1).apply(load("helper_shared"))


def test_a_method_returning_the_call_declines() -> None:
    ir = load("method_return")
    assert EpiloguePass.choices(ir, V5E) == ()
    with pytest.raises(PassNotApplicable, match=r"the method Model.forward returns the call's value as it is"):
        EpiloguePass(call=0).apply(ir)


def test_an_epilogue_after_a_reshape_reads_its_operands_in_the_output_layout() -> None:
    ir = load("reshape_bias")
    assert EpiloguePass.choices(ir, V5E) == (EpiloguePass(call=0),)
    new = EpiloguePass(call=0).apply(ir)
    (call,) = new.calls
    # (N,) bias: rank-aligned; (B, S, N) residual: reshaped to (B*S, N); (B, S, 1) gate: to (B*S, 1)
    assert [(o.shape, o.block_shape) for o in call.inputs[2:]] == [
        ((1, 256), (1, 128)),
        ((256, 256), (128, 128)),
        ((256, 1), (128, 1)),
    ]
    src = new.source
    out = "(jax.ShapeDtypeStruct((B * S, N), jnp.float32))"
    assert f"    _e1 = jnp.reshape(_e1, {out}.shape)\n" in src  # written in shapes, not traced sizes
    assert f"    _e2 = jnp.reshape(_e2, {out}.shape[:1] + jnp.shape(_e2)[2:])\n" in src
    assert "        o = (jax.nn.relu(o + _e0) + _e1) * _e2\n" in src
    assert "    out = out.reshape(B, S, N)\n    return out\n" in src  # the reshape stays in the wrapper


def test_an_operand_broadcast_along_a_merged_dim_declines() -> None:
    path = KERNELS / "reshape_bias.py"
    src = path.read_text().replace("(k[4], (B, S, 1)", "(k[4], (S, 1)")
    ir = KernelIR.from_source(src, str(path))
    with pytest.raises(PassNotApplicable, match=r"broadcasts along the dims the reshape .* splits or merges"):
        EpiloguePass(call=0).apply(ir)


def test_a_helper_reached_through_a_partial_alias_takes_the_cast_and_its_dtype() -> None:
    # `mm = functools.partial(_mm, bk=128)`; `return mm(x, w).astype(x.dtype)`: the cast's dtype reads the
    # caller's `x`, so it travels as a keyword-only parameter; the kernel accumulates in its output, so the epilogue
    # keeps an f32 accumulator and stores the cast block once, on the last K step.
    ir = load("partial_cast")
    assert ir.calls[0].outputs[0].dtype == "float32"
    assert EpiloguePass.choices(ir, V5E) == (EpiloguePass(call=0),)
    new = EpiloguePass(call=0).apply(ir)
    src = new.source
    assert "def _mm(x, w, *, bk: int, _ce0):" in src and "mm = functools.partial(_mm, bk=128)" in src
    assert "    _ce0 = x.dtype\n    return mm(x, w, _ce0=_ce0)\n" in src
    assert new.calls[0].outputs[0].dtype == "bfloat16" and len(new.calls[0].scratch) == 1
    # A second call of the alias elsewhere: moving the cast into `_mm` would change that call too.
    twice = ir.source.replace(
        "    return mm(x, w).astype(x.dtype)", "    y = mm(x, w)\n    return mm(x, w).astype(y.dtype)"
    )
    with pytest.raises(PassNotApplicable, match="called through mm, which is named elsewhere too"):
        EpiloguePass(call=1).apply(KernelIR.from_source(twice, str(KERNELS / "partial_cast.py")))


@pytest.mark.parametrize("name", ["helper_return", "helper_shared", "reshape_bias", "partial_cast"])
def test_every_choice_matches_the_reference(name: str) -> None:
    ir = load(name)
    results = [c.apply(ir) for c in EpiloguePass.choices(ir, V5E)]
    assert results
    checked = check_many([r.source for r in results], str(KERNELS / f"{name}.py"), seeds=(0, 1))
    bad = [(r.recipe, c.message) for r, c in zip(results, checked, strict=True) if not c.ok]
    assert not bad, bad
