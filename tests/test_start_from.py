"""Warm starts (`SearchConfig.start_from`, `run --start-from`, `bench --start-from`): an earlier run's best recipe is
replayed, re-verified like any candidate and kept unless the search finds better; one that no longer replays or
fails a tier is dropped with a reason, and the search goes on."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from test_search import V5E, FakeTiers

from pallasopt.bench.rows import Row
from pallasopt.bench.runner import start_recipes
from pallasopt.cli import main
from pallasopt.config import SearchConfig
from pallasopt.errors import UsageError
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.optimize import hardware_only_starts, optimize, select_passes
from pallasopt.passes.tile import TilePass
from pallasopt.search.strategies import run_strategy

MATMUL = ROOT / "examples" / "matmul.py"


@pytest.fixture(scope="module")
def matmul_ir() -> KernelIR:
    return KernelIR.from_file(MATMUL)


def search(ir, tiers, strategy="beam", events=None, **kw):
    cfg = SearchConfig(**{"beam": 4, "depth": 2, "jobs": 1, "strategy": strategy, **kw})
    say = (lambda k, i: events.append((k, i))) if events is not None else None
    return run_strategy(strategy, ir, (TilePass,), tiers, V5E, cfg, progress=say)


def t(out) -> float:
    s = out.score(out.best)
    assert s is not None and s.time_s is not None
    return s.time_s


class Favoured(FakeTiers):
    """The fake compiler says row blocks of 64 run 3x faster than the model thinks: the model never ranks such a
    tile among the few it sends to the compiler, so a narrow search cannot find it; an earlier run had."""

    def compiler(self, ir):
        r = super().compiler(ir)
        if r is not None and r.ok and self.bm(ir) == 64:
            return type(r)("compiler", True, r.time_s / 20, "fake table: favoured")
        return r


FOUND = ("tile{call=0,bm=64,bn=512,bk=512}",)  # what the earlier run found


@pytest.fixture(scope="module")
def earlier(matmul_ir):
    """The start recipe's time, and the best of the same narrow search without it."""
    alone = search(matmul_ir, Favoured(), beam=1)
    start = search(matmul_ir, Favoured(), beam=1, depth=0, start_from=(FOUND,))
    assert t(start) < t(alone) and start.best.recipe == FOUND
    return FOUND, t(start), t(alone)


@pytest.mark.parametrize(("strategy", "depth"), [("beam", 2), ("evolve", 2), ("random", 2), ("exhaustive", 1)])
def test_a_start_recipe_is_reverified_and_kept_unless_beaten(matmul_ir, earlier, strategy, depth) -> None:
    recipe, found, alone = earlier
    out = search(matmul_ir, Favoured(), strategy, beam=1, depth=depth, start_from=(recipe,))
    start = next(n for n in out.nodes.values() if n.recipe == recipe)
    assert start.passed("check") and "compiler" in start.results  # through the tiers again, not taken on trust
    assert t(out) <= found < alone  # the same search without it ends at `alone`


def test_a_start_recipe_that_fails_its_check_is_dropped_and_never_returned(matmul_ir, earlier) -> None:
    recipe, _, _ = earlier
    events: list = []
    out = search(matmul_ir, Favoured(bad_bm=frozenset({64})), events=events, beam=1, start_from=(recipe,))
    assert out.best.recipe != recipe and FakeTiers.bm(out.best.ir) != 64
    assert out.best is not out.baseline  # the search went on from the root
    dropped = [i for k, i in events if k == "start" and "dropped" in i]
    assert dropped == [{"recipe": list(recipe), "dropped": "failed the check tier"}]


def test_a_recipe_that_does_not_replay_is_dropped_with_a_reason(matmul_ir) -> None:
    events: list = []
    bad = ("tile{call=7,bm=512}",)  # no call 7 in this kernel
    out = search(matmul_ir, FakeTiers(), events=events, start_from=(bad,))
    assert [i for k, i in events if k == "start"] == [
        {"recipe": list(bad), "dropped": "does not replay on this kernel"}
    ]
    assert out.best is not out.baseline


def test_config_takes_recipes_not_a_pipeline_string() -> None:
    assert SearchConfig(start_from=[["tile{call=0,bm=256}"]]).start_from == (("tile{call=0,bm=256}",),)
    for bad in ("tile{call=0,bm=256}", ["tile{call=0,bm=256}"], [[1]]):
        with pytest.raises(UsageError, match="start_from takes recipes"):
            SearchConfig(start_from=bad)  # type: ignore[arg-type]


def test_bench_reads_each_kernels_correct_best_recipes(tmp_path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"rows": [
        {"kernel": "k1", "recipe": ["tile{call=0,bm=512}"], "correct": True},
        {"kernel": "k2", "recipe": ["tile{call=0,bm=64}"], "correct": False},  # wrong: never a start
        {"kernel": "k3", "recipe": [], "correct": True},  # the baseline was best: nothing to replay
    ]}))  # fmt: skip
    b.write_text(json.dumps({"rows": [
        {"kernel": "k1", "recipe": ["tile{call=0,bm=512}"], "correct": True},
        {"kernel": "k1", "recipe": ["tile{call=0,bm=256}", "fuse{producer=0}"], "correct": True},
    ]}))  # fmt: skip
    assert start_recipes([a, b]) == {"k1": (("tile{call=0,bm=512}",), ("tile{call=0,bm=256}", "fuse{producer=0}"))}
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2]")
    with pytest.raises(UsageError, match=r"junk\.json: not bench results"):
        start_recipes([junk])


def test_a_row_says_when_it_kept_the_start_recipe() -> None:
    start = (("tile{call=0,bm=512}",),)
    kept = Row(kernel="k", path="k.py", correct=True, recipe=start[0], started_from=start, notes=("a note",))
    beaten = Row(kernel="k", path="k.py", correct=True, recipe=("tile{call=0,bm=1024}",), started_from=start)
    assert kept.kept_start and not beaten.kept_start
    again = Row.from_dict(json.loads(json.dumps(kept.to_dict())))
    assert again == kept and again.to_dict()["kept_start"]


def test_run_refuses_a_malformed_start_recipe_before_loading_the_kernel(tmp_path, capsys) -> None:
    rc = main(["run", str(MATMUL), "--start-from", "tile{call=0,bm}", "-o", str(tmp_path / "o.py")])
    assert rc == 2
    assert "needs a value" in capsys.readouterr().err


def test_a_start_recipe_at_the_depth_limit_is_still_expanded(matmul_ir) -> None:
    """`depth` bounds the steps this run adds: a start recipe as deep as the limit gets children (a bench rerun at
    depth 2 from depth-2 recipes tries a third step, e.g. fold-last-step after two tiles)."""
    out = search(matmul_ir, Favoured(), beam=2, depth=1, start_from=(FOUND,))
    deeper = [n for n in out.nodes.values() if n.recipe[:1] == FOUND and len(n.recipe) == 2]
    assert deeper and all(n.depth == 2 for n in deeper)
    assert any("model" in n.results for n in deeper)


def test_a_start_recipe_with_a_chip_only_step_is_left_out_without_a_chip() -> None:
    """A pass whose gain only the chip shows (`stage-masked`: a compiler-tier gain that was a chip loss on
    fused_33) is not offered by a deviceless search, so a warm start must not carry it in either."""
    staged = ("tile{call=0,Q_ROWS=512}", "stage-masked{call=0,operand=0,block=256}")
    piped = ("pipeline{call=0,depth=3}",)
    plain = ("tile{call=0,bm=512}", "fuse{producer=0}")
    kept, notes = hardware_only_starts((staged, piped, plain), select_passes([]))
    assert kept == (plain,)
    assert len(notes) == 2 and "stage-masked only pays where the chip times it" in notes[0]
    assert "pipeline" in notes[1] and "--passes" in notes[1]
    assert hardware_only_starts((staged, piped, plain), select_passes([], hardware=True)) == (
        (staged, piped, plain),
        (),
    )
    named = select_passes(["tile", "stage-masked"])  # named: the user asked for it
    assert hardware_only_starts((staged, plain), named) == ((staged, plain), ())
    assert "stage-masked" not in {p.name for p in select_passes([])}


def test_optimize_says_which_start_recipe_it_left_out(tmp_path) -> None:
    kernel = tmp_path / "matmul.py"
    kernel.write_text(MATMUL.read_text())
    recipe = (*FOUND, "pipeline{call=0,depth=3}")
    r = optimize(kernel, beam=1, depth=1, db_path=tmp_path / "k.db", evaluator=FakeTiers(), jobs=1,
                 write_output=False, start_from=(recipe,))  # fmt: skip
    assert r.correct and tuple(r.recipe[: len(recipe)]) != recipe
    assert any(n.startswith(f"start recipe {','.join(recipe)} not used: pipeline") for n in r.notes)
