"""ir/matchers.py: alias lookup under every import form, call sites, spec lists, renaming, builders (no tracing)."""

from __future__ import annotations

import libcst as cst
import pytest

from pallasopt.ir.builders import index_map_expr, rename_names, tuple_expr
from pallasopt.ir.matchers import (
    Located,
    blockspec_parts,
    call_site,
    code,
    jnp_alias,
    kernel_function,
    kernel_refs,
    pallas_call_nodes,
    pl_alias,
    pltpu_alias,
    spec_list,
)


@pytest.mark.parametrize(
    ("imports", "pl", "pltpu", "jnp"),
    [
        ("import jax.numpy as jnp\nfrom jax.experimental import pallas as pl", "pl", None, "jnp"),
        ("from jax import numpy as np_\nimport jax.experimental.pallas as P", "P", None, "np_"),
        ("import jax\nfrom jax.experimental import pallas", "pallas", None, "jax.numpy"),
        ("import jax as j\nfrom jax.experimental.pallas import tpu as T", "pl", "T", "j.numpy"),
        ("import jax.experimental.pallas.tpu as pltpu", "pl", "pltpu", None),
        ("import jax.experimental.pallas.tpu", "pl", "jax.experimental.pallas.tpu", "jax.numpy"),
        ("import numpy as np", "pl", None, None),
    ],
)
def test_aliases_under_every_import_form(imports: str, pl: str, pltpu: str | None, jnp: str | None) -> None:
    module = cst.parse_module(imports + "\n")
    assert (pl_alias(module), pltpu_alias(module), jnp_alias(module)) == (pl, pltpu, jnp)


SRC = """
import jax
from jax.experimental import pallas as pl

def kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2

def direct(x):
    return pl.pallas_call(kernel, grid=(2,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
                          out_specs=pl.BlockSpec(block_shape=(8, 128), index_map=lambda i: (i, 0)),
                          out_shape=x)(x)

def named(x):
    specs = [pl.BlockSpec((8, 128), lambda i: (i, 0))]
    f = pl.pallas_call(kernel, grid_spec=pl.GridSpec(grid=(2,), in_specs=specs, out_specs=specs[0]), out_shape=x)
    y = x + 1
    return f(y)
"""


def test_call_sites_specs_and_kernel() -> None:
    loc = Located.of(cst.parse_module(SRC))
    first, second = pallas_call_nodes(loc)
    site1, site2 = call_site(loc, first), call_site(loc, second)
    assert site1 is not None and [code(o) for o in site1.operands] == ["x"]
    assert site2 is not None and [code(o) for o in site2.operands] == ["y"]
    assert [code(s) for s in spec_list(loc, first, "in_specs") if s] == ["pl.BlockSpec((8, 128), lambda i: (i, 0))"]
    assert len(spec_list(loc, second, "in_specs")) == 1  # through `specs` and the GridSpec
    shape, imap = blockspec_parts(spec_list(loc, first, "out_specs")[0])
    assert shape is not None and code(shape) == "(8, 128)" and imap is not None and code(imap) == "lambda i: (i, 0)"
    fn = kernel_function(loc, first)
    assert fn is not None and kernel_refs(fn) == ("x_ref", "o_ref")


def test_rename_keeps_attributes_and_keywords() -> None:
    body = cst.parse_module("o_ref[...] = x.o_ref + f(o_ref=o_ref.shape)\n")
    assert rename_names(body, {"o_ref": "acc"}).code == "acc[...] = x.o_ref + f(o_ref=acc.shape)\n"


def test_builders() -> None:
    assert code(tuple_expr(["a"])) == "(a,)"
    assert code(tuple_expr(["i", "j + 1"])) == "(i, j + 1)"
    assert code(index_map_expr(["i", "j"], ["i", "0"])) == "lambda i, j: (i, 0)"
    assert code(index_map_expr([], ["0"])) == "lambda: (0,)"
