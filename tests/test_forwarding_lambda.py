"""Kernels behind a forwarding lambda (`pl.pallas_call(lambda q_ref, o_ref: _kernel(q_ref, o_ref, window=W), ...)`,
as LLM-written kernels and fused_21 bind their static values): the passes that edit only the kernel's body reach
it through the lambda and give the same choices as on the plain kernel; the results pass the oracle. Passes that
add a ref (pad-in-kernel, reshape-in-kernel) pass it through the lambda (tests/test_pad_in_kernel.py)."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from conftest import TEST_KERNELS

from pallasopt.cost_model.hardware import get_chip
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.ir.matchers import Located, find_call_node, forwarding_lambda, kernel_body, kernel_function
from pallasopt.passes.registry import parse_pipeline
from pallasopt.passes.skip_masked_blocks import SkipMaskedBlocksPass
from pallasopt.passes.skip_masked_chunks import SkipMaskedChunksPass

V5E = get_chip("v5e")


def through_a_lambda(source: str) -> str:
    """`source` with its first pallas_call's kernel (a name, or `functools.partial(fn, k=v, ...)`) passed as a
    forwarding lambda over the function's positional parameters, the partial's keywords bound in the lambda."""
    module = cst.parse_module(source)
    call = next(n for n in _calls(module) if _name(n.func) == "pallas_call")
    first = call.args[0].value
    keywords = ""
    if isinstance(first, cst.Call):  # functools.partial(fn, ...)
        keywords = "".join(f", {a.keyword.value}={module.code_for_node(a.value)}" for a in first.args[1:] if a.keyword)
        first = first.args[0].value
    assert isinstance(first, cst.Name)
    fn = next(s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == first.value)
    refs = ", ".join(p.name.value for p in fn.params.params)
    lam = cst.parse_expression(f"lambda {refs}: {first.value}({refs}{keywords})")
    return module.deep_replace(call.args[0].value, lam).code  # type: ignore[union-attr]


def _calls(module: cst.Module) -> list[cst.Call]:
    import libcst.matchers as m

    return [n for n in m.findall(module, m.Call()) if isinstance(n, cst.Call)]


def _name(func: cst.BaseExpression) -> str:
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else ""


CASES = [
    (SkipMaskedBlocksPass, TEST_KERNELS / "sliding_window_attention.py"),
    (SkipMaskedBlocksPass, TEST_KERNELS / "causal_offset_attention.py"),
    (SkipMaskedChunksPass, TEST_KERNELS / "loops" / "window_loop_attention.py"),
]  # grid-order: test_grid_order_renumbers_program_ids_in_the_forwarded_kernel


@pytest.mark.parametrize("cls, path", CASES, ids=[f"{c.name}-{p.stem}" for c, p in CASES])
def test_body_passes_reach_the_kernel_through_the_lambda(cls, path) -> None:
    plain = KernelIR.from_file(path)
    wrapped = KernelIR.from_source(through_a_lambda(plain.source), str(path))
    assert "lambda" in wrapped.source and wrapped.source != plain.source
    loc = Located.of(wrapped.module)
    node = find_call_node(loc, wrapped.calls[0])
    assert kernel_function(loc, node) is None  # the form the signature-editing passes decline
    assert kernel_body(loc, node) is not None
    want = cls.choices(plain, V5E)
    assert want and cls.choices(wrapped, V5E) == want


@pytest.mark.slow
@pytest.mark.parametrize("cls, path", CASES, ids=[f"{c.name}-{p.stem}" for c, p in CASES])
def test_their_choices_through_the_lambda_pass_the_oracle(cls, path) -> None:
    wrapped = KernelIR.from_source(through_a_lambda(path.read_text()), str(path))
    choices = cls.choices(wrapped, V5E)[:2]
    sources = [c.apply(wrapped).source for c in choices]
    assert all("lambda" in s for s in sources)
    results = check_many(sources, str(path))
    assert all(r.ok for r in results), [r.message for r in results]


@pytest.mark.parametrize(
    "text, forwards",
    [
        ("lambda a, b: f(a, b)", True),
        ("lambda a, b: f(a, b, window=8)", True),
        ("lambda a, b: f(a, b, 8, scale)", True),  # values of its own after the refs, positionally
        ("lambda a, b: f(b, a)", False),  # reordered
        ("lambda a, b: f(a)", False),  # one dropped
        ("lambda a, b: f(a, b, a)", False),  # a ref twice
        ("lambda a, b: f(a, b, n=a.shape[0])", False),  # a value that reads a ref
        ("lambda a, b=1: f(a, b)", False),  # a default
        ("lambda *refs: f(*refs)", False),
        ("lambda a, b: g.f(a, b)", False),  # not a plain function name
    ],
)
def test_what_counts_as_a_forwarding_lambda(text: str, forwards: bool) -> None:
    lam = cst.parse_expression(text)
    assert isinstance(lam, cst.Lambda)
    got = forwarding_lambda(lam)
    assert (got is not None) == forwards, text
    if forwards:
        assert got is not None and got.value == "f"


def test_grid_order_renumbers_program_ids_in_the_forwarded_kernel() -> None:
    src = textwrap.dedent(
        """
        import jax
        import jax.numpy as jnp
        from jax.experimental import pallas as pl

        def k(x_ref, o_ref, scale):
            o_ref[...] = x_ref[...] * scale + pl.program_id(0).astype(jnp.float32) * 1000 + pl.program_id(1)

        def f(x):
            return pl.pallas_call(lambda x_ref, o_ref: k(x_ref, o_ref, 2.0), grid=(x.shape[0] // 8, x.shape[1] // 128),
                                  in_specs=[pl.BlockSpec((8, 128), lambda i, j: (i, j))],
                                  out_specs=pl.BlockSpec((8, 128), lambda i, j: (i, j)),
                                  out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)

        def reference(x):
            i = jnp.arange(x.shape[0])[:, None] // 8
            j = jnp.arange(x.shape[1])[None, :] // 128
            return x * 2.0 + i * 1000.0 + j

        def make_inputs(key, M=32, N=256):
            return (jax.random.normal(key, (M, N)),)
        """
    )
    ir = KernelIR.from_source(src, "k.py")
    (p,) = parse_pipeline("grid-order{call=0,order=1:0}")
    new = p.apply(ir)
    assert "pl.program_id(1).astype(jnp.float32) * 1000 + pl.program_id(0)" in new.source
    (result,) = check_many([new.source], "k.py")
    assert result.ok, result.message
