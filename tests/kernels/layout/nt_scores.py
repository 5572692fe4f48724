"""Per-head attention scores q @ k.T on (B, H, S, D) arrays with squeezed batch/head block dims: the body reads
the K block once into a local and uses it both as the right operand of an NT dot_general (a module-level
dimension-numbers constant) and as `k.T` in a jnp.dot."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BLOCK = 128
NT = (((1,), (1,)), ((), ()))  # a @ b.T


def _scores_kernel(q_ref, k_ref, o_ref):
    q = q_ref[...]
    k = k_ref[...]
    s = jax.lax.dot_general(q, k, NT, preferred_element_type=jnp.float32)
    o_ref[...] = s + 0.5 * jnp.dot(q, k.T, preferred_element_type=jnp.float32)


def scores(q, k):
    B, H, S, D = q.shape
    return pl.pallas_call(
        _scores_kernel,
        grid=(B, H, S // BLOCK, S // BLOCK),
        in_specs=[
            pl.BlockSpec((None, None, BLOCK, D), lambda b, h, i, j: (b, h, i, 0)),
            pl.BlockSpec((None, None, BLOCK, D), lambda b, h, i, j: (b, h, j, 0)),
        ],
        out_specs=pl.BlockSpec((None, None, BLOCK, BLOCK), lambda b, h, i, j: (b, h, i, j)),
        out_shape=jax.ShapeDtypeStruct((B, H, S, S), jnp.float32),
    )(q, k)


def reference(q, k):
    return 1.5 * jnp.einsum("bhqd,bhkd->bhqk", q, k)


def make_inputs(key, B=1, H=2, S=256, D=128):
    kq, kk = jax.random.split(key)
    return jax.random.normal(kq, (B, H, S, D), jnp.float32), jax.random.normal(kk, (B, H, S, D), jnp.float32)


CHECK_DIMS = {"B": 1, "H": 2, "S": 256, "D": 128}
TOLERANCE = {"rtol": 1e-4, "atol": 1e-3}
