"""VMEM of a dot's packed lhs block (`roofline.lhs_copy_bytes`): libtpu adds about one copy of a bf16 lhs input
block of 512 KiB or more, however many dots read it (docs/cost-model.md, "Packed dot operands"); an f32 lhs, a small
block and the rhs add nothing. Facts are traced from the kernel sources below (no compiler, no TPU)."""

from __future__ import annotations

import functools

from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.roofline import estimate_call, lhs_copy_bytes, padded_block_bytes, vmem_footprint
from pallasopt.ir.facts import CallFacts
from pallasopt.ir.kernel_ir import KernelIR

V5E = get_chip("v5e")

# llm_swiglu_mlp's gate/up kernel: x (TM, TK) feeds two dots (BODY), accumulated into two f32 scratch refs.
SOURCE = """
import functools
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def kernel(x_ref, wg_ref, wu_ref, h_ref, gate_acc, up_acc):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        gate_acc[...] = jnp.zeros_like(gate_acc)
        up_acc[...] = jnp.zeros_like(up_acc)

BODY

    @pl.when(pl.program_id(2) == pl.num_programs(2) - 1)
    def _finish():
        g = gate_acc[...]
        h_ref[...] = (g * jax.nn.sigmoid(g) * up_acc[...]).astype(h_ref.dtype)


def gate_up(x, wg, wu):
    T, D = x.shape
    F = wg.shape[1]
    tm, tn, tk = TM, TN, TK
    w_spec = pl.BlockSpec((tk, tn), lambda i, j, k: (k, j))
    return pl.pallas_call(
        kernel,
        grid=(T // tm, F // tn, D // tk),
        in_specs=[pl.BlockSpec((tm, tk), lambda i, j, k: (i, k)), w_spec, w_spec],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((T, F), jnp.bfloat16),
        scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32), pltpu.VMEM((tm, tn), jnp.float32)],
    )(x, wg, wu)


def reference(x, wg, wu):
    g = jnp.dot(x, wg, preferred_element_type=jnp.float32)
    return (jax.nn.silu(g) * jnp.dot(x, wu, preferred_element_type=jnp.float32)).astype(jnp.bfloat16)


def make_inputs(key, T=2048, D=2048, F=2048):
    kx, kg, ku = jax.random.split(key, 3)
    return (
        jax.random.normal(kx, (T, D), jnp.float32).astype(DTYPE),
        jax.random.normal(kg, (D, F), jnp.float32).astype(DTYPE),
        jax.random.normal(ku, (D, F), jnp.float32).astype(DTYPE),
    )
"""

TWO_DOTS = """    x = x_ref[...]
    gate_acc[...] += jnp.dot(x, wg_ref[...], preferred_element_type=jnp.float32)
    up_acc[...] += jnp.dot(x, wu_ref[...], preferred_element_type=jnp.float32)"""
ONE_DOT = """    x = x_ref[...]
    gate_acc[...] += jnp.dot(x, wg_ref[...], preferred_element_type=jnp.float32)
    up_acc[...] += 1.0"""
NO_DOT = """    gate_acc[...] += x_ref[...].astype(jnp.float32)[:, : gate_acc.shape[1]]
    up_acc[...] += wu_ref[...].astype(jnp.float32)[: up_acc.shape[0], :]"""


@functools.cache
def traced(body: str, tiles: tuple[int, int, int] = (1024, 512, 1024), dtype: str = "jnp.bfloat16") -> CallFacts:
    tm, tn, tk = tiles
    src = SOURCE.replace("BODY", body).replace("DTYPE", dtype)
    src = src.replace("TM, TN, TK", f"{tm}, {tn}, {tk}")
    (call,) = KernelIR.from_source(src, "<test>.py").calls
    return call


def x_block(call: CallFacts) -> int:
    return padded_block_bytes(call.inputs[0], V5E)


def test_bf16_lhs_block_feeding_two_dots_is_charged_once() -> None:
    call = traced(TWO_DOTS)
    assert x_block(call) == 1024 * 1024 * 2
    assert lhs_copy_bytes(call, V5E) == x_block(call)
    # 2 x (x 2 MiB + wg 1 MiB + wu 1 MiB + h 1 MiB) + 2 f32 scratch of 2 MiB = 14 MiB, plus the x copy:
    # libtpu needs 16.36 MiB and refuses it under v5e's 16 MiB scoped limit; the model now does too.
    assert vmem_footprint(call, V5E) == 16 * 2**20
    assert not estimate_call(call, V5E).fits_vmem


def test_one_dot_is_charged_the_same() -> None:
    # Measured: the one-dot variant needs the same 16.35 MiB as the two-dot kernel (the copy is per lhs block).
    assert lhs_copy_bytes(traced(ONE_DOT), V5E) == 1024 * 1024 * 2


def test_no_dot_f32_lhs_and_small_blocks_are_not_charged() -> None:
    assert lhs_copy_bytes(traced(NO_DOT), V5E) == 0
    f32 = traced(TWO_DOTS, dtype="jnp.float32")  # an f32 lhs: libtpu added nothing measurable (fused_01)
    assert f32.body.dots and lhs_copy_bytes(f32, V5E) == 0
    small = traced(TWO_DOTS, (256, 512, 256))  # a 128 KiB lhs: the compiler's figure equals the buffers'
    assert lhs_copy_bytes(small, V5E) == 0
    assert vmem_footprint(small, V5E) == int(2.75 * 2**20)


def test_charge_follows_the_lhs_block_not_the_rhs() -> None:
    # (256, 1024, 1024): the rhs blocks (2 MiB each) are larger than the x block (0.5 MiB); libtpu 12.49 MiB.
    call = traced(TWO_DOTS, (256, 1024, 1024))
    assert lhs_copy_bytes(call, V5E) == 256 * 1024 * 2
    assert vmem_footprint(call, V5E) == int(12.5 * 2**20)


def test_gpu_is_not_charged() -> None:
    assert lhs_copy_bytes(traced(TWO_DOTS), get_chip("h100")) == 0
