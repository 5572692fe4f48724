"""Traced facts on each example: grid, block shapes, index-map dependence on grid axes, body work."""

from __future__ import annotations

import pytest


def by_name(call, name):
    return next(o for o in call.operands if o.name == name)


def test_matmul_facts(example_irs) -> None:
    (call,) = example_irs["matmul"].calls
    assert call.grid == (16, 16, 16)
    x, y, out = (by_name(call, n) for n in ("in0", "in1", "out0"))
    assert x.block_shape == y.block_shape == out.block_shape == (128, 128)
    assert x.index_map.depends_on == ((0,), (2,))
    assert y.index_map.depends_on == ((2,), (1,))
    assert out.index_map.depends_on == ((0,), (1,))
    assert call.revisited_axes() == (2,)  # k is a reduction: the output block stays put along it
    assert call.body.conditional_axes == (2,)
    assert call.flops == 2 * 2048**3
    assert x.dtype == "bfloat16" and out.dtype == "float32"
    assert call.span is not None and call.span[0] < call.span[1]


def test_softmax_facts(example_irs) -> None:
    (call,) = example_irs["softmax"].calls
    assert call.grid == (1024,)
    assert by_name(call, "in0").block_shape == (8, 2048)
    assert by_name(call, "out0").index_map.affine == ((1, 0), (0, 0))
    assert call.body.transcendental_elems == 8 * 2048 and call.body.mxu_flops == 0


def test_rmsnorm_facts_through_partial(example_irs) -> None:
    (call,) = example_irs["rmsnorm"].calls
    assert call.grid == (16384 // 16,)
    w = by_name(call, "in1")
    assert w.block_shape == (1, 4096) and w.index_map.axes == ()  # the weight block never moves
    assert call.revisited_axes() == ()


def test_elementwise_facts(example_irs) -> None:
    (call,) = example_irs["elementwise"].calls
    assert call.grid == (1024, 64)
    assert by_name(call, "in2").index_map.depends_on == ((), (1,))
    assert all(o.block_shape in ((8, 128), (1, 128)) for o in call.operands)


def test_attention_facts(example_irs) -> None:
    (call,) = example_irs["attention"].calls
    assert call.grid == (32, 16)
    k = by_name(call, "in1")
    assert k.block_shape == (1, 2048, 128) and k.index_map.depends_on == ((0,), (), ())
    assert len(call.body.dots) == 2
    assert call.body.mxu_flops == 2 * (2 * 128 * 2048 * 128)


@pytest.mark.parametrize("name", ["matmul", "softmax", "rmsnorm", "elementwise", "attention"])
def test_facts_serialize(example_irs, name) -> None:
    import json

    for call in example_irs[name].calls:
        json.dumps(call.to_dict())


def test_non_affine_and_data_dependent_index_maps() -> None:
    from pallasopt.ir.trace import trace_calls
    from pallasopt.workload import load_source

    src = """
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

def k(s_ref, x_ref, o_ref):
    o_ref[...] = x_ref[...]

def gather_rows(s, x):
    return pl.pallas_call(k, grid_spec=pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1, grid=(4,),
        in_specs=[pl.BlockSpec((8, 128), lambda i, s: (s[i], 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i, s: (i // 2, 0))),
        out_shape=jax.ShapeDtypeStruct((16, 128), jnp.float32))(s, x)

def reference(s, x):
    return x[:16]

def make_inputs(key, M=32):
    return (jnp.arange(4, dtype=jnp.int32), jax.random.normal(key, (M, 128)))
"""
    (call,) = trace_calls(load_source(src, "g.py"))
    x, out = call.operands
    assert x.index_map.data_dependent and x.index_map.affine is None
    assert out.index_map.affine is None and out.index_map.depends_on == ((0,), ())
    assert out.index_map.block_index((3,)) == (1, 0)
    assert call.num_scalar_prefetch == 1
