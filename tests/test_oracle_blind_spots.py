"""The oracle's blind spots (issue 17, items 1-7): wrong kernels that the previous oracle passed, each rejected with a
clear reason, next to a correct twin (the same file with the bug fixed) that still passes.

The wrong kernels live in tests/kernels/wrong/ (each marks its bug with `# BUG`); the twins are made here by text
replacement. The oracle runs in-process (`run_check`, the check child's body) to keep the file fast; the TOLERANCE
errors go through the CLI for the exit code and the one-line message.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from conftest import TEST_KERNELS

from pallasopt.cli import main
from pallasopt.harness import oracle
from pallasopt.workload import load_source

WRONG = TEST_KERNELS / "wrong"
SEEDS = (101, 202)


def check_source(src: str, path: Path) -> dict[str, Any]:
    return oracle.run_check(load_source(src, str(path)), SEEDS, None)


def check_file(name: str, fixes: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    path = WRONG / name
    src = path.read_text()
    for old, new in fixes:
        assert old in src, (name, old)
        src = src.replace(old, new)
    return check_source(src, path)


# (file, expected status, words in the message, the fix that makes the correct twin)
CASES: dict[str, tuple[str, str, str, tuple[tuple[str, str], ...]]] = {
    # item 1: right only in interpret mode
    "reduction-outermost": (
        "reduction_outermost.py",
        "pipelining",
        "visited at grid step",
        (
            ("grid=(k // BK, m // BM, n // BN),  # BUG-GRID", "grid=(m // BM, n // BN, k // BK),"),
            ("lambda kk, i, j: (i, kk)),  # BUG-MAPS", "lambda i, j, kk: (i, kk)),"),
            ("lambda kk, i, j: (kk, j))", "lambda i, j, kk: (kk, j))"),
            ("lambda kk, i, j: (i, j))", "lambda i, j, kk: (i, j))"),
            ("pl.program_id(0) == 0)  # BUG-AXIS", "pl.program_id(2) == 0)"),
        ),
    ),
    "parallel-reduction": (
        "parallel_reduction.py",
        "pipelining",
        'marked "parallel"',
        (('("parallel", "parallel", "parallel")),  # BUG', '("parallel", "parallel", "arbitrary")),'),),
    ),
    # item 2: non-affine index maps, judged by evaluating them over the whole grid at the default dims
    "permuted-map-gap": (
        "permuted_map_gap.py",
        "coverage",
        "never visited",
        (("grid=(min(nb, 32),),  # BUG", "grid=(nb,),"),),
    ),
    "permuted-map-revisit": (
        "permuted_map_revisit.py",
        "pipelining",
        "again at",
        (("(i * 5) % nb, 0))  # BUG", "(i * 7) % nb, 0))"),),
    ),
    # item 3: bugs invisible at small dims
    "first-program-ids": (
        "first_program_ids_only.py",
        "mismatch",
        "wide dims",
        (("ok = pl.program_id(0) < LIMIT  # BUG", "ok = True"),),
    ),
    "hard-coded-loop": (
        "hard_coded_loop.py",
        "mismatch",
        "wide dims",
        (("for c in range(4):  # BUG", "for c in range(x_ref.shape[1] // 128):"),),
    ),
    # item 5: systematic drops inside a fixed atol
    "softmax-drops-small": (
        "softmax_drops_small.py",
        "mismatch",
        "",
        (("o_ref[...] = jnp.where(p < 1e-3, 0.0, p)  # BUG", "o_ref[...] = p"),),
    ),
    # item 7: DMA-vs-DMA races
    "dma-write-write": (
        "dma_write_write.py",
        "race",
        "race detector",
        (
            (
                "    cur.start()  # BUG: starts while `nxt` still writes into buf\n    nxt.wait()\n",
                "    nxt.wait()\n    cur.start()\n",
            ),
        ),
    ),
    "dma-write-during-read": (
        "dma_write_during_read.py",
        "race",
        "race detector",
        (
            (
                "    refill.start()  # BUG: overwrites buf while `cout` still reads it\n    cout.wait()\n",
                "    cout.wait()\n    refill.start()\n",
            ),
        ),
    ),
    # caught before too (the DMA into buf races with the DMA out of it); kept with its twin
    "dma-prefetch-wrong-slot": (
        "dma_prefetch_wrong_slot.py",
        "deadlock",
        "no copy in flight",
        (("fetch(i + 1, slot).start()  # BUG", "fetch(i + 1, 1 - slot).start()  #"),),
    ),
    "dma-read-during-write": (
        "dma_read_during_write.py",
        "race",
        "race detector",
        (
            (
                "    cout.start()  # BUG: reads buf while `cin` is still writing it\n    cin.wait()\n",
                "    cin.wait()\n    cout.start()\n",
            ),
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_wrong_kernel_is_rejected(case: str) -> None:
    name, status, words, _fix = CASES[case]
    r = check_file(name)
    assert not r["ok"] and r["status"] == status, r
    assert words in r["message"], r["message"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_correct_twin_passes(case: str) -> None:
    name, _status, _words, fix = CASES[case]
    r = check_file(name, fix)
    assert r["ok"], r
    assert r["tolerance"], r


def test_softmax_drop_fails_on_a_systematic_row_error() -> None:
    r = check_file("softmax_drops_small.py")
    assert "elements outside" in r["message"] or "relative L2 error" in r["message"], r["message"]


def test_program_id_bug_beyond_the_wide_dims_is_caught_by_the_grid_sample() -> None:
    r = check_file("first_program_ids_only.py", (("LIMIT = 8", "LIMIT = 300"),))
    assert not r["ok"] and r["status"] == "mismatch", r
    assert "grid sample at the default dims" in r["message"], r["message"]


def test_grid_sample_is_reported_when_it_runs() -> None:
    r = check_file("first_program_ids_only.py", (("ok = pl.program_id(0) < LIMIT  # BUG", "ok = True"),))
    assert r["ok"], r
    assert any(n.startswith("grid sample at the default dims {") for n in r["notes"]), r["notes"]
    assert any(n.startswith("wide dims") for n in r["notes"]), r["notes"]


# Items 4 and 6: small elementwise modules written inline.
MODULE = """\
import types
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

{extra}

def _kernel(x_ref, w_ref, o_ref):
    o_ref[...] = {body}


def _call(x, w):
    spec = pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(
        _kernel, grid=(x.shape[0] // 8,), in_specs=[spec, spec], out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x, w)


def entry(x, w):
{entry}


def reference(x, w):
    return x * w


def make_inputs(key, M=32, N=128):
    kx, kw = jax.random.split({key})
    return (jax.random.normal(kx, (M, N), jnp.float32), {w})
{tail}
"""


def module(
    *,
    body: str = "x_ref[...] * w_ref[...]",
    entry: str = "return _call(x, w)",
    w: str = "jax.random.normal(kw, (M, N), jnp.float32)",
    key: str = "key",
    extra: str = "",
    tail: str = "",
) -> str:
    return MODULE.format(
        body=body, entry=textwrap.indent(textwrap.dedent(entry).strip(), "    "), w=w, key=key, extra=extra, tail=tail
    )


def test_inline_honest_module_passes(tmp_path) -> None:
    r = check_source(module(), tmp_path / "k.py")
    assert r["ok"], r
    assert len(r["seeds"]) >= 3, r["seeds"]


INPUT_ATTACKS = {
    # a zero weight: any kernel writing zeros passes
    "one-zero-input": (module(body="jnp.zeros_like(x_ref)", w="jnp.zeros((M, N), jnp.float32)"), "all zeros"),
    "constant-input": (module(body="x_ref[...]", w="jnp.ones((M, N), jnp.float32)"), "constant"),
    "ignores-key": (module(key="jax.random.key(0)"), "same"),
}


@pytest.mark.parametrize("name", sorted(INPUT_ATTACKS))
def test_inputs_that_do_not_test_the_kernel_are_rejected(tmp_path, name) -> None:
    src, words = INPUT_ATTACKS[name]
    r = check_source(src, tmp_path / "k.py")
    assert not r["ok"] and r["status"] == "inputs", r
    assert words in r["message"], r["message"]


def test_cache_from_the_third_call_is_caught(tmp_path) -> None:
    entry = """
    out = _call(x, w)
    if isinstance(out, jax.core.Tracer):
        return out
    _results.append(out)
    return _results[0] if len(_results) >= 3 else out
    """
    r = check_source(module(entry=entry, extra="_results = []"), tmp_path / "k.py")
    assert not r["ok"] and r["status"] == "mismatch", r
    assert "seed 303" in r["message"], r["message"]


@pytest.mark.parametrize(
    "tail",
    [
        "\n_clone = types.FunctionType(reference.__code__, globals())\n",
        "\n_code = reference.__code__\n_clone = lambda x, w: types.FunctionType(_code, globals())(x, w)\n",
    ],
    ids=["clone", "saved-code"],
)
def test_function_type_clone_of_reference_is_caught(tmp_path, tail) -> None:
    src = module(body="x_ref[...] * 0.0", entry="_call(x, w)\nreturn _clone(x, w)", tail=tail)
    r = check_source(src, tmp_path / "k.py")
    assert not r["ok"] and r["status"] == "calls-reference", r


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('{"rtol": 1e9, "atol": 1e9}', "looser than the bound"),
        ('{"rtol": float("nan"), "atol": 1e-3}', "not finite"),
        ('{"rtol": 1e-3, "atol": -1.0}', "negative"),
        ('{"rtol": "tight"}', "not a number"),
    ],
    ids=["loose", "nan", "negative", "not-a-number"],
)
def test_bad_tolerance_is_a_one_line_exit_3(capsys, tmp_path, value, words) -> None:
    src = module(body="jnp.zeros_like(x_ref)", tail=f"\n\nTOLERANCE = {value}\n")
    line = src.splitlines().index(f"TOLERANCE = {value}") + 1
    path = tmp_path / "tol.py"
    path.write_text(src)
    code = main(["check", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert len(err.splitlines()) == 1 and err.startswith("pallasopt: error: "), err
    assert f"{path}:{line}: TOLERANCE" in err and words in err, err


def test_every_verdict_reports_its_tolerance(tmp_path) -> None:
    ok = check_source(module(tail='\nTOLERANCE = {"rtol": 1e-4, "atol": 1e-4}\n'), tmp_path / "k.py")
    assert ok["ok"] and ok["tolerance"].startswith("TOLERANCE float32 rtol=0.0001 atol=0.0001"), ok["tolerance"]
    bad = check_source(module(body="x_ref[...] * w_ref[...] + 0.5"), tmp_path / "k.py")
    assert not bad["ok"] and bad["tolerance"].startswith("default float32 rtol=0.001"), bad["tolerance"]


# The grid sample patches `pl.program_id`; a module that imported `program_id` by name sees the sample's own step
# number instead. The restriction is then checked at the check dims, disagrees there, and the sample is not used:
# the correct kernel still passes, and the verdict says the sample was not used.
PROGRAM_ID_BY_NAME = """\
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import program_id


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + program_id(0).astype(jnp.float32)


def add_row_block(x):
    spec = pl.BlockSpec((8, x.shape[1]), lambda i: (i, 0))
    return pl.pallas_call(
        _kernel, grid=(x.shape[0] // 8,), in_specs=[spec], out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def reference(x):
    return x + (jnp.arange(x.shape[0]) // 8).astype(jnp.float32)[:, None]


def make_inputs(key, M=8192, N=128):
    return (jax.random.normal(key, (M, N), jnp.float32),)
"""


def test_grid_sample_that_cannot_restrict_the_module_is_not_used(tmp_path) -> None:
    r = check_source(PROGRAM_ID_BY_NAME, tmp_path / "k.py")
    assert r["ok"], r
    assert any("grid sample at the default dims: not used" in n for n in r["notes"]), r["notes"]
