"""Kernel modules that reproduce a tokamax autotuning point: the entry calls tokamax's own Pallas kernel (its `_fwd`,
which skips tokamax's device check so it traces on a CPU) with the point's config, at the point's shapes.

Each function returns module source text in pallasopt's kernel format (entry, reference, make_inputs with the
problem's dims as defaults), or raises `Unsupported` with why (a bias, a boolean mask, group sizes tokamax did not
record, ...). Inputs are random; group sizes are the recorded ones.
"""

from __future__ import annotations

import re
from typing import Any

from fidelity_data import Point

_DTYPES = {"bf16": "bfloat16", "f32": "float32", "f16": "float16", "s8": "int8", "i8": "int8"}


class Unsupported(Exception):
    pass


def parse_array(text: str) -> tuple[str, tuple[int, ...]]:
    """'bf16[32,4096,8,128]' -> ('bfloat16', (32, 4096, 8, 128))."""
    m = re.fullmatch(r"(\w+)\[([\d,]*)\]", text or "")
    if not m or m.group(1) not in _DTYPES:
        raise Unsupported(f"array spec {text!r}")
    return _DTYPES[m.group(1)], tuple(int(d) for d in m.group(2).split(",") if d)


def module_for(point: Point) -> str:
    if point.family == "flash_attention":
        return flash_attention_module(point.problem, point.config_dict)
    if point.family == "ragged_dot":
        return ragged_dot_module(point.problem, point.config_dict, point.device)
    raise Unsupported(f"no reproduction for {point.op}")


def flash_attention_module(problem: dict[str, Any], config: dict[str, Any]) -> str:
    mask = problem.get("mask") or {}
    if problem.get("bias") or problem.get("dropout_rate") or problem.get("paging_info"):
        raise Unsupported("bias, dropout or paging")
    if any(mask.get(k) is not None for k in ("bool_mask", "q_start", "q_end", "k_start", "k_end")):
        raise Unsupported("a mask other than causal / none")
    if problem.get("q_indices") or problem.get("k_indices"):
        raise Unsupported("q/k indices")
    dq, q = parse_array(problem["q"])
    _, k = parse_array(problem["k"])
    _, v = parse_array(problem["v"])
    if len(q) != 4 or dq != "bfloat16":
        raise Unsupported(f"q {problem['q']}")
    precision = problem.get("precision") or ["BF16_BF16_F32", "BF16_BF16_F32"]
    cfg = ", ".join(
        f"{name}={config[name]}" for name in ("block_q", "block_kv", "block_kv_compute") if name in config
    )
    layouts = ", ".join(
        f"{name}=splash.QKVLayout({int(config.get(name, 1))})" for name in ("q_layout", "k_layout", "v_layout")
    )
    flags = (
        f"use_experimental_scheduler={bool(config.get('use_experimental_scheduler', True))}, "
        f"use_base2_exp={bool(config.get('use_base2_exp', True))}"
    )
    return f'''"""tokamax flash attention (Pallas Mosaic TPU, splash), one autotuning point: q {problem["q"]}, k
{problem["k"]}, v {problem["v"]}, causal={bool(mask.get("is_causal"))}, config {config}."""

import jax
import jax.numpy as jnp
from tokamax._src.ops.attention import base
from tokamax._src.ops.attention import pallas_mosaic_tpu as fa

splash = fa.splash
CONFIG = fa.Config({cfg}, {layouts}, {flags})
PRESETS = (jax.lax.DotAlgorithmPreset.{precision[0]}, jax.lax.DotAlgorithmPreset.{precision[1]})


def attention(q, k, v):
    out, _ = fa.PallasMosaicTpuFlashAttention()._fwd(
        q, k, v, precision=PRESETS, logits_dtype=jnp.dtype("{problem.get("logits_dtype") or "float32"}"),
        logits_scale={float(problem.get("logits_scale") or q[-1] ** -0.5)!r}, bias=None,
        logits_soft_cap={problem.get("logits_soft_cap")!r}, mask=base.Mask(is_causal={bool(mask.get("is_causal"))}),
        dropout_mask=None, dropout_rate=0.0, paging_info=None, q_indices=None, k_indices=None,
        normalize_output={bool(problem.get("normalize_output", True))},
        return_residuals={bool(problem.get("return_residuals"))}, config=CONFIG,
    )
    return out


def reference(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal={bool(mask.get("is_causal"))})


def make_inputs(key, B={q[0]}, T={q[1]}, S={k[1]}, H={q[2]}, HK={k[2]}, D={q[3]}, DV={v[3]}):
    a, b, c = jax.random.split(key, 3)
    return (
        jax.random.normal(a, (B, T, H, D), jnp.float32).astype(jnp.bfloat16),
        jax.random.normal(b, (B, S, HK, D), jnp.float32).astype(jnp.bfloat16),
        jax.random.normal(c, (B, S, HK, DV), jnp.float32).astype(jnp.bfloat16),
    )
'''


DEVICE_KINDS = {"tpu_v5_lite": "TPU v5 lite", "tpu7x": "TPU7x"}  # jax.devices()[0].device_kind on those chips


def ragged_dot_module(problem: dict[str, Any], config: dict[str, Any], device: str = "tpu_v5_lite") -> str:
    sizes = problem.get("group_sizes")
    if not isinstance(sizes, list):
        raise Unsupported("group sizes not recorded (only their count and total)")
    dims = (problem.get("ragged_dot_dimension_numbers") or {}).get("dot_dimension_numbers")
    if dims != [[[1], [1]], [[], []]] or problem.get("activation"):
        raise Unsupported("not the forward layout (lhs [M, K] x rhs [G, K, N]) or an activation")
    dl, lhs = parse_array(problem["lhs"])
    dr, rhs = parse_array(problem["rhs"])
    if dl != "bfloat16" or dr != "bfloat16":
        raise Unsupported("not bf16")
    device_kind = DEVICE_KINDS[device]
    tiling = ", ".join(f"{k}={config[k]}" for k in ("tile_m", "tile_k", "tile_n", "input_buffer_count") if k in config)
    return f'''"""tokamax ragged dot (Pallas Mosaic TPU, megablox gmm), one autotuning point: lhs {problem["lhs"]}, rhs
{problem["rhs"]}, group sizes {sizes}, config {config}."""

import jax
import jax.numpy as jnp
from tokamax._src.ops.ragged_dot import pallas_mosaic_tpu as rd

CONFIG = rd.Config({tiling})
GROUP_SIZES = {sizes}


def ragged(lhs, rhs, group_sizes):
    # megablox asks JAX for the TPU's info at trace time: trace under an abstract TPU device of the measured kind.
    from jax._src.mesh import AbstractDevice

    device = AbstractDevice(device_kind="{device_kind}", num_cores=1, platform="tpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), (jax.sharding.AxisType.Auto,), abstract_device=device)
    with jax.sharding.use_abstract_mesh(mesh):
        return _ragged(lhs, rhs, group_sizes)


def _ragged(lhs, rhs, group_sizes):
    out, _ = rd.PallasMosaicTpuRaggedDot()._fwd(
        lhs, rhs, group_sizes=group_sizes, ragged_dot_dimension_numbers=rd.DEFAULT_RAGGED_DOT_DIM_NUMS,
        precision=(jax.lax.Precision.DEFAULT, jax.lax.Precision.DEFAULT), preferred_element_type=None,
        return_residuals={bool(problem.get("return_residuals"))}, config=CONFIG,
    )
    return out


def reference(lhs, rhs, group_sizes):
    return jax.lax.ragged_dot(lhs, rhs, group_sizes)


def make_inputs(key, M={lhs[0]}, K={lhs[1]}, N={rhs[2]}, G={rhs[0]}):
    a, b = jax.random.split(key)
    return (
        jax.random.normal(a, (M, K), jnp.float32).astype(jnp.bfloat16),
        jax.random.normal(b, (G, K, N), jnp.float32).astype(jnp.bfloat16),
        jnp.array(_scaled(GROUP_SIZES, M), jnp.int32),
    )


def _scaled(sizes, m, m0={lhs[0]}):
    """The recorded group sizes at m rows (scaled for the compiler tier's reduced dims; exact at the default)."""
    out = [g * m // m0 for g in sizes]
    out[-1] += m - sum(out)
    return out
'''
