"""Sparse mixture-of-experts layer (Mixtral style): top-k softmax router + SwiGLU experts.

out[t] = sum over the top_k experts e of x[t] (renormalised router prob p[t, e]) * expert_e(x[t]), with
expert_e(x) = (silu(x @ Wg[e]) * (x @ Wu[e])) @ Wd[e]. Default size tokens=8192, d=4096, ff=14336,
8 experts, top-2 mirrors one Mixtral-8x7B MoE block over an 8192-token batch.

Naive choices: two pallas_calls. The router kernel computes logits and a softmax per 128-token tile (full
hidden and all experts in one block); top-k and renormalisation happen in plain JAX, producing a dense
(tokens, experts) combine-weight matrix that is zero for unselected experts. The expert kernel is DENSE: grid
(token tiles, experts, ff tiles) runs every expert on every token and multiplies by the combine weight, so
tokens not routed to an expert contribute exactly zero (experts/top_k = 4x the useful FLOPs, no gather, no
skipping). It accumulates into its f32 output block; the bf16 cast happens outside. Block sizes are locals,
grid specs are built in variables, default dimension semantics and buffering.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "moe_layer"
CHECK_DIMS = {"tokens": 256, "d": 256, "ff": 256, "experts": 4}
TOLERANCE = {"rtol": 3e-2, "atol": 3e-2}
TOP_K = 2


def _router_kernel(x_ref, wr_ref, probs_ref):
    logits = jnp.dot(x_ref[...], wr_ref[...], preferred_element_type=jnp.float32)
    logits = logits - jnp.max(logits, axis=-1, keepdims=True)
    e = jnp.exp(logits)
    probs_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)


def _expert_kernel(x_ref, comb_ref, wg_ref, wu_ref, wd_ref, o_ref):
    e, f = pl.program_id(1), pl.program_id(2)

    @pl.when((e == 0) & (f == 0))
    def _zero():
        o_ref[...] = jnp.zeros_like(o_ref)

    x = x_ref[...]
    gate = jnp.dot(x, wg_ref[...], preferred_element_type=jnp.float32)
    up = jnp.dot(x, wu_ref[...], preferred_element_type=jnp.float32)
    h = (jax.nn.silu(gate) * up).astype(x.dtype)
    comb = comb_ref[...]
    expert_col = jax.lax.broadcasted_iota(jnp.int32, comb.shape, 1) == e
    weight = jnp.sum(jnp.where(expert_col, comb, 0.0), axis=1, keepdims=True)  # (tm, 1)
    o_ref[...] += weight * jnp.dot(h, wd_ref[...], preferred_element_type=jnp.float32)


def moe_layer(x, w_router, w_gate, w_up, w_down, top_k: int = TOP_K):
    """x (tokens, d) bf16; w_router (d, E); w_gate/w_up (E, d, ff); w_down (E, ff, d) -> (tokens, d) bf16."""
    T, D = x.shape
    E, _, F = w_gate.shape

    router_tm = 128
    router_grid = pl.GridSpec(
        grid=(T // router_tm,),
        in_specs=[pl.BlockSpec((router_tm, D), lambda i: (i, 0)), pl.BlockSpec((D, E), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((router_tm, E), lambda i: (i, 0)),
    )
    probs = pl.pallas_call(_router_kernel, grid_spec=router_grid, out_shape=jax.ShapeDtypeStruct((T, E), jnp.float32))(
        x, w_router
    )

    top_p, top_idx = jax.lax.top_k(probs, top_k)
    top_p = top_p / jnp.sum(top_p, axis=-1, keepdims=True)
    combine = jnp.sum(jax.nn.one_hot(top_idx, E, dtype=jnp.float32) * top_p[..., None], axis=1)

    tm, tf = 128, 128
    expert_grid = pl.GridSpec(
        grid=(T // tm, E, F // tf),
        in_specs=[
            pl.BlockSpec((tm, D), lambda i, e, f: (i, 0)),
            pl.BlockSpec((tm, E), lambda i, e, f: (i, 0)),
            pl.BlockSpec((None, D, tf), lambda i, e, f: (e, 0, f)),
            pl.BlockSpec((None, D, tf), lambda i, e, f: (e, 0, f)),
            pl.BlockSpec((None, tf, D), lambda i, e, f: (e, f, 0)),
        ],
        out_specs=pl.BlockSpec((tm, D), lambda i, e, f: (i, 0)),
    )
    out = pl.pallas_call(_expert_kernel, grid_spec=expert_grid, out_shape=jax.ShapeDtypeStruct((T, D), jnp.float32))(
        x, combine, w_gate, w_up, w_down
    )
    return out.astype(x.dtype)


def reference(x, w_router, w_gate, w_up, w_down, top_k: int = TOP_K):
    logits = jnp.dot(x, w_router, preferred_element_type=jnp.float32)
    top_logits, top_idx = jax.lax.top_k(logits, top_k)
    top_w = jax.nn.softmax(top_logits, axis=-1)  # softmax over the selected experts only (Mixtral)
    out = jnp.zeros(x.shape, jnp.float32)
    for e in range(w_gate.shape[0]):
        gate = jnp.dot(x, w_gate[e], preferred_element_type=jnp.float32)
        up = jnp.dot(x, w_up[e], preferred_element_type=jnp.float32)
        h = (jax.nn.silu(gate) * up).astype(x.dtype)
        y = jnp.dot(h, w_down[e], preferred_element_type=jnp.float32)
        w_e = jnp.sum(jnp.where(top_idx == e, top_w, 0.0), axis=-1, keepdims=True)
        out = out + w_e * y
    return out.astype(x.dtype)


def make_inputs(key, tokens: int = 8192, d: int = 4096, ff: int = 14336, experts: int = 8):
    kx, kr, kg, ku, kd = jax.random.split(key, 5)

    def weight(k, shape):
        return (jax.random.normal(k, shape, jnp.float32) * shape[-2] ** -0.5).astype(jnp.bfloat16)

    x = jax.random.normal(kx, (tokens, d), jnp.bfloat16)
    return (
        x,
        weight(kr, (d, experts)),
        weight(kg, (experts, d, ff)),
        weight(ku, (experts, d, ff)),
        weight(kd, (experts, ff, d)),
    )
