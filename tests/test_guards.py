"""Reward-hack guards of the correctness oracle: kernels that would pass a naive check without computing the answer.

Each attack is checked twice: with the oracle as it is (the guard must reject it with its own status) and, where the
guard can be switched off, with the guard disabled, to show that the attack really passes without it (so the first
test fails if the guard is removed). The oracle runs in-process here (`run_check`, the child's body) to keep the file
fast; one attack also goes through the public `check()` and its child process.
"""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallasopt.harness import oracle
from pallasopt.harness.check import check
from pallasopt.harness.interpret import interpret_mode
from pallasopt.workload import Workload, load_source

SEEDS = (101, 202)

HEADER = """\
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

"""

# An elementwise kernel over (8, N) row blocks; {body} is the kernel's store, {entry} the entry's body.
TEMPLATE = (
    HEADER
    + """\
def _kernel(x_ref, o_ref):
    {body}


def _call(x):
    m, n = x.shape
    spec = pl.BlockSpec((8, n), lambda i: (i, 0))
    return pl.pallas_call(
        _kernel,
        grid=(m // 8,),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct({out_shape}, {out_dtype}),
    )(x)


def add_one(x):
{entry}


def reference(x):
    {reference}


def make_inputs(key, M={m}, N=128):
    return ({inputs},)
{extra}"""
)


def module(
    *,
    body: str = "o_ref[...] = x_ref[...] + 1.0",
    entry: str = "return _call(x)",
    reference: str = "return x + 1.0",
    out_shape: str = "x.shape",
    out_dtype: str = "x.dtype",
    inputs: str = "jax.random.normal(key, (M, N), jnp.float32)",
    m: int = 32,
    extra: str = "",
) -> str:
    return TEMPLATE.format(
        body=body,
        entry=textwrap.indent(textwrap.dedent(entry).strip(), "    "),
        reference=reference,
        out_shape=out_shape,
        out_dtype=out_dtype,
        inputs=inputs,
        m=m,
        extra=extra,
    )


def run(src: str, tmp_path: Path, seeds: tuple[int, ...] = SEEDS) -> dict[str, Any]:
    path = tmp_path / "kernel.py"
    path.write_text(src)
    return oracle.run_check(load_source(src, str(path)), seeds, None)


def load(src: str, tmp_path: Path) -> Workload:
    path = tmp_path / "kernel.py"
    path.write_text(src)
    return load_source(src, str(path))


@contextlib.contextmanager
def _reference_enabled(module: Any) -> Iterator[Any]:
    """The guard switched off: kernel code sees the working `reference`."""

    class Guard:
        original = module.reference
        calls = 0

    yield Guard


def test_honest_kernel_passes(tmp_path) -> None:
    r = run(module(), tmp_path)
    assert r["ok"], r["message"]


# (a) An entry that returns the reference's output. The oracle disables `reference` while kernel code runs: the
# module attribute is swapped for a function that raises, and (for a plain function) its code object too, so an alias
# taken at import time trips as well; a call that the entry swallows still counts. Without the guard every one of these
# passes, since the entry's output is exactly the reference's.
CALLS_REFERENCE = {
    "direct": module(body="o_ref[...] = x_ref[...] * 2.0", entry="_call(x)\nreturn reference(x)"),
    "alias": module(
        body="o_ref[...] = x_ref[...] * 2.0", entry="_call(x)\nreturn _oracle(x)", extra="\n\n_oracle = reference\n"
    ),
    "swallowed": module(
        body="o_ref[...] = x_ref[...] + 1.0",
        entry="out = _call(x)\ntry:\n    return reference(x)\nexcept Exception:\n    return out",
    ),
    "jitted": module(
        body="o_ref[...] = x_ref[...] * 2.0",
        entry="return _jitted(x)",
        extra="\n\n_jitted = jax.jit(lambda x: reference(x) + 0 * _call(x))\n",
    ),
}


@pytest.mark.parametrize("name", sorted(CALLS_REFERENCE))
def test_entry_calling_reference_is_rejected(tmp_path, name) -> None:
    r = run(CALLS_REFERENCE[name], tmp_path)
    assert not r["ok"] and r["status"] == "calls-reference", r
    assert "called `reference`" in r["message"]


@pytest.mark.parametrize("name", ["direct", "alias"])
def test_entry_calling_reference_passes_without_the_guard(tmp_path, monkeypatch, name) -> None:
    monkeypatch.setattr(oracle, "reference_disabled", _reference_enabled)
    r = run(CALLS_REFERENCE[name], tmp_path)
    assert r["ok"], r


def test_entry_calling_reference_is_rejected_through_the_child(tmp_path) -> None:
    src = CALLS_REFERENCE["direct"]
    r = check(src, str(tmp_path / "kernel.py"))
    assert not r.ok and r.status == "calls-reference", r


def test_reference_is_restored_after_the_check(tmp_path) -> None:
    w = load(CALLS_REFERENCE["alias"], tmp_path)
    ref = w.module.reference
    oracle.run_check(w, SEEDS, None)
    x = jnp.ones((8, 128), jnp.float32)
    assert w.module.reference is ref and float(ref(x)[0, 0]) == 2.0
    assert float(w.module._oracle(x)[0, 0]) == 2.0


# The other direction: a reference that runs the kernel makes the comparison vacuous. (On the CPU the oracle runs the
# reference outside interpret mode, where a pallas_call fails; the attack below runs it in interpret mode, as it would
# run compiled on a TPU.)
REFERENCE_RUNS_KERNEL = module(body="o_ref[...] = x_ref[...] * 2.0", reference="return _call(x)")


def test_reference_running_the_kernel_is_rejected(tmp_path, monkeypatch) -> None:
    w = load(REFERENCE_RUNS_KERNEL, tmp_path)
    plain = w.module.reference

    def reference(x: Any) -> Any:
        with interpret_mode(False):
            return plain(x)

    w.module.reference = reference
    r = oracle.run_check(w, SEEDS, None)
    assert r["status"] == "reference-kernel", r
    monkeypatch.setattr(oracle, "_runs_pallas", lambda fn, structs: False)
    assert oracle.run_check(w, SEEDS, None)["ok"]


# (b) A kernel that caches its result across calls, keyed by shape: the second seed gets the first seed's answer.
# Caught because every seed draws fresh inputs; with one input set repeated it passes.
CACHING = module(
    entry="""
    key = (x.shape, str(x.dtype))
    if isinstance(x, jax.core.Tracer):
        return _call(x)
    if key not in _CACHE:
        _CACHE[key] = _call(x)
    return _CACHE[key]
    """,
    extra="\n\n_CACHE = {}\n",
)


def test_result_cached_across_calls_is_caught_by_fresh_seeds(tmp_path) -> None:
    r = run(CACHING, tmp_path)
    assert r["status"] == "mismatch" and r["message"].startswith("seed 202:"), r


def test_result_cached_across_calls_passes_with_one_input_set(tmp_path, monkeypatch) -> None:
    # the guard off: the seeds are taken as given (not made distinct) and repeated inputs are not rejected
    monkeypatch.setattr(oracle, "extend_seeds", lambda seeds: tuple(seeds))
    monkeypatch.setattr(oracle, "inputs_problem", lambda per_seed: "")
    assert run(CACHING, tmp_path, seeds=(101, 101))["ok"]


# (c) Exact shape and dtype. The inputs are bf16-exact and the kernel doubles them, so a bf16 output holds exactly the
# reference's values: only the dtype (or, below, the shape) is wrong.
BF16_EXACT = "jax.random.normal(key, (M, N), jnp.float32).astype(jnp.bfloat16).astype(jnp.float32)"
WRONG_DTYPE = module(
    body="o_ref[...] = (x_ref[...] * 2.0).astype(o_ref.dtype)",
    reference="return x * 2.0",
    out_dtype="jnp.bfloat16",
    inputs=BF16_EXACT,
)
WRONG_SHAPE = module(
    body="o_ref[...] = x_ref[...] * 2.0",
    entry="return _call(x).reshape(-1)",
    reference="return x * 2.0",
)


@pytest.mark.parametrize(
    ("src", "needle"),
    [
        (WRONG_DTYPE, "kernel gives bfloat16[16, 64], reference float32[16, 64]"),
        (WRONG_SHAPE, "kernel gives float32[1024], reference float32[16, 64]"),
    ],
)
def test_output_shape_and_dtype_must_match_exactly(tmp_path, src, needle) -> None:
    r = run(src, tmp_path)
    assert r["status"] == "shape" and needle in r["message"], r
    w = load(src, tmp_path)
    args = w.make_inputs(jax.random.key(SEEDS[0]))
    with interpret_mode(False):
        out = np.asarray(w.entry(*args))
    ref = np.asarray(w.reference(*args))
    assert np.array_equal(out.astype(np.float32).reshape(ref.shape), ref)  # same values: only the guard catches it


# (d) Large magnitudes: a softmax without max subtraction is right on N(0, 1) inputs and overflows (inf/inf = NaN) on
# the same inputs scaled by 1e4, where jax.nn.softmax stays finite.
NAIVE_SOFTMAX = module(
    body="e = jnp.exp(x_ref[...])\n    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)",
    reference="return jax.nn.softmax(x, axis=-1)",
)
SAFE_SOFTMAX = module(
    body="s = x_ref[...]\n    e = jnp.exp(s - jnp.max(s, axis=-1, keepdims=True))\n"
    "    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)",
    reference="return jax.nn.softmax(x, axis=-1)",
)


def test_overflow_on_large_inputs_is_caught(tmp_path, monkeypatch) -> None:
    r = run(NAIVE_SOFTMAX, tmp_path)
    assert r["status"] == "overflow" and "scaled by 10000" in r["message"], r
    monkeypatch.setattr(oracle, "_overflow_problem", lambda *a: "")
    assert run(NAIVE_SOFTMAX, tmp_path)["ok"]


def test_stable_softmax_passes_the_large_input_set(tmp_path) -> None:
    r = run(SAFE_SOFTMAX, tmp_path)
    assert r["ok"], r["message"]


def test_large_input_set_is_skipped_where_the_dtype_cannot_hold_it(tmp_path) -> None:
    # float16 inputs of magnitude ~10 scaled by 1e4 overflow (max 65504) before the kernel sees them: the set is
    # skipped, not failed.
    src = NAIVE_SOFTMAX.replace(
        "jax.random.normal(key, (M, N), jnp.float32)", "10 * jax.random.normal(key, (M, N), jnp.float16)"
    )
    assert "jnp.float16" in src
    w = load(src, tmp_path)
    args = w.make_inputs(jax.random.key(1), M=32)
    assert oracle._overflow_problem(w.entry, w.reference, args, False) == ""


# (e) Unwritten output: the kernel skips the last row block, where the reference is zero. The interpreter starts
# outputs as NaN, so the skipped block fails; were outputs zero-initialized, the kernel would match exactly.
UNWRITTEN = module(
    body="@pl.when(pl.program_id(0) < pl.num_programs(0) - 1)\n    def _():\n        o_ref[...] = x_ref[...]",
    reference="return jnp.where(jnp.arange(x.shape[0])[:, None] < x.shape[0] - 8, x, 0.0)",
)


def test_unwritten_output_fails(tmp_path) -> None:
    r = run(UNWRITTEN, tmp_path)
    assert r["status"] == "nan" and "NaN" in r["message"], r
    w = load(UNWRITTEN, tmp_path)
    args = w.make_inputs(jax.random.key(SEEDS[0]), M=32)
    with interpret_mode(False):
        out = np.asarray(w.entry(*args))
    assert np.isnan(out[-8:]).all()
    assert np.array_equal(np.nan_to_num(out, nan=0.0), np.asarray(w.reference(*args)))


# Not-deterministic: the entry keeps a call counter that perturbs the result by 1e-7 (well inside the tolerance).
NONDETERMINISTIC = module(
    body="o_ref[...] = x_ref[...] + 1.0 + 1e-6 * _CALLS[0]",
    entry="_CALLS[0] += 1\nreturn _call(x)",
    extra="\n\n_CALLS = [0]\n",
)


def test_nondeterministic_kernel_is_caught(tmp_path, monkeypatch) -> None:
    r = run(NONDETERMINISTIC, tmp_path)
    assert r["status"] == "nondeterministic" and "second run on the same inputs" in r["message"], r
    monkeypatch.setattr(oracle, "_determinism_problem", lambda *a: "")
    assert run(NONDETERMINISTIC, tmp_path)["ok"]


# Coverage at the default dims: a grid of M // 8 leaves rows unwritten when 8 does not divide M. The small CHECK_DIMS
# are divisible, so only the trace at the default dims shows it.
UNCOVERED = module(m=2052, extra='\n\nCHECK_DIMS = {"M": 32}\n')


def test_grid_not_covering_the_default_dims_is_caught(tmp_path, monkeypatch) -> None:
    r = run(UNCOVERED, tmp_path)
    assert r["status"] == "coverage" and "writes only 2048 of the 2052" in r["message"], r
    monkeypatch.setattr(oracle, "coverage_problem", lambda *a: "")
    r = run(UNCOVERED, tmp_path)  # the exact evaluation of the index maps sees the gap too
    assert r["status"] == "coverage" and "never visited" in r["message"], r
    monkeypatch.setattr(oracle, "pipelining_problem", lambda call: ("", True))
    assert run(UNCOVERED, tmp_path)["ok"]


def test_a_grid_with_no_steps_is_a_coverage_failure_not_a_crash(tmp_path, monkeypatch) -> None:
    """`grid=(m // 8,)` at m = 4 has no step: evaluating the output's index map over no grid point crashed the check
    ("cannot reshape array of size 0", JAXBench gpt53 level2 57_/49_/71_/100_, session 35) instead of saying that
    nothing is written."""
    monkeypatch.setattr(oracle, "coverage_problem", lambda *a: "")  # the exact evaluation alone
    r = run(module(m=4), tmp_path)
    assert r["status"] == "coverage" and "1 of its 1 blocks are never visited" in r["message"], r


def test_cdiv_grid_covers_the_default_dims(tmp_path) -> None:
    src = UNCOVERED.replace("grid=(m // 8,)", "grid=(pl.cdiv(m, 8),)")
    r = run(src, tmp_path)
    assert r["ok"], r["message"]
