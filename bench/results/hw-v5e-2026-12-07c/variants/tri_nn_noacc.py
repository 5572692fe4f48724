"""AlphaFold triangle multiplicative update, "outgoing" edges (AF2 supplement Algorithm 11).

  z' = LayerNorm(z);  a = mask * sigmoid(z' Wag) * (z' Wap);  b = mask * sigmoid(z' Wbg) * (z' Wbp)
  x[i, j, c] = sum_k a[i, k, c] * b[j, k, c]
  out = sigmoid(z' Wg) * (LayerNorm(x) Wo)

Default size N=768 residues, c_z=128 pair channels, c=128 hidden channels mirrors AlphaFold 3's largest
training crop (AF2 uses the same c_z=128, c=128). The triangle einsum is ~116 GFLOP and dominates.

Naive choices: only the einsum is a Pallas kernel; the layer norms, projections and gating stay in plain JAX.
a and b are transposed to channel-major (c, N, N) so the einsum becomes c independent matmuls a[c] @ b[c].T;
the grid walks one channel at a time over (c, i tiles, j tiles, k tiles) with literal 128x128 tiles and
accumulates in the f32 output block. Default dimension semantics and buffering.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "triangle_multiplication_outgoing"
CHECK_DIMS = {"n_res": 256, "c_z": 32, "c": 4}
TOLERANCE = {"rtol": 3e-2, "atol": 3e-2}
LN_EPS = 1e-5


def _tile_spec(index_map):
    return pl.BlockSpec((None, 768, 768), index_map)


def _outgoing_kernel(a_ref, b_ref, x_ref):
    x_ref[...] = jax.lax.dot_general(
        a_ref[...], b_ref[...], (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32
    )


def _triangle_einsum(a_cm: jax.Array, b_cm: jax.Array) -> jax.Array:
    """(c, N, N) x (c, N, N) -> (c, N, N) f32 with x[c, i, j] = sum_k a[c, i, k] b[c, j, k]."""
    C, N, _ = a_cm.shape
    return pl.pallas_call(
        _outgoing_kernel,
        grid=(C, N // 768, N // 768, N // 768),
        in_specs=[
            _tile_spec(lambda c, i, j, k: (c, i, k)),
            _tile_spec(lambda c, i, j, k: (c, k, j)),
        ],
        out_specs=_tile_spec(lambda c, i, j, k: (c, i, j)),
        out_shape=jax.ShapeDtypeStruct((C, N, N), jnp.float32),
    )(a_cm, b_cm)


def _layer_norm(x, scale_bias):
    x = x.astype(jnp.float32)
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + LN_EPS) * scale_bias[0] + scale_bias[1]


def _project(z, mask, ln_in, w_ab, b_ab, w_g, b_g):
    """Shared front half: normalised z, masked gated a and b (bf16), output gate."""
    zn = _layer_norm(z, ln_in)
    zb = zn.astype(z.dtype)
    ab = jnp.dot(zb, w_ab, preferred_element_type=jnp.float32) + b_ab
    a_g, a_p, b_g_, b_p = jnp.split(ab, 4, axis=-1)
    m = mask[..., None]
    a = (m * jax.nn.sigmoid(a_g) * a_p).astype(z.dtype)
    b = (m * jax.nn.sigmoid(b_g_) * b_p).astype(z.dtype)
    gate = jax.nn.sigmoid(jnp.dot(zb, w_g, preferred_element_type=jnp.float32) + b_g)
    return a, b, gate


def _finish(x, gate, ln_out, w_o, b_o, dtype):
    xn = _layer_norm(x, ln_out).astype(dtype)
    return (gate * (jnp.dot(xn, w_o, preferred_element_type=jnp.float32) + b_o)).astype(dtype)


def triangle_multiplication_outgoing(z, mask, ln_in, w_ab, b_ab, w_g, b_g, ln_out, w_o, b_o):
    """z (N, N, c_z) bf16, mask (N, N) f32 -> update (N, N, c_z) bf16."""
    a, b, gate = _project(z, mask, ln_in, w_ab, b_ab, w_g, b_g)
    x_cm = _triangle_einsum(jnp.transpose(a, (2, 0, 1)), jnp.transpose(b, (2, 1, 0)))
    return _finish(jnp.transpose(x_cm, (1, 2, 0)), gate, ln_out, w_o, b_o, z.dtype)


def reference(z, mask, ln_in, w_ab, b_ab, w_g, b_g, ln_out, w_o, b_o):
    a, b, gate = _project(z, mask, ln_in, w_ab, b_ab, w_g, b_g)
    x = jnp.einsum("ikc,jkc->ijc", a, b, preferred_element_type=jnp.float32)
    return _finish(x, gate, ln_out, w_o, b_o, z.dtype)


def make_inputs(key, n_res: int = 768, c_z: int = 128, c: int = 128):
    ks = jax.random.split(key, 13)

    def w(k, shape):
        return (jax.random.normal(k, shape, jnp.float32) * shape[0] ** -0.5).astype(jnp.bfloat16)

    def small(k, shape):
        return 0.1 * jax.random.normal(k, shape, jnp.float32)

    z = jax.random.normal(ks[0], (n_res, n_res, c_z), jnp.bfloat16)
    mask = (jax.random.uniform(ks[1], (n_res, n_res)) > 0.1).astype(jnp.float32)
    ln_in = jnp.stack([1.0 + small(ks[2], (c_z,)), small(ks[3], (c_z,))])
    ln_out = jnp.stack([1.0 + small(ks[4], (c,)), small(ks[5], (c,))])
    return (
        z,
        mask,
        ln_in,
        w(ks[6], (c_z, 4 * c)),
        small(ks[7], (4 * c,)),
        w(ks[8], (c_z, c_z)),
        small(ks[9], (c_z,)),
        ln_out,
        w(ks[10], (c, c_z)),
        small(ks[11], (c_z,)),
    )
