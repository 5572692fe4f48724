"""sigmoid-tanh: a kernel's sigmoids as one tanh and a multiply-add (before/after, declines, the oracle)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.registry import parse_pipeline
from pallasopt.passes.sigmoid_tanh import SigmoidTanhPass

PATH = Path(__file__).parent / "kernels" / "sigmoid" / "gates.py"
V5E = get_chip("v5e")


def load(text: str | None = None) -> KernelIR:
    return KernelIR.from_source(text if text is not None else PATH.read_text(), str(PATH))


def test_every_form_in_the_kernel_is_rewritten_and_nothing_else() -> None:
    ir = load()
    assert SigmoidTanhPass.choices(ir, V5E) == (SigmoidTanhPass(call=0),)  # the doubling kernel has none
    new = SigmoidTanhPass(call=0).apply(ir)
    src = new.source
    assert "def _sigmoid_tanh(v):" in src and "return 0.5 * jnp.tanh(0.5 * v) + 0.5" in src
    assert "acc_ref[...] += _sigmoid_tanh(a) * _silu_tanh(b_ref[...].astype(jnp.float32))" in src  # `sg`, silu
    assert "o_ref[...] = (z * (_sigmoid_tanh(z))).astype(o_ref.dtype)" in src  # the hand-written 1 / (1 + exp(-z))
    kernel = src.split("def _gates_kernel")[1].split("def _double_kernel")[0]
    assert "exp" not in kernel and "sg(" not in kernel and "jax.nn" not in kernel
    assert "g = jax.nn.sigmoid(a.astype(jnp.float32)) * jax.nn.silu(b.astype(jnp.float32))" in src  # the reference
    assert [c.grid for c in new.calls] == [c.grid for c in ir.calls]
    assert parse_pipeline("sigmoid-tanh{call=0}") == (SigmoidTanhPass(call=0),)


@pytest.mark.parametrize(
    "quotient", ["(1.0 / (2.0 + jnp.exp(-z)))", "(1.0 / (1.0 + jnp.exp(z)))", "(2.0 / (1.0 + jnp.exp(-z)))"]
)
def test_declines_without_a_sigmoid(quotient: str) -> None:
    """Quotients that are not a logistic stay; with no other sigmoid in the kernel, the pass declines."""
    text = PATH.read_text().replace("sg(a) * jax.nn.silu(b_ref[...].astype(jnp.float32))", "a * b_ref[...]")
    text = text.replace("(1.0 / (1.0 + jnp.exp(-z)))", quotient)
    assert quotient in text
    for call in (0, 1):
        with pytest.raises(PassNotApplicable, match="no sigmoid"):
            SigmoidTanhPass(call=call).apply(load(text))


def test_a_sigmoid_in_a_module_helper_is_not_the_kernels() -> None:
    text = PATH.read_text().replace("sg(a) * jax.nn.silu(", "_gate(a) * (").replace("(1.0 / (1.0 + jnp.exp(-z)))", "z")
    text = text.replace("def _gates_kernel", "def _gate(v):\n    return jax.nn.sigmoid(v)\n\n\ndef _gates_kernel")
    with pytest.raises(PassNotApplicable, match="no sigmoid"):
        SigmoidTanhPass(call=0).apply(load(text))


@pytest.mark.slow
def test_the_rewrite_passes_the_oracle() -> None:
    new = SigmoidTanhPass(call=0).apply(load())
    (result,) = check_many([new.source], str(PATH))
    assert result.ok, result.message
