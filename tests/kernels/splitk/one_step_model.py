"""A linear layer with bias and ReLU written as LLM-generated kernels often are: the kernel a closure inside the
model's forward, a `PrefetchScalarGridSpec` with a one-step grid and every block the whole array (the weight
(in, out), read through a name), the result cast to the input's dtype. bf16 operands, the dot left in bf16."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

ENTRY = "forward"


def forward(x, w, b):
    def kernel(x_ref, w_ref, b_ref, o_ref):
        x_block = x_ref[:, :]
        w_block = w_ref[:, :]
        out = x_block @ w_block
        out = out.astype(jnp.float32) + b_ref[:][None, :]
        o_ref[:, :] = jnp.maximum(out, 0.0).astype(o_ref.dtype)

    batch, in_feat = x.shape
    out_feat = w.shape[1]
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((batch, out_feat), x.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=0,
            grid=(1,),
            in_specs=[
                pl.BlockSpec((batch, in_feat), lambda i: (0, 0)),
                pl.BlockSpec((in_feat, out_feat), lambda i: (0, 0)),
                pl.BlockSpec((out_feat,), lambda i: (0,)),
            ],
            out_specs=pl.BlockSpec((batch, out_feat), lambda i: (0, 0)),
        ),
    )(x, w, b)


def reference(x, w, b):
    out = jnp.dot(x, w, preferred_element_type=jnp.float32) + b
    return jnp.maximum(out, 0.0).astype(x.dtype)


def make_inputs(key, batch=128, in_feat=4096, out_feat=512):
    kx, kw, kb = jax.random.split(key, 3)
    x = jax.random.normal(kx, (batch, in_feat), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(kw, (in_feat, out_feat), jnp.float32) / jnp.sqrt(in_feat)).astype(jnp.bfloat16)
    b = 0.1 * jax.random.normal(kb, (out_feat,), jnp.float32)
    return x, w, b


CHECK_DIMS = {"batch": 16, "in_feat": 512, "out_feat": 128}
TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}
