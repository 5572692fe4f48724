"""3x3 conv (NHWC, SAME) followed by inference batchnorm and ReLU, f32, as two pallas_calls.

Default size: x (32, 56, 56, 64), w (3, 3, 64, 128), batchnorm gamma/beta/mean/var of shape (128,). Naive choices:
the first kernel computes one output row per grid step (grid (N, H)), reading three input rows of a whole padded
image and doing nine small (W, Cin) x (Cin, Cout) dots; the conv result goes back to HBM in f32; a second
elementwise kernel over (256, 128) tiles applies the batchnorm and ReLU. Nothing is folded into the weights.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

EPS = 1e-5


def _conv_row_kernel(x_ref, w_ref, o_ref):
    h = pl.program_id(1)
    W = o_ref.shape[2]
    acc = jnp.zeros((W, o_ref.shape[3]), jnp.float32)
    for dy in range(3):
        for dx in range(3):
            row = x_ref[0, h + dy, pl.ds(dx, W), :]
            acc = acc + jnp.dot(row, w_ref[dy, dx], preferred_element_type=jnp.float32)
    o_ref[0, 0] = acc


def _bn_relu_kernel(y_ref, g_ref, b_ref, m_ref, v_ref, o_ref):
    inv = g_ref[...] * jax.lax.rsqrt(v_ref[...] + EPS)
    o_ref[...] = jnp.maximum((y_ref[...] - m_ref[...]) * inv + b_ref[...], 0.0)


def conv_bn_relu(x, w, gamma, beta, mean, var):
    N, H, W, Cin = x.shape
    Cout = w.shape[-1]
    xp = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    y = pl.pallas_call(
        _conv_row_kernel,
        grid=(N, H),
        in_specs=[
            pl.BlockSpec((1, H + 2, W + 2, Cin), lambda n, h: (n, 0, 0, 0)),
            pl.BlockSpec((3, 3, Cin, Cout), lambda n, h: (0, 0, 0, 0)),
        ],
        out_specs=pl.BlockSpec((1, 1, W, Cout), lambda n, h: (n, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((N, H, W, Cout), jnp.float32),
    )(xp, w)

    rows = N * H * W
    tm, tn = 256, 128
    vec = pl.BlockSpec((1, tn), lambda i, j: (0, j))
    tile = pl.BlockSpec((tm, tn), lambda i, j: (i, j))
    params = [p.reshape(1, Cout) for p in (gamma, beta, mean, var)]
    out = pl.pallas_call(
        _bn_relu_kernel,
        grid=(rows // tm, Cout // tn),
        in_specs=[tile, vec, vec, vec, vec],
        out_specs=tile,
        out_shape=jax.ShapeDtypeStruct((rows, Cout), x.dtype),
    )(y.reshape(rows, Cout), *params)
    return out.reshape(N, H, W, Cout)


def reference(x, w, gamma, beta, mean, var):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    y = (y - mean) / jnp.sqrt(var + EPS) * gamma + beta
    return jax.nn.relu(y)


def make_inputs(key, N=32, H=56, W=56, Cin=64, Cout=128):
    kx, kw, kg, kb, km, kv = jax.random.split(key, 6)
    x = jax.random.normal(kx, (N, H, W, Cin), jnp.float32)
    w = jax.random.normal(kw, (3, 3, Cin, Cout), jnp.float32) / jnp.sqrt(9.0 * Cin)
    gamma = 1.0 + 0.1 * jax.random.normal(kg, (Cout,), jnp.float32)
    beta = 0.1 * jax.random.normal(kb, (Cout,), jnp.float32)
    mean = 0.1 * jax.random.normal(km, (Cout,), jnp.float32)
    var = jax.random.uniform(kv, (Cout,), jnp.float32, 0.5, 1.5)
    return x, w, gamma, beta, mean, var


CHECK_DIMS = {"N": 2, "H": 16, "W": 16, "Cin": 32, "Cout": 256}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
