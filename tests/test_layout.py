"""layout (pre-transposed operands) and the cost model's charge for the wrapper ops it adds."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.wrapper import wrapper_cost, wrapper_cost_of_jaxpr
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.layout import LayoutPass
from pallasopt.search.tiers import model_tier

PATH = Path(__file__).parent / "kernels" / "layout" / "nt_matmul.py"
V5E = get_chip("v5e")


@pytest.fixture(scope="module")
def ir() -> KernelIR:
    return KernelIR.from_file(PATH)


def test_pre_transposes_the_weight(ir: KernelIR) -> None:
    assert LayoutPass.choices(ir, V5E) == (LayoutPass(call=0, operand=1),)  # x and the bias are read plainly
    new = LayoutPass(call=0, operand=1).apply(ir)
    w = new.calls[0].inputs[1]
    assert (w.shape, w.block_shape) == ((256, 256), (128, 128))
    assert w.index_map.depends_on == ((2,), (1,))  # (k, j): the rows walk K now
    src = new.source
    assert "jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)" in src
    assert "pl.BlockSpec((BK, BN), lambda i, j, k: (k, j))," in src
    assert ")(x, w.T, b.reshape(1, N))" in src


@pytest.mark.parametrize(
    ("operand", "why"), [(0, "uses x_ref other than as a transposed read"), (2, "not a blocked input|other than")]
)
def test_declines_plain_reads(ir: KernelIR, operand: int, why: str) -> None:
    with pytest.raises(PassNotApplicable, match=why):
        LayoutPass(call=0, operand=operand).apply(ir)


def test_the_model_charges_the_wrapper_transpose(ir: KernelIR) -> None:
    new = LayoutPass(call=0, operand=1).apply(ir)
    assert wrapper_cost(ir).bytes == 0  # b.reshape(1, N) keeps the minor dim: no copy
    cost = wrapper_cost(new)
    assert cost.ops == ("transpose",) and cost.bytes == 2 * 256 * 256 * 4  # read w, write w.T
    before, after = model_tier(ir, V5E), model_tier(new, V5E)
    assert after.data["wrapper_s"] == pytest.approx(cost.bytes / V5E.delivered_hbm_bw_bytes_s)
    assert after.time_s == pytest.approx(sum(c["time_s"] for c in after.data["calls"]) + after.data["wrapper_s"])
    assert before.data["wrapper_s"] == 0


def test_wrapper_cost_counts_moves_and_elementwise_fusions() -> None:
    def f(x):
        y = jnp.pad(x, ((0, 0), (0, 64))).reshape(32, 48)  # pad copies; this reshape moves the minor dim
        z = jnp.exp(y.reshape(16, 2, 48))  # keeps the minor dim: free
        return z * 2.0 + 1.0  # exp, mul, add: one fusion that reads the reshape and writes its result once

    cost = wrapper_cost_of_jaxpr(jax.make_jaxpr(f)(jnp.ones((16, 32), jnp.float32)).jaxpr)
    assert cost.ops == ("elementwise-fusion", "pad", "reshape")
    moves = (16 * 32 * 4 + 4 + 16 * 96 * 4) + 2 * 16 * 96 * 4  # pad reads x and its scalar
    assert cost.bytes == moves + 2 * 16 * 96 * 4


@pytest.mark.slow
def test_every_choice_matches_the_reference(ir: KernelIR) -> None:
    sources = [c.apply(ir).source for c in LayoutPass.choices(ir, V5E)]
    results = check_many(sources, str(PATH))
    assert sources and all(r.ok for r in results), [r.message for r in results]


NT_PATH = Path(__file__).parent / "kernels" / "layout" / "nt_scores.py"


def test_nt_dot_general_and_a_local_transpose_read_the_pre_transposed_block() -> None:
    ir = KernelIR.from_file(NT_PATH)
    assert LayoutPass.choices(ir, V5E) == (LayoutPass(call=0, operand=1),)  # q is read plainly
    new = LayoutPass(call=0, operand=1).apply(ir)
    k = new.calls[0].inputs[1]
    assert (k.shape, k.block_shape) == ((1, 2, 128, 256), (None, None, 128, 128))
    src = new.source
    assert "jax.lax.dot_general(q, k, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)" in src
    assert "jnp.dot(q, k, preferred_element_type=jnp.float32)" in src
    assert "pl.BlockSpec((None, None, D, BLOCK), lambda b, h, i, j: (b, h, 0, j))," in src
    assert ")(q, k.swapaxes(-1, -2))" in src
    assert "NT = (((1,), (1,)), ((), ()))" in src  # the shared constant stays for other users
    checked = check_many([new.source], str(NT_PATH), seeds=(0,))
    assert checked[0].ok, checked[0].message


DEAD_PAD = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def double(x):
    xp = jnp.pad(x, ((8, 8), (0, 0)))
    rows = {rows}
    return pl.pallas_call(
        _kernel,
        grid=(rows // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, 128), x.dtype),
    )({operand})


def reference(x):
    return {reference}


def make_inputs(key, M=64):
    return (jax.random.normal(key, (M, 128), jnp.float32),)
"""


@pytest.mark.parametrize(
    ("rows", "operand", "reference", "charged"),
    [
        ("xp.shape[0] - 16", "x", "x * 2.0", False),  # xp lends only its shape: XLA never pads
        ("xp.shape[0]", "xp", "jnp.pad(x, ((8, 8), (0, 0))) * 2.0", True),  # the kernel reads the padded copy
    ],
)
def test_wrapper_cost_leaves_out_dead_ops(
    tmp_path: Path, rows: str, operand: str, reference: str, charged: bool
) -> None:
    path = tmp_path / "dead_pad.py"
    path.write_text(DEAD_PAD.format(rows=rows, operand=operand, reference=reference))
    cost = wrapper_cost(KernelIR.from_file(path))
    pad = 64 * 128 * 4 + 4 + 80 * 128 * 4  # reads x and the pad value, writes the padded copy
    assert (cost.ops, cost.bytes) == ((("pad",), pad) if charged else ((), 0))
