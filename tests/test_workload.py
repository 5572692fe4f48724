"""The loader: entry discovery in several styles, and one-line errors naming file and line for bad modules."""

from __future__ import annotations

import textwrap

import pytest

from pallasopt.errors import ExitCode, KernelError
from pallasopt.workload import inspect_source, load_source

HEAD = """
import functools
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

def _k(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0

def _call(x, bm):
    spec = pl.BlockSpec((bm, 128), lambda i: (i, 0))
    return pl.pallas_call(_k, grid=(x.shape[0] // bm,), in_specs=[spec], out_specs=spec,
                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)
"""
TAIL = """
def reference(x):
    return x + 1.0

def make_inputs(key, M=64):
    return (jax.random.normal(key, (M, 128)),)
"""


def module(body: str, head: str = HEAD, tail: str = TAIL) -> str:
    return head + textwrap.dedent(body) + tail


def test_entry_is_the_public_root_through_helpers() -> None:
    spec = inspect_source(module("def add_one(x):\n    return _call(x, 8)\n"), "k.py")
    assert spec.entry == "add_one"


def test_entry_through_functools_partial_with_entry_constant() -> None:
    src = module('add_one = functools.partial(_call, bm=8)\nENTRY = "add_one"\n')
    w = load_source(src, "k.py")
    assert w.spec.entry == "add_one" and w.dims == {"M": 64}


def test_public_wrapper_over_public_helper_picks_the_root() -> None:
    src = module("def inner(x):\n    return _call(x, 8)\n\ndef outer(x):\n    return inner(x)\n")
    assert inspect_source(src, "k.py").entry == "outer"


@pytest.mark.parametrize(
    ("source", "needle", "line"),
    [
        ("def f(:\n", "syntax error", 1),
        (
            module("def a(x):\n    return _call(x, 8)\n\ndef b(x):\n    return _call(x, 16)\n"),
            "two or more",
            None,
        ),
        (
            module("def a(x):\n    return x\n", head=HEAD.replace("pl.pallas_call", "jnp.add")),
            "no entry",
            None,
        ),
        (
            module("def a(x):\n    return _call(x, 8)\n", tail=TAIL.replace("def reference", "def ref")),
            "no `reference`",
            1,
        ),
        (
            module("def a(x):\n    return _call(x, 8)\n", tail=TAIL.replace("make_inputs", "inputs")),
            "no `make_inputs`",
            1,
        ),
        (module('ENTRY = "nope"\ndef a(x):\n    return _call(x, 8)\n'), "not a top-level function", None),
    ],
)
def test_bad_modules_give_one_line_errors(source: str, needle: str, line: int | None) -> None:
    with pytest.raises(KernelError) as e:
        inspect_source(source, "bad.py")
    text = str(e.value)
    assert needle in text and text.startswith("bad.py:") and "\n" not in text
    assert e.value.exit_code == ExitCode.BAD_KERNEL
    if line is not None:
        assert e.value.line == line


def test_import_failure_names_the_line() -> None:
    src = module("def a(x):\n    return _call(x, 8)\n\nraise RuntimeError('boom')\n")
    with pytest.raises(KernelError) as e:
        load_source(src, "bad.py")
    assert "RuntimeError: boom" in str(e.value)
    assert e.value.line == src.splitlines().index("raise RuntimeError('boom')") + 1


def test_make_inputs_without_defaults_is_rejected() -> None:
    src = module("def a(x):\n    return _call(x, 8)\n", tail=TAIL.replace("M=64", "M"))
    with pytest.raises(KernelError, match="has no default"):
        load_source(src, "bad.py")


def test_trace_error_points_into_the_kernel_file() -> None:
    from pallasopt.ir.trace import trace_calls

    src = module("def a(x):\n    return _call(x, 7)\n")  # 7 rows: 64 // 7 grid, bad block
    w = load_source(src.replace("x_ref[...] + 1.0", "x_ref[...] @ x_ref[...]"), "bad.py")
    with pytest.raises(KernelError) as e:
        trace_calls(w)
    assert str(e.value).startswith("bad.py:") and "tracing the entry" in str(e.value)
