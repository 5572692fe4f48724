"""SwiGLU MLP: out = (silu(x @ w_gate) * (x @ w_up)) @ w_down.

Default size tokens=8192, d=4096, ff=14336 mirrors one Llama-3-8B MLP block over an 8192-token batch
(about 2.9 TFLOP).

Naive choices: two pallas_calls written like textbook matmuls. The first computes the gate and up projections
tile by tile (128x128x128) into two f32 scratch accumulators and writes the activated hidden h (bf16) to HBM;
the second is a plain 128x128x128 matmul for the down projection that accumulates straight into its f32
output, cast back to bf16 outside the kernel. Block sizes are keyword arguments bound with functools.partial.
Default dimension semantics and buffering.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ENTRY = "swiglu_mlp"
CHECK_DIMS = {"tokens": 256, "d": 256, "ff": 512}
TOLERANCE = {"rtol": 3e-2, "atol": 3e-2}


def _gate_up_kernel(x_ref, wg_ref, wu_ref, h_ref, gate_acc, up_acc, *, n_k: int):
    k = pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        gate_acc[...] = jnp.zeros_like(gate_acc)
        up_acc[...] = jnp.zeros_like(up_acc)

    x = x_ref[...]
    gate_acc[...] += jnp.dot(x, wg_ref[...], preferred_element_type=jnp.float32)
    up_acc[...] += jnp.dot(x, wu_ref[...], preferred_element_type=jnp.float32)

    @pl.when(k == n_k - 1)
    def _finish():
        g = gate_acc[...]
        h_ref[...] = (g * jax.nn.sigmoid(g) * up_acc[...]).astype(h_ref.dtype)


def _gate_up(x, w_gate, w_up, *, tm: int, tn: int, tk: int):
    T, D = x.shape
    F = w_gate.shape[1]
    w_spec = pl.BlockSpec((tk, tn), lambda i, j, k: (k, j))
    return pl.pallas_call(
        functools.partial(_gate_up_kernel, n_k=D // tk),
        grid=(T // tm, F // tn, D // tk),
        in_specs=[pl.BlockSpec((tm, tk), lambda i, j, k: (i, k)), w_spec, w_spec],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((T, F), x.dtype),
        scratch_shapes=[pltpu.VMEM((tm, tn), jnp.float32), pltpu.VMEM((tm, tn), jnp.float32)],
    )(x, w_gate, w_up)


def _down_kernel(h_ref, w_ref, o_ref):
    @pl.when(pl.program_id(2) == 0)
    def _init():
        o_ref[...] = jnp.zeros_like(o_ref)

    o_ref[...] += jnp.dot(h_ref[...], w_ref[...], preferred_element_type=jnp.float32)


def _down(h, w_down, *, tm: int, tn: int, tk: int):
    T, F = h.shape
    D = w_down.shape[1]
    return pl.pallas_call(
        _down_kernel,
        grid=(T // tm, D // tn, F // tk),
        in_specs=[
            pl.BlockSpec((tm, tk), lambda i, j, k: (i, k)),
            pl.BlockSpec((tk, tn), lambda i, j, k: (k, j)),
        ],
        out_specs=pl.BlockSpec((tm, tn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((T, D), jnp.float32),
    )(h, w_down)


gate_up = functools.partial(_gate_up, tm=128, tn=128, tk=128)
down_proj = functools.partial(_down, tm=128, tn=128, tk=128)


def swiglu_mlp(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """Llama-style MLP through two Pallas kernels; bf16 in, bf16 out."""
    h = gate_up(x, w_gate, w_up)
    return down_proj(h, w_down).astype(x.dtype)


def reference(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    g = jnp.dot(x, w_gate, preferred_element_type=jnp.float32)
    u = jnp.dot(x, w_up, preferred_element_type=jnp.float32)
    h = (jax.nn.silu(g) * u).astype(x.dtype)
    return jnp.dot(h, w_down, preferred_element_type=jnp.float32).astype(x.dtype)


def make_inputs(key: jax.Array, tokens: int = 8192, d: int = 4096, ff: int = 14336):
    kx, kg, ku, kd = jax.random.split(key, 4)

    def weight(k, shape):
        return (jax.random.normal(k, shape, jnp.float32) * shape[0] ** -0.5).astype(jnp.bfloat16)

    x = jax.random.normal(kx, (tokens, d), jnp.bfloat16)
    return x, weight(kg, (d, ff)), weight(ku, (d, ff)), weight(kd, (ff, d))
