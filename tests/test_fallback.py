"""The written kernel works at every size the original did (issue 17, item 8): fallback.py.

The 8x128 `add_one` of test_bad_input.py tuned to 64-row blocks (what `tile{BM=64}` writes) has a grid of M // 64
steps: at M=32, the original's own check size, that is zero steps and an all-NaN output, while the original (8-row
blocks) is right. The module pallasopt writes keeps the original for such sizes.
"""

from __future__ import annotations

import ast

import pytest
from test_bad_input import GOOD

from pallasopt.fallback import generalize, other_dims, with_fallback
from pallasopt.harness.check import check
from pallasopt.workload import load_source

TUNED = GOOD.replace("BM = 8\n", "BM = 64\n", 1)
SEEDS = (7919, 104729)


@pytest.mark.slow
def test_the_written_module_runs_the_original_where_the_tuned_blocks_do_not_fit(tmp_path) -> None:
    path = str(tmp_path / "add_one.py")
    assert not check(TUNED, path, seeds=SEEDS, dims={"M": 32}).ok  # what pallasopt wrote before: NaN at M=32
    workload = load_source(GOOD, path)
    g = generalize(TUNED, GOOD, path, workload, {"M": 128}, {"M": 32}, SEEDS)
    assert g.ok, g
    assert [(c["dims"], c["path"], c["ok"]) for c in g.checks] == [
        ({"M": 128}, "optimized", True),
        ({"M": 32}, "original", True),
    ]
    doc = ast.get_docstring(ast.parse(g.source)) or ""
    assert "pallasopt tuned `add_one` for the dims {'M': 2048, 'N': 128}" in doc, doc
    r = check(g.source, path, seeds=SEEDS, dims={"M": 40})  # neither tuned nor checked before, not a multiple of 64
    assert r.ok, r.message


# Right when the grid covers at least 64 rows: the original (8-row blocks) is wrong at its own M=32, the tuned one
# (64-row blocks) right at M=128.
SMALL_WRONG = GOOD.replace(
    "    o_ref[...] = x_ref[...] + 1.0\n",
    "    rows = pl.num_programs(0) * x_ref.shape[0]\n    o_ref[...] = x_ref[...] + jnp.where(rows < 64, 2.0, 1.0)\n",
)


@pytest.mark.slow
def test_a_size_where_the_original_fails_too_is_not_held_against_the_optimized_module(tmp_path) -> None:
    """The module fails at the other size; the original is checked there only then, fails too, and the verdict
    says so (ok, with a note) instead of blaming the optimization."""
    assert SMALL_WRONG != GOOD
    path = str(tmp_path / "add_one.py")
    tuned = SMALL_WRONG.replace("BM = 8\n", "BM = 64\n", 1)
    workload = load_source(SMALL_WRONG, path)
    g = generalize(tuned, SMALL_WRONG, path, workload, {"M": 128}, {"M": 32}, SEEDS)
    assert g.ok and "does not pass at {'M': 32} either" in g.note, g
    assert [(c["dims"], c["path"], c["ok"]) for c in g.checks] == [({"M": 128}, "optimized", True)]


def test_the_entry_dispatches_on_argument_shapes() -> None:
    shapes = [((2048, 128),), ((128, 128),)]
    source = with_fallback(TUNED, GOOD, "add_one", {"M": 2048, "N": 128}, shapes)
    assert source is not None
    tree = ast.parse(source)
    defs = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert defs.count("add_one") == 1 and "_pallasopt_tuned_add_one" in defs
    namespace: dict[str, object] = {"__name__": "written", "__file__": "written.py"}
    exec(compile(source, "written.py", "exec"), namespace)
    assert namespace["_PALLASOPT_SHAPES"] == tuple(shapes)
    assert namespace["_PALLASOPT_ORIGINAL"] == GOOD  # kept verbatim
    assert namespace["BM"] == 64


def test_an_entry_that_is_not_a_def_or_an_assignment_gets_no_fallback() -> None:
    assert with_fallback(TUNED, GOOD, "not_there", {"M": 2048}, [((2048, 128),)]) is None


def test_the_other_size_is_the_originals_check_size_or_half_the_verified_one() -> None:
    assert other_dims({"M": 2048}, {"M": 128}, {"M": 32}) == {"M": 32}
    assert other_dims({"M": 2048}, {"M": 128}, {"M": 128}) == {"M": 64}
    assert other_dims({"M": 2048, "N": 7}, {"M": 256, "N": 7}, {}) == {"M": 128, "N": 7}
