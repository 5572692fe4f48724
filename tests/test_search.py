"""Beam search and the kernel DB, driven by fakes: a fixed cost table and a dummy runner (milliseconds, no JAX
child processes), plus one real end-to-end run on the CPU tiers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import pytest
from conftest import ROOT

from pallasopt.config import SearchConfig
from pallasopt.cost_model.hardware import get_chip
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.optimize import optimize
from pallasopt.passes.base import Pass
from pallasopt.passes.tile import TilePass
from pallasopt.search.beam import BaselineIncorrect, beam_search
from pallasopt.search.funnel import UNVERIFIABLE
from pallasopt.search.tiers import TierResult, model_tier

V5E = get_chip("v5e")
MATMUL = ROOT / "examples" / "matmul.py"


class FakeTiers:
    """Compiler tier = a fixed table over block sizes; check fails for a chosen set; counts every call."""

    def __init__(self, bad_bm: frozenset[int] = frozenset(), compile_fail_bm: frozenset[int] = frozenset()) -> None:
        self.bad_bm = bad_bm
        self.compile_fail_bm = compile_fail_bm
        self.calls = {"model": 0, "compiler": 0, "check": 0, "hardware": 0}

    @staticmethod
    def bm(ir: KernelIR) -> int:
        return ir.calls[0].operands[0].block_shape[0]

    def model(self, ir: KernelIR) -> TierResult:
        self.calls["model"] += 1
        return model_tier(ir, V5E)

    def compiler(self, ir: KernelIR) -> TierResult | None:
        self.calls["compiler"] += 1
        if self.bm(ir) in self.compile_fail_bm:
            return TierResult("compiler", False, None, "vmem_oom: fake")
        t = model_tier(ir, V5E).time_s
        assert t is not None
        return TierResult("compiler", True, t * 1.25, "fake table")

    def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
        self.calls["check"] += 1
        return TierResult("check", self.bm(ir) not in self.bad_bm, None, "fake check")

    def hardware(self, ir: KernelIR) -> TierResult | None:
        self.calls["hardware"] += 1
        return None


@dataclass(frozen=True)
class BuggyPass(Pass):
    """A pass whose apply crashes (a bug): the search must record it and go on."""

    name: ClassVar[str] = "buggy"

    @classmethod
    def choices(cls, ir, chip):
        return (cls(),)

    def apply(self, ir):
        raise RuntimeError("boom")


@pytest.fixture(scope="module")
def matmul_ir() -> KernelIR:
    return KernelIR.from_file(MATMUL)


def run(ir, tiers, **kw):
    cfg = SearchConfig(**{"beam": 4, "depth": 2, "jobs": 1, **kw})
    return beam_search(ir, (TilePass, BuggyPass), tiers, V5E, cfg)


def test_finds_a_faster_verified_kernel(matmul_ir) -> None:
    tiers = FakeTiers()
    out = run(matmul_ir, tiers)
    assert out.score_tier == "compiler"
    assert out.best is not out.baseline and out.best.passed("check")
    b, s = out.score(out.baseline), out.score(out.best)
    assert b and s and b.time_s / s.time_s > 3
    assert any(n.error.startswith("RuntimeError: boom") for n in out.nodes.values())  # recorded, search went on


def test_candidates_failing_a_tier_are_never_returned(matmul_ir) -> None:
    first = run(matmul_ir, FakeTiers())
    winner_bm = first.best.ir.calls[0].operands[0].block_shape[0]
    out = run(matmul_ir, FakeTiers(bad_bm=frozenset({winner_bm})))
    assert out.best.ir.calls[0].operands[0].block_shape[0] != winner_bm
    out2 = run(matmul_ir, FakeTiers(compile_fail_bm=frozenset({winner_bm})))
    assert out2.best.ir.calls[0].operands[0].block_shape[0] != winner_bm
    rejected = [n for n in out.nodes.values() if "check" in n.results and not n.passed("check")]
    assert rejected and all("rejected by check" in n.verdict() for n in rejected)


def test_deterministic(matmul_ir) -> None:
    a = run(matmul_ir, FakeTiers())
    b = run(matmul_ir, FakeTiers())
    assert a.best.recipe == b.best.recipe and sorted(a.nodes) == sorted(b.nodes)


def test_budget_limits_candidates(matmul_ir) -> None:
    out = run(matmul_ir, FakeTiers(), max_candidates=5)
    assert len(out.nodes) <= 5


class FakeClock:
    """Stands in for the `time` module inside beam.py: only the fake compiler moves it (100 s a compile)."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_time_budget_stops_compiles_and_checks_mid_depth(matmul_ir, monkeypatch) -> None:
    import pallasopt.search.beam as beam_mod

    clock = FakeClock()
    monkeypatch.setattr(beam_mod, "time", clock)

    class SlowTiers(FakeTiers):
        def compiler(self, ir: KernelIR) -> TierResult | None:
            clock.now += 100.0
            return super().compiler(ir)

    tiers = SlowTiers()
    out = run(matmul_ir, tiers, budget_seconds=250.0)
    # baseline (t=100), one compile (t=200); a second would end at t=300, past the budget: compiling stops (it used
    # to go on until the clock passed 250 s, and the run kept the baseline with a better kernel compiled)
    assert tiers.calls["compiler"] == 2
    assert tiers.calls["check"] == 2
    assert out.stop_reason == "budget" and out.best is not out.baseline and clock.now <= 250.0


def test_time_budget_keeps_room_to_check_what_it_compiled(matmul_ir, monkeypatch) -> None:
    """Compiling stops while one check still fits: the best compiled candidate is verified before the budget ends
    (before, the last compile ate the budget and the run kept the baseline although a better kernel was found)."""
    import pallasopt.search.beam as beam_mod

    clock = FakeClock()
    monkeypatch.setattr(beam_mod, "time", clock)

    class SlowTiers(FakeTiers):
        def compiler(self, ir: KernelIR) -> TierResult | None:
            clock.now += 100.0
            return super().compiler(ir)

        def check(self, ir: KernelIR, seeds: tuple[int, int], deadline: float | None = None) -> TierResult:
            clock.now += 40.0
            return super().check(ir, seeds, deadline=deadline)

    tiers = SlowTiers()
    out = run(matmul_ir, tiers, budget_seconds=300.0)
    # baseline compile (t=100) and check (t=140: a check costs 40 s); one compile (t=240) leaves 60 s, less than a
    # compile (100 s) and 1.25 checks, so compiling stops and the compiled candidate is checked (t=280).
    assert tiers.calls["compiler"] == 2 and tiers.calls["check"] == 2
    assert out.best is not out.baseline and out.best.passed("check") and clock.now <= 300.0


def test_compiles_get_the_budget_left_for_a_check_as_their_deadline(matmul_ir, monkeypatch) -> None:
    """A compile is stopped where the budget leaves only a check (1.5 checks + 3 s): llm_gqa_attention's screen
    compiles (90-126 s each) ran past a 120 s budget and its model-best candidate, compiled in 3 s, was never checked.
    Without a budget no deadline is passed; an evaluator that takes none is not given one."""
    import pallasopt.search.beam as beam_mod

    clock = FakeClock()
    monkeypatch.setattr(beam_mod, "time", clock)
    deadlines: list[float | None] = []

    class DeadlineTiers(FakeTiers):
        def compiler(self, ir: KernelIR, deadline: float | None = None) -> TierResult | None:
            deadlines.append(deadline)
            return super().compiler(ir)

        def check(self, ir: KernelIR, seeds: tuple[int, int], deadline: float | None = None) -> TierResult:
            clock.now += 10.0
            return super().check(ir, seeds, deadline=deadline)

    run(matmul_ir, DeadlineTiers(), budget_seconds=300.0)
    # the baseline's check took 10 s: compiles end by 300 - 15 - 3
    assert deadlines[1:] and set(deadlines[1:]) == {282.0}
    deadlines.clear()
    run(matmul_ir, DeadlineTiers())
    assert deadlines and set(deadlines) == {None}


def test_checks_are_limited_to_what_can_enter_the_beam(matmul_ir) -> None:
    tiers = FakeTiers()
    run(matmul_ir, tiers, beam=2, depth=1)
    assert tiers.calls["check"] <= 1 + 2  # baseline + at most `beam` candidates per depth


def test_incorrect_baseline_is_refused(matmul_ir) -> None:
    with pytest.raises(BaselineIncorrect):
        run(matmul_ir, FakeTiers(bad_bm=frozenset({128})))


def test_optimize_repeats_from_db_and_resumes(tmp_path) -> None:
    kernel = tmp_path / "matmul.py"
    kernel.write_text(MATMUL.read_text())
    db = tmp_path / "k.db"
    tiers = FakeTiers()
    r1 = optimize(kernel, beam=3, depth=2, db_path=db, evaluator=tiers, jobs=1)
    assert r1.correct and r1.speedup > 3 and not r1.from_cache
    assert (tmp_path / "matmul.opt.py").exists() and kernel.read_text() == MATMUL.read_text()
    first_checks = tiers.calls["check"]
    again = FakeTiers()
    r2 = optimize(kernel, beam=3, depth=2, db_path=db, evaluator=again, jobs=1)
    assert r2.from_cache and r2.recipe == r1.recipe and sum(again.calls.values()) == 0
    # A fresh search over the same DB recomputes no finished compile/check evaluation.
    third = FakeTiers()
    r3 = optimize(kernel, beam=3, depth=2, db_path=db, evaluator=third, jobs=1, fresh=True)
    assert r3.recipe == r1.recipe and third.calls["check"] == 0 and third.calls["compiler"] == 0
    assert first_checks > 0


def test_interrupted_run_resumes_without_losing_evaluations(tmp_path) -> None:
    kernel = tmp_path / "matmul.py"
    kernel.write_text(MATMUL.read_text())
    db = tmp_path / "k.db"

    class Interrupting(FakeTiers):
        def check(self, ir, seeds):
            if self.calls["check"] >= 2:
                raise KeyboardInterrupt
            return super().check(ir, seeds)

    first = Interrupting()
    with pytest.raises(KeyboardInterrupt):
        optimize(kernel, beam=3, depth=2, db_path=db, evaluator=first, jobs=1)
    done_before = first.calls["check"]
    from pallasopt.db.store import KernelDB

    with KernelDB.open(db) as kdb:
        (w,) = kdb.workloads()
        assert kdb.last_run(w.id).state == "interrupted"
        stored = len(kdb.evaluations(w.id, tier="check"))
    assert stored == done_before == 2
    second = FakeTiers()
    r = optimize(kernel, beam=3, depth=2, db_path=db, evaluator=second, jobs=1, resume=True)
    assert r.correct
    reference = FakeTiers()
    optimize(kernel, beam=3, depth=2, db_path=tmp_path / "other.db", evaluator=reference, jobs=1)
    assert second.calls["check"] == reference.calls["check"] - done_before  # nothing finished was redone


def test_in_place_refused_without_flag(tmp_path) -> None:
    kernel = tmp_path / "matmul.py"
    kernel.write_text(MATMUL.read_text())
    from pallasopt.errors import UsageError

    with pytest.raises(UsageError, match="overwrite the input"):
        optimize(kernel, beam=2, depth=1, db_path=tmp_path / "k.db", evaluator=FakeTiers(), output=kernel, jobs=1)
    assert kernel.read_text() == MATMUL.read_text()


@pytest.mark.slow
def test_real_run_on_softmax_without_compiler(tmp_path, capsys) -> None:
    """End to end on the CPU tiers (model + real oracle), through the CLI with --json."""
    import json

    from pallasopt.cli import main

    kernel = tmp_path / "softmax.py"
    kernel.write_text((ROOT / "examples" / "softmax.py").read_text())
    code = main(
        ["run", str(kernel), "--beam", "2", "--depth", "1", "--no-compile", "--json", "--report", str(tmp_path / "rep")]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["correct"] and out["speedup"] > 1.5
    assert out["baseline"]["tier"] == "model" and out["best"]["tier"] == "model"
    for key in ("recipe", "output_path", "candidates_evaluated", "wall_s"):
        assert key in out
    assert (tmp_path / "rep" / "report.md").exists() and (tmp_path / "rep" / "search_tree.graphml").exists()
    assert "ROWS_PER_BLOCK = " in (tmp_path / "softmax.opt.py").read_text()


@pytest.mark.slow
def test_llm_rewrite_joins_the_search_from_recorded_replies(tmp_path) -> None:
    """`optimize(..., llm=True)` opens an LLM session: the recorded rewrite is validated, traced in a child,
    checked, ranked with the rule-based candidates, and a repeated run makes no request."""
    from pallasopt.llm.client import RecordedClient

    kernel = tmp_path / "softmax.py"
    kernel.write_text((ROOT / "examples" / "softmax.py").read_text())
    fixtures = ROOT / "tests" / "fixtures" / "llm" / "softmax_good.json"
    client = RecordedClient.from_file(fixtures)
    r = optimize(
        kernel,
        beam=2,
        depth=1,
        db_path=tmp_path / "k.db",
        use_compiler=False,
        passes=("llm-rewrite",),
        llm=True,
        llm_client=client,
        jobs=1,
    )
    assert client.calls >= 1 and r.llm_usage and r.llm_usage["requests"] >= 1
    assert r.correct
    again = RecordedClient.from_file(fixtures)
    optimize(
        kernel,
        beam=2,
        depth=1,
        db_path=tmp_path / "k.db",
        use_compiler=False,
        passes=("llm-rewrite",),
        llm=True,
        llm_client=again,
        jobs=1,
        fresh=True,
    )
    assert again.calls == 0  # every reply served from the kernel DB


def test_llm_without_key_is_one_line(tmp_path, monkeypatch) -> None:
    from pallasopt.errors import EnvironmentProblem

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    kernel = tmp_path / "softmax.py"
    kernel.write_text((ROOT / "examples" / "softmax.py").read_text())
    with pytest.raises(EnvironmentProblem, match="ANTHROPIC_API_KEY"):
        optimize(kernel, llm=True, db_path=tmp_path / "k.db", evaluator=FakeTiers())


def test_time_below_the_roofline_floor_is_rechecked(matmul_ir) -> None:
    """A candidate whose estimate beats physics is re-checked on other seeds and dropped if that fails."""

    class Cheater(FakeTiers):
        def compiler(self, ir):
            r = super().compiler(ir)
            if r is not None and r.ok and self.bm(ir) == 512:
                return TierResult("compiler", True, 1e-9, "impossible", {"below_floor": True})
            return r

        def check(self, ir, seeds):
            self.calls["check"] += 1
            ok = not (self.bm(ir) == 512 and seeds[0] != 101)  # passes the usual seeds only
            return TierResult("check", ok, None, "fake")

    out = run(matmul_ir, Cheater())
    assert out.best.ir.calls[0].operands[0].block_shape[0] != 512
    assert any("check" in n.results and not n.passed("check") for n in out.nodes.values())


def test_a_check_that_cannot_end_in_the_budget_is_not_started_and_the_next_is(matmul_ir, monkeypatch) -> None:
    """Bigger blocks need bigger check dims: llm_swiglu_mlp's best tiles needed ~10^3x its baseline's check work, no
    such check finished in a 120 s budget, and the run kept the baseline. A check foreseen (baseline's check time +
    the extra work at INTERPRET_S_PER_ELEMENT_STEP) to end past the budget is not started; the next-ranked candidate
    is checked instead, and the passed-over node says why. Without a budget every check is started."""
    import pallasopt.search.beam as beam_mod
    from pallasopt.harness.check_dims import INTERPRET_S_PER_ELEMENT_STEP

    clock = FakeClock()
    monkeypatch.setattr(beam_mod, "time", clock)
    huge = 1000.0 / INTERPRET_S_PER_ELEMENT_STEP  # 1000 s of interpret mode beyond the baseline's check

    class WorkTiers(FakeTiers):
        def __init__(self, heavy_bm: int) -> None:
            super().__init__()
            self.heavy_bm = heavy_bm
            self.checked: list[int] = []
            self.foreseen = 0

        def check_work(self, ir: KernelIR, seeds: tuple[int, ...]) -> int:
            self.foreseen += 1
            return int(huge) if self.bm(ir) == self.heavy_bm else 1000

        def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
            clock.now += 10.0
            self.checked.append(self.bm(ir))
            return super().check(ir, seeds, deadline)

    winner = run(matmul_ir, FakeTiers(), depth=1).best.ir
    heavy = FakeTiers.bm(winner)
    tiers = WorkTiers(heavy)
    out = run(matmul_ir, tiers, depth=1, budget_seconds=300.0)
    assert heavy not in tiers.checked and out.best is not out.baseline and out.best.passed("check")
    assert FakeTiers.bm(out.best.ir) != heavy
    # a check that cannot end in the whole budget left is not worth a compile either (it was, until 2026-12-03)
    passed_over = [n for n in out.nodes.values() if n.ir is not None and "foreseen at" in n.skipped]
    assert passed_over and all(FakeTiers.bm(n.ir) == heavy for n in passed_over)
    assert "foreseen at 1010 s" in passed_over[0].skipped and passed_over[0].skipped.startswith(UNVERIFIABLE)
    assert "compiler" not in passed_over[0].results
    # the foresight is on the ledger under its own name, once per candidate foreseen (and the baseline)
    assert tiers.foreseen >= 2 and out.spend["foresight"].candidates == tiers.foreseen
    clock.now = 0.0
    free = WorkTiers(heavy)
    assert FakeTiers.bm(run(matmul_ir, free, depth=1).best.ir) == heavy and heavy in free.checked


def test_compiling_stops_while_the_check_of_the_best_compiled_candidate_still_fits(matmul_ir, monkeypatch) -> None:
    """The time kept for a check is the foreseen check of the fastest candidate compiled so far, not the baseline's:
    on JAXBench's 1_Square_matrix_multiplication_ the model-best big block compiled first, seven more compiles left
    12 s, its check (at 4x the baseline's dims) was stopped there and the run kept its baseline."""
    import pallasopt.search.beam as beam_mod
    from pallasopt.harness.check_dims import INTERPRET_S_PER_ELEMENT_STEP

    clock = FakeClock()
    monkeypatch.setattr(beam_mod, "time", clock)
    winner = FakeTiers.bm(run(matmul_ir, FakeTiers(), depth=1).best.ir)

    class HeavyLead(FakeTiers):
        def __init__(self) -> None:
            super().__init__()
            self.checked: list[int] = []

        def compiler(self, ir: KernelIR) -> TierResult | None:
            clock.now += 30.0
            return super().compiler(ir)

        def check_work(self, ir: KernelIR, seeds: tuple[int, ...]) -> int:
            # the winner's check is foreseen at 10 + 50 s, every other at the baseline's 10 s
            return 1000 + int(50.0 / INTERPRET_S_PER_ELEMENT_STEP) * (self.bm(ir) == winner)

        def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
            clock.now += 10.0
            self.checked.append(self.bm(ir))
            return super().check(ir, seeds, deadline)

    tiers = HeavyLead()
    out = run(matmul_ir, tiers, depth=1, budget_seconds=300.0)
    # baseline 30 + 10 s; the winner compiles first (t=70); compiles go on while 1.25 x 60 s and a compile fit
    assert winner in tiers.checked and FakeTiers.bm(out.best.ir) == winner and out.best.passed("check")
    assert tiers.calls["compiler"] < 1 + 8 and clock.now <= 300.0


def test_candidates_whose_check_cannot_end_in_the_budget_are_not_compiled(matmul_ir, monkeypatch) -> None:
    """llm_swiglu_mlp (2026-12-02 bench): its eight model-best tiles each needed a ~120 s check in a 120 s budget;
    they took the compiles, none was checked, and the run kept its baseline. Candidates whose check cannot end in
    the budget left are not compiled; those that can be verified are, and one of them is the result."""
    import pallasopt.search.beam as beam_mod
    from pallasopt.harness.check_dims import INTERPRET_S_PER_ELEMENT_STEP

    clock = FakeClock()
    monkeypatch.setattr(beam_mod, "time", clock)
    root_bm = FakeTiers.bm(matmul_ir)

    class HeavyBigBlocks(FakeTiers):
        def __init__(self) -> None:
            super().__init__()
            self.compiled: list[int] = []
            self.checked: list[int] = []

        def compiler(self, ir: KernelIR) -> TierResult | None:
            clock.now += 10.0
            self.compiled.append(self.bm(ir))
            return super().compiler(ir)

        def check_work(self, ir: KernelIR, seeds: tuple[int, ...]) -> int:
            # blocks over the baseline's are foreseen at 10 + 500 s, longer than the whole budget
            return 1000 + int(500.0 / INTERPRET_S_PER_ELEMENT_STEP) * (self.bm(ir) > root_bm)

        def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
            clock.now += 10.0
            self.checked.append(self.bm(ir))
            return super().check(ir, seeds, deadline)

    tiers = HeavyBigBlocks()
    out = run(matmul_ir, tiers, depth=1, budget_seconds=300.0)
    # the 12 model-best tiles all have bigger blocks: none compiled; the next choices (bm <= 128) were
    assert tiers.compiled[0] == root_bm and len(tiers.compiled) > 1 and all(bm <= root_bm for bm in tiers.compiled)
    assert out.best is not out.baseline and out.best.passed("check") and FakeTiers.bm(out.best.ir) <= root_bm
    big = [n for n in out.nodes.values() if n.ir is not None and FakeTiers.bm(n.ir) > root_bm]
    assert len(big) >= 12 and all(n.skipped.startswith(UNVERIFIABLE) and "foreseen at 510 s" in n.skipped for n in big)


class BaselineOverLimit(FakeTiers):
    """The model says the baseline (block rows `root_bm`) does not fit VMEM; every other tier as FakeTiers."""

    def __init__(self, root_bm: int, bad_bm: frozenset[int] = frozenset()) -> None:
        super().__init__(bad_bm=bad_bm)
        self.root_bm = root_bm

    def unavailable(self, tier: str) -> str | None:  # the real tiers say which they have
        return "no accelerator" if tier == "hardware" else None

    def model(self, ir: KernelIR) -> TierResult:
        r = super().model(ir)
        if self.bm(ir) != self.root_bm:
            return r
        return TierResult("model", False, r.time_s, "call 0: VMEM footprint exceeds the scoped limit")


def test_a_baseline_over_the_models_vmem_limit_and_no_passing_candidate_end_without_a_crash(matmul_ir) -> None:
    """JAXBench's 12_Gemm_Multiply_LeakyReLU: its baseline is over the model's VMEM limit, so it has no time at the
    ranking tier and nothing is verified until a candidate passes; the search crashed (IndexError) asking for the
    best verified state while it compiled. It must run on, and keep the baseline when no candidate passes."""
    root_bm = FakeTiers.bm(matmul_ir)
    every_other = frozenset({8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096} - {root_bm})
    tiers = BaselineOverLimit(root_bm, bad_bm=every_other)
    out = run(matmul_ir, tiers, budget_seconds=1000.0, jobs=2)
    assert tiers.calls["compiler"] >= 2 and tiers.calls["check"] >= 2
    assert out.best is out.baseline and not any(n.passed("check") for n in out.nodes.values() if n.recipe)


def test_a_candidate_that_compiles_without_a_time_replaces_a_baseline_that_does_not_fit(matmul_ir) -> None:
    """tests/kernels/loops/window_loop_attention.py at S=32768: the whole-K/V baseline overflows VMEM (no time at any
    tier); streamed and narrowed to its window it compiles, but libtpu gives a loop whose trip count changes per step
    no time. The search kept the baseline ("no candidate does either"). A candidate that runs at the ranking tier
    where the baseline does not now ranks after every timed one and before the baseline, by the model among
    themselves; with no timed candidate, one of those is the result (and must pass its check)."""
    root_bm = FakeTiers.bm(matmul_ir)

    class Untimed(BaselineOverLimit):
        def compiler(self, ir: KernelIR) -> TierResult | None:
            self.calls["compiler"] += 1
            return TierResult("compiler", True, None, "no time: a loop whose trip count changes per step")

    small = frozenset(b for b in (8, 16, 32) if b != root_bm)
    out = run(matmul_ir, Untimed(root_bm, bad_bm=small), depth=1, budget_seconds=1000.0)
    assert out.best is not out.baseline and out.best.passed("check") and out.score_tier == "compiler"
    assert FakeTiers.bm(out.best.ir) not in small
    models = {n.results["model"].time_s for n in out.nodes.values() if n.passed("check") and n.recipe}
    assert out.best.results["model"].time_s == min(models)

    class TimedBaseline(FakeTiers):  # the baseline fits and has a time; no candidate has one
        def compiler(self, ir: KernelIR) -> TierResult | None:
            r = super().compiler(ir)
            return r if ir.source == matmul_ir.source else TierResult("compiler", True, None, "no time")

    plain = run(matmul_ir, TimedBaseline(), depth=1, budget_seconds=1000.0)
    assert plain.best is plain.baseline and plain.baseline.results["compiler"].time_s is not None


def test_the_baseline_compile_gets_a_share_of_the_budget_and_its_cut_is_said(matmul_ir, monkeypatch) -> None:
    """llm_moe's baseline compile ran 180 s into a 120 s budget. It is now stopped at BASELINE_COMPILE_SHARE of the
    budget; stopped, the compiler does not rank (no verdict on the kernel) and the ranking says why."""
    import pallasopt.search.beam as beam_mod
    from pallasopt.search.funnel import BASELINE_COMPILE_SHARE

    clock = FakeClock()
    monkeypatch.setattr(beam_mod, "time", clock)
    asked: list[float | None] = []

    class SlowBaseline(FakeTiers):
        def compiler(self, ir: KernelIR, deadline: float | None = None) -> TierResult | None:
            asked.append(deadline)
            if not asked[1:]:  # the baseline: runs to its deadline and is stopped
                clock.now = deadline if deadline is not None else clock.now + 500.0
                msg = "stopped at the search budget after 105 s (not a verdict on the kernel)"
                return TierResult("compiler", False, None, msg, {"budget_cut": True})
            return super().compiler(ir)

    out = run(matmul_ir, SlowBaseline(), depth=1, budget_seconds=300.0)
    assert asked[0] == pytest.approx(BASELINE_COMPILE_SHARE * 300.0)
    assert out.score_tier == "model" and len(asked) == 1  # no candidate compiled: the tier does not work here
    reasons = dict(out.ranking.not_used)
    assert "did not finish in its share of the search budget" in reasons["compiler"]
    assert out.best is not out.baseline and out.best.passed("check")


def test_candidates_the_compiler_rejects_are_replaced_by_the_next_in_model_order(matmul_ir) -> None:
    """llm_ragged_dot's eight model-best tiles all overflowed VMEM at the compiler in the 2026-12-02 bench and the
    search stopped at its baseline. Now each rejected one is replaced by the next candidate in model order until
    `prune` compiled: with beam 1 (prune 2) and the two model-best block sizes failing, the run still finds a kernel."""
    from pallasopt.search.candidates import one_per_signature
    from pallasopt.search.node import Node

    root = Node((), matmul_ir.digest, None, 0, matmul_ir)
    kids = []
    for choice in TilePass.choices(matmul_ir, V5E):
        try:
            new = choice.apply(matmul_ir)
        except Exception:
            continue
        n = Node((choice.spec(),), new.digest, root.digest, 1, new)
        n.results["model"] = model_tier(new, V5E)
        kids.append(n)
    kids = [k for k in kids if k.passed("model")]
    kids.sort(key=lambda n: (n.results["model"].time_s, len(n.recipe), n.spec))
    top = one_per_signature(kids)
    failing = frozenset({FakeTiers.bm(top[0].ir), FakeTiers.bm(top[1].ir)})
    tiers = FakeTiers(compile_fail_bm=failing)
    out = run(matmul_ir, tiers, beam=1, depth=1)
    assert out.best is not out.baseline and out.best.passed("compiler")
    assert FakeTiers.bm(out.best.ir) not in failing


def _fake(recipe: tuple[str, ...], model_s: float):
    from pallasopt.search.node import Node

    n = Node(recipe, "d" + ",".join(recipe), "root", len(recipe), None)
    n.results["model"] = TierResult("model", True, model_s, "")
    return n


def test_competing_calls_share_a_depths_compiles() -> None:
    """llm_swiglu_mlp: the model times the best down-projection and gate/up tiles 0.3% apart; the eight compiles of
    depth 1 all went to the down projection and the budget ended before a step tiled the other call (1.96x, 0.16x
    of XLA). Where two calls compete, a depth compiles prune // n^2 of each, round-robin, the rest kept for refills
    (the same bench command then found both calls tiled: 10.34x [C], 0.82x of XLA)."""
    from pallasopt.search.candidates import share_calls

    down = [_fake((f"tile{{call=1,tm={t}}}",), 0.0955 + i * 1e-5) for i, t in enumerate((64, 128, 256, 512, 1024))]
    gate = [_fake((f"tile{{call=0,tm={t}}}",), 0.0958 + i * 1e-5) for i, t in enumerate((64, 128, 256, 512))]
    other = [_fake(("vmem-limit{call=0,mib=32}",), 0.175), _fake(("fuse{producer=0}",), 0.0957)]
    ordered = sorted(down + gate + other, key=lambda n: n.results["model"].time_s)
    out, prune = share_calls(ordered, 8)
    assert prune == 4 and [n.recipe[-1] for n in out[:4]] == [
        "tile{call=1,tm=64}",
        "tile{call=0,tm=64}",
        "tile{call=1,tm=128}",
        "tile{call=0,tm=128}",
    ]
    assert sorted(n.digest for n in out) == sorted(n.digest for n in ordered)  # nothing dropped: the rest refill
    # one call far ahead (a matmul and its cheap epilogue call): unchanged
    cheap = [_fake(("tile{call=1,tm=64}",), 0.2)]
    assert share_calls(down + cheap, 8) == (down + cheap, 8)
    # a single call: unchanged
    assert share_calls(down, 8) == (down, 8)


@pytest.mark.parametrize(
    "kernel, fuse",
    [
        ("two_producers.py", False),  # two elementwise producers with their own block literals: a tile on each
        ("matmul_colmax.py", True),  # a tile, then the fuse the prune left uncompiled (the model ranks it 13th)
    ],
)
def test_the_best_steps_of_different_calls_compose_within_the_depth(kernel: str, fuse: bool) -> None:
    """A module whose calls each need a step: the best depth-1 steps of different calls (or a structural one,
    applied last) are composed into one depth-2 candidate during depth 1, ranked and checked there."""
    from pallasopt.passes.fuse import FusePass

    ir = KernelIR.from_file(ROOT / "tests" / "kernels" / "fuse" / kernel)
    events: list[tuple[str, dict]] = []
    out = beam_search(
        ir,
        (TilePass, FusePass) if fuse else (TilePass,),
        FakeTiers(),
        V5E,
        SearchConfig(beam=2, depth=2, jobs=1),
        progress=lambda kind, info: events.append((kind, info)),
    )
    kinds = [k for k, _ in events]
    assert "composed" in kinds and kinds.index("composed") < kinds.index("depth")
    best1 = next(info for k, info in events if k == "depth" and info["depth"] == 1)["best"]
    assert len(best1.recipe) == 2 and len(best1.parents) == 2, best1.spec
    steps = [out.nodes[p].recipe[-1] for p in best1.parents]
    assert list(best1.recipe) == steps  # each parent made one of its steps, at depth 1
    if fuse:
        assert steps[0].startswith("tile{call=") and steps[1].startswith("fuse{") and len(best1.ir.calls) == 1
    else:
        assert sorted(s.split(",")[0] for s in steps) == ["tile{call=0", "tile{call=1"]
    for p in best1.parents:  # the composite beats each of its parents (the fuse parent has a model time only)
        tier = "compiler" if out.nodes[p].passed("compiler") else "model"
        assert out.nodes[p].results[tier].time_s > best1.results[tier].time_s
    assert best1.passed("check") and out.best.passed("check")
    assert max(len(n.recipe) for n in out.nodes.values()) <= 2  # the depth limit holds


def test_step_leaders_take_one_faster_step_per_pass_and_call_and_a_structural_one_last() -> None:
    from pallasopt.search.candidates import step_leaders
    from pallasopt.search.node import Node

    ir = KernelIR.from_file(ROOT / "tests" / "kernels" / "fuse" / "matmul_colmax.py")
    root = Node((), "root", None, 0, ir)
    root.results["compiler"] = TierResult("compiler", True, 1.0, "")

    def kid(step: str, t: float, calls: int = 2, parent: str = "root") -> Node:
        n = Node((step,), step, parent, 1, ir if calls == 2 else KernelIR.from_file(MATMUL))
        if step.startswith("llm-rewrite"):  # LLM-written code has no workload in this process
            n.ir = dataclasses.replace(ir, workload=None)
        n.results["compiler"] = TierResult("compiler", True, t, "")
        return n

    ranked = [
        kid("llm-rewrite{strategy=online-softmax}", 0.2),  # a leaf: replaying it would ask the LLM again
        kid("fuse{producer=0}", 0.3, calls=1),  # one call fewer: it renumbers the calls, so it goes last
        kid("tile{call=1,tm=256}", 0.5),
        kid("tile{call=1,tm=128}", 0.6),  # the second of (tile, call 1)
        kid("tile{call=0,tm=64}", 0.7, parent="other"),  # another state's child
        kid("fuse{producer=1}", 0.75, calls=1),  # the second structural one
        kid("vmem-limit{mib=64}", 0.8),  # a pass that names no call: its own group
        kid("grid-order{call=1,order=1:0}", 0.85),  # another pass on call 1
        kid("tile{call=0,tm=512}", 0.9),
        kid("tile{call=2,tm=512}", 1.2),  # slower than the state
    ]
    faster = lambda n: n.results["compiler"].time_s < 1.0
    assert [n.recipe[0] for n in step_leaders(root, ranked, faster)] == [
        "tile{call=1,tm=256}",
        "vmem-limit{mib=64}",
        "grid-order{call=1,order=1:0}",
        "tile{call=0,tm=512}",
        "fuse{producer=0}",
    ]


def test_a_structural_step_gets_its_own_composite_when_the_fold_reaches_the_depth_limit_first() -> None:
    """two_producers: the best tiles of calls 0 and 1 fill the depth-2 fold, so the fuse the model ranks faster
    than the state also follows the best tile alone: two composites in depth 1."""
    from pallasopt.passes.fuse import FusePass

    ir = KernelIR.from_file(ROOT / "tests" / "kernels" / "fuse" / "two_producers.py")
    events: list[tuple[str, dict]] = []
    beam_search(
        ir,
        (TilePass, FusePass),
        FakeTiers(),
        V5E,
        SearchConfig(beam=2, depth=2, jobs=1),
        progress=lambda kind, info: events.append((kind, info)),
    )
    (made,) = [info["recipes"] for kind, info in events if kind == "composed"]
    assert len(made) == 2 and made[0].split("},")[0] == made[1].split("},")[0], made  # the same best step first
    assert made[0].split("},")[1].startswith("tile{call=1") and made[1].split("},")[1].startswith("fuse{"), made


def test_a_body_rewrite_the_model_cannot_rank_gets_a_compile() -> None:
    """fused_28 (2026-12-06 bench): `sigmoid-tanh` on the best state has that state's blocks, grid and model time,
    and the tile choices the model put a hair ahead took every compile of the depth, so the compiler never saw it
    (0.430 -> 0.4245 ms [C] by hand). A body rewrite of a compiled parent is moved to second place in the compile
    order; one of an uncompiled parent, or a choice that changes blocks, is not."""
    from pallasopt.passes.sigmoid_tanh import SigmoidTanhPass
    from pallasopt.search.candidates import body_rewrite, body_rewrites_first
    from pallasopt.search.node import Node

    root_ir = KernelIR.from_file(ROOT / "bench" / "kernels" / "fused_28_swish_scale_bias.py")
    root = Node((), root_ir.digest, None, 0, root_ir)
    root.results["model"] = TierResult("model", True, 1.0e-3, "")
    root.results["compiler"] = TierResult("compiler", True, 0.9e-3, "")

    def child(p: Pass, model_s: float) -> Node:
        ir = p.rewrite(root_ir)
        n = Node((p.spec(),), ir.digest, root.digest, 1, ir)
        n.results["model"] = TierResult("model", True, model_s, "")
        return n

    tiles = [child(p, 0.9e-3 + i * 1e-6) for i, p in enumerate(TilePass.choices(root_ir, V5E)[:9])]
    body = child(SigmoidTanhPass(call=0), 1.0e-3)
    assert body_rewrite(body, root) and not any(body_rewrite(t, root) for t in tiles)
    ordered = [*tiles, body]
    out = body_rewrites_first(ordered, 8, lambda n: root if n.parent == root.digest else None, lambda n: (0.0, n.spec))
    assert out[0] is tiles[0] and out[1] is body and out[2:] == tiles[1:]
    # the parent never compiled (nothing says the body matters there): the model's order stands
    del root.results["compiler"]
    assert body_rewrites_first(ordered, 8, lambda n: root, lambda n: (0.0, n.spec)) == ordered
    # a body rewrite the model times differently (it sees the change) is ranked by the model
    root.results["compiler"] = TierResult("compiler", True, 0.9e-3, "")
    body.results["model"] = TierResult("model", True, 0.95e-3, "")
    assert not body_rewrite(body, root)


class ChipTimed(FakeTiers):
    """A chip in the room: the hardware tier times every candidate, in the reverse of the compiler's order (the
    compiler's slowest estimate is the chip's fastest), and every candidate beats the baseline on it."""

    def unavailable(self, tier: str) -> str | None:
        return None

    def hardware(self, ir: KernelIR) -> TierResult | None:
        self.calls["hardware"] += 1
        c = self.compiler(ir)
        assert c is not None and c.time_s is not None
        t = 1e-12 / c.time_s if self.bm(ir) != FakeTiers.bm(KernelIR.from_file(MATMUL)) else 1.0
        return TierResult("hardware", True, t, "fake chip", {"device": "x"})


def test_where_the_chip_ranks_candidates_are_checked_and_timed_in_the_models_order_uncompiled(matmul_ir) -> None:
    """On a v5e host (session 33) `pallasopt run` checked and timed no candidate: every candidate had no chip time
    yet, so each ranked at inf and none was "faster than the worst kept"; the run kept its baseline ("start recipe
    dropped: not verified", "stop: no progress"). Candidates the chip has not timed are now checked and timed in the
    model's order, and the chip's times pick the result. No child is compiled deviceless (session 35: 24-26 s a
    compile on the v5e host, where the chip compiles and times one in 2-4 s): only the baseline is."""
    tiers = ChipTimed()
    out = run(matmul_ir, tiers, depth=1, budget_seconds=1000.0)
    assert out.score_tier == "hardware" and tiers.calls["hardware"] > 2 and tiers.calls["check"] > 2
    assert tiers.calls["compiler"] == 1 + tiers.calls["hardware"]  # the baseline's; ChipTimed.hardware asks one each
    assert not [n for n in out.nodes.values() if n.recipe and "compiler" in n.results]
    timed = [n for n in out.nodes.values() if n.recipe and n.passed("hardware")]
    modelled = sorted(
        (n for n in out.nodes.values() if n.recipe and n.passed("model")),
        key=lambda n: (n.results["model"].time_s, n.spec),
    )
    assert {n.digest for n in timed} <= {n.digest for n in modelled[: 2 * 4]}  # the model's best were timed
    chip_best = min(timed, key=lambda n: n.results["hardware"].time_s)
    assert out.best is chip_best and chip_best is not modelled[0]  # the chip's order, not the model's


def test_a_chip_time_under_the_roofline_floor_is_rechecked_on_other_seeds(matmul_ir) -> None:
    """The reward-hack guard re-checked a suspicious time before the hardware tier had timed anything, so a chip time
    under half the roofline floor went unchecked. A kernel that times impossibly fast on the chip and fails on other
    seeds must leave the result."""
    from pallasopt.search.funnel import RECHECK_OFFSET

    class Cheater(ChipTimed):
        def hardware(self, ir: KernelIR) -> TierResult | None:
            r = super().hardware(ir)
            assert r is not None
            if self.bm(ir) == FakeTiers.bm(matmul_ir):
                return r
            return TierResult("hardware", True, 1e-9, "fake chip", {"device": "x", "below_floor": True})

        def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
            self.calls["check"] += 1
            honest = min(seeds) < RECHECK_OFFSET  # right on the search seeds, wrong on the re-check's
            return TierResult("check", self.bm(ir) == FakeTiers.bm(matmul_ir) or honest, None, "fake check")

    tiers = Cheater()
    out = run(matmul_ir, tiers, depth=1, budget_seconds=1000.0)
    flagged = [n for n in out.nodes.values() if n.recipe and "hardware" in n.results]
    assert flagged and all(not n.passed("check") for n in flagged)  # each re-checked, and failed
    assert out.best is out.baseline
