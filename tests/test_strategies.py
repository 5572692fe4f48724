"""The search strategies (beam, evolve, random, exhaustive) on the shared funnel, driven by fake tiers: determinism,
the budget held, resume after an interruption, nothing unverified returned, lineage in the DB; and the run-level
fixes of issue 16 (report from the DB, --seed, one config object, hardware device kind, python -m, roofline)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT

from pallasopt.config import SearchConfig, check_seeds
from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import UsageError
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.optimize import final_seeds, optimize
from pallasopt.passes.tile import TilePass
from pallasopt.search.strategies import STRATEGIES
from pallasopt.search.tiers import TierResult, model_tier

V5E = get_chip("v5e")
SOFTMAX = ROOT / "examples" / "softmax.py"
NAMES = tuple(STRATEGIES)


def rows(ir: KernelIR) -> int:
    return ir.calls[0].operands[0].block_shape[0]


class Fake:
    """Compiler = model x 1.25; check fails for the block rows in `bad`; records every call and the seeds used."""

    def __init__(self, bad: frozenset[int] = frozenset()) -> None:
        self.bad = bad
        self.calls = {"model": 0, "compiler": 0, "check": 0, "hardware": 0}
        self.seeds: list[tuple[int, ...]] = []

    def model(self, ir: KernelIR) -> TierResult:
        self.calls["model"] += 1
        return model_tier(ir, V5E)

    def compiler(self, ir: KernelIR) -> TierResult | None:
        self.calls["compiler"] += 1
        t = model_tier(ir, V5E).time_s
        return TierResult("compiler", True, (t or 0.0) * 1.25, "fake table")

    def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
        self.calls["check"] += 1
        self.seeds.append(tuple(seeds))
        return TierResult("check", rows(ir) not in self.bad, None, "fake check")

    def hardware(self, ir: KernelIR) -> TierResult | None:
        return None


@pytest.fixture(scope="module")
def softmax_ir() -> KernelIR:
    return KernelIR.from_file(SOFTMAX)


def search(ir: KernelIR, tiers: Fake, strategy: str, **kw: object):
    cfg = SearchConfig(**{"beam": 2, "depth": 2, "jobs": 1, "strategy": strategy, **kw})  # type: ignore[arg-type]
    return STRATEGIES[strategy](ir, (TilePass,), tiers, V5E, cfg)


@pytest.mark.parametrize("strategy", NAMES)
def test_each_strategy_is_deterministic_and_returns_only_verified(softmax_ir, strategy) -> None:
    a, b = search(softmax_ir, Fake(), strategy), search(softmax_ir, Fake(), strategy)
    assert a.best.recipe == b.best.recipe and sorted(a.nodes) == sorted(b.nodes) and a.strategy == strategy
    assert a.best.passed("check") and a.best is not a.baseline
    # The winner fails its check: it is never returned, and a verified other one is.
    bad = search(softmax_ir, Fake(bad=frozenset({rows(a.best.ir)})), strategy)
    assert bad.best.passed("check") and rows(bad.best.ir) != rows(a.best.ir)


@pytest.mark.parametrize("strategy", NAMES)
def test_each_strategy_holds_the_candidate_budget(softmax_ir, strategy) -> None:
    out = search(softmax_ir, Fake(), strategy, max_candidates=4)
    assert len(out.nodes) <= 4


def test_exhaustive_finds_the_optimum_and_others_do_not_beat_it(softmax_ir) -> None:
    ex = search(softmax_ir, Fake(), "exhaustive", depth=2)
    best = ex.score(ex.best)
    brute = min(s.time_s for n in ex.nodes.values() if n.passed("check") and (s := ex.score(n)) is not None)
    assert best is not None and best.time_s == brute
    # every depth-1 tile choice was reached (passes return their whole space; nothing truncated)
    assert len(TilePass.choices(softmax_ir, V5E)) <= sum(1 for n in ex.nodes.values() if n.depth == 1)
    for name in ("beam", "evolve", "random"):
        other = search(softmax_ir, Fake(), name)
        s = other.score(other.best)
        assert s is not None and s.time_s >= best.time_s


def _kernel(tmp_path):
    k = tmp_path / "softmax.py"
    k.write_text(SOFTMAX.read_text())
    return k


@pytest.mark.parametrize("strategy", ("evolve", "random", "exhaustive"))
def test_interrupted_strategy_resumes_without_redoing_evaluations(tmp_path, strategy) -> None:
    kernel = _kernel(tmp_path)
    cfg = SearchConfig(beam=2, depth=2, jobs=1, strategy=strategy, passes=("tile",))

    class Interrupting(Fake):
        def check(self, ir, seeds, deadline=None):
            if self.calls["check"] >= 2:
                raise KeyboardInterrupt
            return super().check(ir, seeds)

    first = Interrupting()
    with pytest.raises(KeyboardInterrupt):
        optimize(kernel, cfg, db_path=tmp_path / "k.db", evaluator=first)
    second = Fake()
    r = optimize(kernel, cfg, db_path=tmp_path / "k.db", evaluator=second, resume=True)
    reference = Fake()
    ref = optimize(kernel, cfg, db_path=tmp_path / "other.db", evaluator=reference)
    assert r.correct and r.recipe == ref.recipe and r.strategy == strategy
    assert second.calls["check"] == reference.calls["check"] - 2  # the two finished checks were not redone


class Digests(Fake):
    """A Fake that also records every compile (digest) and check (digest, seeds) it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: set[tuple[str, str]] = set()

    def compiler(self, ir):
        self.ran.add(("compiler", ir.digest))
        return super().compiler(ir)

    def check(self, ir, seeds, deadline=None):  # the final re-check's seeds differ: another evaluation
        self.ran.add(("check", f"{ir.digest} {tuple(seeds)}"))
        return super().check(ir, seeds)


def test_resumed_evolve_reloads_its_last_generation_and_continues(tmp_path) -> None:
    from pallasopt.db.store import KernelDB

    kernel = tmp_path / "matmul.py"  # tile alone has 176 choices here: every generation has offspring
    kernel.write_text((ROOT / "examples" / "matmul.py").read_text())
    cfg = SearchConfig(beam=1, depth=3, jobs=1, strategy="evolve", passes=("tile",))

    def stop_after_generation_2(event, info):
        if event == "depth" and info["depth"] == 2:  # generation 2 is recorded just before this event
            raise KeyboardInterrupt

    first = Digests()
    with pytest.raises(KeyboardInterrupt):
        optimize(kernel, cfg, db_path=tmp_path / "k.db", evaluator=first, progress=stop_after_generation_2)
    events: list[tuple[str, object]] = []
    second = Digests()
    r = optimize(
        kernel,
        cfg,
        db_path=tmp_path / "k.db",
        evaluator=second,
        resume=True,
        progress=lambda e, i: events.append((e, i)),
    )
    assert r.correct and r.strategy == "evolve"
    # it started from generation 2's population, not from the seed: the first generation it ran is 3
    restored = [i for e, i in events if e == "restored"]
    assert restored and restored[0]["generation"] == 2 and restored[0]["members"] >= 1
    assert [i["depth"] for e, i in events if e == "expanded"] == [3]
    # no compile or check finished by the first run was run again (the restored members came from the DB)
    assert first.ran and not (first.ran & second.ran)
    with KernelDB.open(tmp_path / "k.db") as db:
        (w,) = db.workloads()
        old, new = db.runs(w.id)[-2:]
        assert old.state == "interrupted" and new.state == "done"
        gens = {p.generation for p in db.population(new.id)}
        last_old = [p.candidate_id for p in db.population(old.id) if p.generation == 2]
        kept = [p.candidate_id for p in db.population(new.id) if p.generation == 2]
    assert gens == {2, 3} and kept == last_old  # the table continues: generation 2 as reloaded, then 3


def test_evolve_keeps_its_population_and_lineage_in_the_db(tmp_path) -> None:
    from pallasopt.db.store import KernelDB

    kernel = _kernel(tmp_path)
    # v5p: two TensorCores, so dimension-semantics is searched too (on v5e the softmax's space of distinct kernels
    # is used up after two generations)
    cfg = SearchConfig(beam=3, depth=3, jobs=1, strategy="evolve", seed=3, target="v5p")
    r = optimize(kernel, cfg, db_path=tmp_path / "k.db", evaluator=Fake())
    assert r.correct
    with KernelDB.open(tmp_path / "k.db") as db:
        (w,) = db.workloads()
        run = db.last_run(w.id)
        pop = db.population(run.id)
        cands = {c.id: c for c in db.candidates(w.id)}
        assert {p.generation for p in pop} == {1, 2, 3} and all(p.candidate_id in cands for p in pop)
        last = [cands[p.candidate_id] for p in sorted(pop, key=lambda p: p.rank) if p.generation == 3]

    # The result is the last generation's rank 0 (elitism: the best verified member never leaves; the population and
    # the outcome break score ties by one rule, `Funnel.rank_key`, so it is the same kernel, not just as fast).
    def time_of(source: str) -> float | None:
        return model_tier(KernelIR.from_source(source, str(kernel)), V5E).time_s

    best_time = time_of(last[0].source)
    assert best_time is not None and time_of(r.source) == best_time
    assert last[0].recipe == ",".join(r.recipe) and last[0].source == r.source
    with KernelDB.open(tmp_path / "k.db") as db:
        parents = {cid: db.parents(cid) for cid in cands}
    root = next(c for c in cands.values() if not c.recipe)
    assert parents[root.id] == []
    # every candidate but the root names its parents, and they were made before it
    assert all(ps and all(p < cid for p in ps) for cid, ps in parents.items() if cid != root.id)
    tree = {n["digest"]: n for n in r.nodes}
    assert all(n["parents"] for n in tree.values() if n["recipe"])


class _Cuts:
    """An rng whose randint returns the given cut points in turn (crossover's only draw)."""

    def __init__(self, *cuts: int) -> None:
        self.cuts = list(cuts)

    def randint(self, lo: int, hi: int) -> int:
        c = self.cuts.pop(0)
        assert lo <= c <= hi
        return c


def test_crossover_child_names_both_parents_and_the_db_keeps_them(tmp_path, softmax_ir) -> None:
    """Which crossovers a seeded run makes depends on the choice space (most reach an IR already seen, since passes
    commute); so the two-parent lineage is tested on a crossover made on purpose: a's whole recipe, then b's."""
    import time

    from pallasopt.db.store import KernelDB
    from pallasopt.search.cached import CachedEvaluator
    from pallasopt.search.evolve import crossover
    from pallasopt.search.funnel import Funnel

    kernel = _kernel(tmp_path)
    base = KernelIR.from_file(kernel)
    with KernelDB.open(tmp_path / "k.db") as db:
        wid = db.workload(base.digest, str(kernel), dict(base.dims), "v5e", {})
        ev = CachedEvaluator(Fake(), db, wid, "v5e")
        f = Funnel(base, ev, V5E, SearchConfig(beam=2, depth=2, jobs=1), clock=time.perf_counter)
        a = f.replay(f.root, (TilePass.choices(base, V5E)[0].spec(),))
        b = f.replay(f.root, ("vmem-limit{call=0,mib=32}",))
        assert a is not None and b is not None and a.digest != b.digest
        child = crossover(f, a, b, _Cuts(1, 0))  # type: ignore[arg-type]
        assert child is not None and child.ir is not None
        assert child.recipe == a.recipe + b.recipe and child.parents == (a.digest, b.digest)
        assert child.digest not in (a.digest, b.digest)
        ev.model(base)
        assert db.parents(ev.candidate_id(child.ir)) == [ev.candidate_id(a.ir), ev.candidate_id(b.ir)]


def test_a_crossover_child_is_not_filed_under_its_recipe_prefix(tmp_path) -> None:
    """search/cached.py used to take `recipe[:-1]` as the parent; the lineage the search tells wins now."""
    from pallasopt.db.store import KernelDB
    from pallasopt.search.cached import CachedEvaluator

    kernel = _kernel(tmp_path)
    base = KernelIR.from_file(kernel)
    a = TilePass.choices(base, V5E)[0].apply(base)
    b = TilePass.choices(base, V5E)[1].apply(base)
    child = TilePass.choices(a, V5E)[-1].apply(a)
    with KernelDB.open(tmp_path / "k.db") as db:
        wid = db.workload(base.digest, str(kernel), dict(base.dims), "v5e", {})
        ev = CachedEvaluator(Fake(), db, wid, "v5e")
        ev.lineage(child, (b, a))  # a crossover: b's head, a's tail
        ev.model(base)
        cid = ev.candidate_id(child)
        assert db.parents(cid) == [ev.candidate_id(b), ev.candidate_id(a)]
        assert db.candidate(cid).parent_id == ev.candidate_id(b)


# ---- issue 16's fixes ---------------------------------------------------------------------------------------------


def test_report_is_written_when_the_result_comes_from_the_db(tmp_path) -> None:
    kernel = _kernel(tmp_path)
    cfg = SearchConfig(beam=2, depth=1, jobs=1, passes=("tile",))
    first = optimize(kernel, cfg, db_path=tmp_path / "k.db", evaluator=Fake())
    again = optimize(kernel, cfg, db_path=tmp_path / "k.db", evaluator=Fake(), report_dir=tmp_path / "rep")
    assert again.from_cache and again.recipe == first.recipe and again.report_path
    md = (tmp_path / "rep" / "report.md").read_text()
    assert first.recipe[0] in md and "```diff" in md  # the recipe was replayed for its diff
    for f in ("roofline.png", "components.png", "search_tree.png", "candidates.json"):
        assert (tmp_path / "rep" / f).stat().st_size > 0


def test_seed_drives_the_check_seeds(tmp_path) -> None:
    kernel = _kernel(tmp_path)
    seen = {}
    for seed in (0, 2):
        tiers = Fake()
        cfg = SearchConfig(beam=2, depth=1, jobs=1, passes=("tile",), seed=seed)
        optimize(kernel, cfg, db_path=tmp_path / f"k{seed}.db", evaluator=tiers)
        seen[seed] = set(tiers.seeds)
    assert check_seeds(0) == (101, 202) and check_seeds(0) in seen[0] and final_seeds(0) in seen[0]
    assert check_seeds(2) in seen[2] and final_seeds(2) in seen[2] and not seen[0] & seen[2]


def test_optimize_takes_one_config_object(tmp_path) -> None:
    kernel = _kernel(tmp_path)
    cfg = SearchConfig(beam=2, depth=1, jobs=1, passes=("tile",))
    a = optimize(kernel, cfg, db_path=tmp_path / "a.db", evaluator=Fake())
    b = optimize(kernel, beam=2, depth=1, jobs=1, passes=("tile",), db_path=tmp_path / "b.db", evaluator=Fake())
    assert a.recipe == b.recipe
    with pytest.raises(UsageError, match="unknown option 'beam_width'"):
        optimize(kernel, beam_width=3, db_path=tmp_path / "c.db", evaluator=Fake())
    with pytest.raises(UsageError, match="unknown search strategy"):
        SearchConfig(strategy="annealing")


def test_hardware_is_keyed_by_the_device_it_ran_on(tmp_path, monkeypatch) -> None:
    import pallasopt.harness.timing as timing
    from pallasopt.db.store import KernelDB
    from pallasopt.search.cached import CachedEvaluator
    from pallasopt.search.tiers import Tiers

    base = KernelIR.from_file(_kernel(tmp_path))
    # the probe sees the target's chip but the timing child ran on another: no time is taken from it
    monkeypatch.setattr(timing, "accelerator_kind", lambda: "tpu: TPU v5 lite")
    monkeypatch.setattr(
        timing,
        "time_kernel",
        lambda source, path, timeout_s=None: {"ok": True, "median_s": 1e-3, "device": "tpu: TPU v4"},
    )
    r = Tiers(V5E).hardware(base)
    assert r is not None and not r.ok and "timed on TPU v4, not the target v5e" in r.message

    class Timed(Fake):
        def __init__(self, kind: str) -> None:
            super().__init__()
            self.kind = kind

        def device_kind(self) -> str:
            return self.kind

        def hardware(self, ir):
            self.calls["hardware"] += 1
            return TierResult("hardware", True, 1e-3, "fake", {"device": f"tpu: {self.kind}"})

    with KernelDB.open(tmp_path / "k.db") as db:
        wid = db.workload(base.digest, "k.py", dict(base.dims), "v5e", {})
        one, other = Timed("TPU v5 lite"), Timed("TPU v6 lite")
        CachedEvaluator(one, db, wid, "v5e").hardware(base)
        CachedEvaluator(one, db, wid, "v5e").hardware(base)  # served from the DB
        CachedEvaluator(other, db, wid, "v5e").hardware(base)  # another chip: not served the first one's time
        keys = {e.key for e in db.evaluations(wid, tier="hardware")}
    assert one.calls["hardware"] == 1 and other.calls["hardware"] == 1
    assert keys == {"v5e;device=TPU v5 lite", "v5e;device=TPU v6 lite"}


def test_python_dash_m_pallasopt_runs_the_cli() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "pallasopt", "run", "--help"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0 and "--strategy" in p.stdout and "exhaustive" in p.stdout


def test_roofline_points_are_intensity_and_attained_flops() -> None:
    from pallasopt.report.render import roofline_points

    node = {
        "digest": "d",
        "time_s": 2e-3,
        "model_s": 1e-3,
        "tiers": {"model": {"data": {"calls": [{"flops": 4e9, "bytes": 2e6}, {"flops": 0, "bytes": 2e6}]}}},
    }
    ((ai, flops_s, n),) = roofline_points([node, {"digest": "x", "time_s": None, "model_s": None, "tiers": {}}])
    assert ai == pytest.approx(4e9 / 4e6) and flops_s == pytest.approx(4e9 / 2e-3) and n is node


def test_evolve_mutations_favour_the_head_of_a_ranked_list_yet_reach_its_tail() -> None:
    import random

    from pallasopt.search.evolve import pick

    options = [TilePass(call=0, sizes=(("bm", 8 * (i + 1)),)) for i in range(100)]
    rng = random.Random(0)
    ranks = [options.index(pick(options, rng)) for _ in range(2000)]
    assert sorted(ranks)[len(ranks) // 2] <= 3  # median rank: the model-best head dominates
    assert max(ranks) >= 80  # the uniform share still explores the whole space
    assert pick(options[:1], rng) is options[0]


def test_evolve_change_moves_one_parameter_when_it_can() -> None:
    from pallasopt.search.evolve import neighbours

    def t(**sizes: int) -> TilePass:
        return TilePass(call=0, sizes=tuple(sizes.items()))

    options = [t(bm=512, bn=256), t(bm=512, bn=512), t(bm=256, bn=512), t(bm=256), t(bm=128, bn=128)]
    got = [o.spec() for o in neighbours(options, "tile{call=0,bm=256,bn=256}")]
    # one size moved (bn dropped from a spec means it is back at the module's own value: one change too)
    assert got == ["tile{call=0,bm=512,bn=256}", "tile{call=0,bm=256,bn=512}", "tile{call=0,bm=256}"]
    assert neighbours(options, "not-a-pass{x=1}") == []
