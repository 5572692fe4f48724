"""Four calls whose results the wrapper uses in ways the epilogue pass must not move into the kernel: reduced
(call 0), reshaped (call 1), read again later (call 2); call 3's epilogue reads call 2's result, computed before
it, which is fine."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _copy_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...]


def uses(x):
    M, N = x.shape
    spec = pl.BlockSpec((128, 128), lambda i, j: (i, j))
    grid, shape = (M // 128, N // 128), jax.ShapeDtypeStruct(x.shape, x.dtype)
    s = jnp.sum(pl.pallas_call(_copy_kernel, grid=grid, in_specs=[spec], out_specs=spec, out_shape=shape)(x), axis=0)
    t = pl.pallas_call(_copy_kernel, grid=grid, in_specs=[spec], out_specs=spec, out_shape=shape)(x).reshape(-1)
    y = pl.pallas_call(_copy_kernel, grid=grid, in_specs=[spec], out_specs=spec, out_shape=shape)(x)
    z = y * 2.0
    u = pl.pallas_call(_copy_kernel, grid=grid, in_specs=[spec], out_specs=spec, out_shape=shape)(x)
    return s, t, z + y + jnp.tanh(u + y)


def reference(x):
    return jnp.sum(x, axis=0), x.reshape(-1), x * 2.0 + x + jnp.tanh(2 * x)


def make_inputs(key, M=128, N=256):
    return (jax.random.normal(key, (M, N), jnp.float32),)


CHECK_DIMS = {"M": 128, "N": 256}
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}
