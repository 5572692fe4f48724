"""The funnel's sound skips (issue 16, speed): a compile whose floor keeps it out of the result is not run, and beam
search checks only what can change its result; with fake tiers, the winner is the one the full funnel gives."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from conftest import ROOT

from pallasopt.config import SearchConfig
from pallasopt.cost_model.hardware import get_chip
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.tile import TilePass
from pallasopt.passes.vmem_limit import VmemLimitPass
from pallasopt.search.beam import beam_search
from pallasopt.search.funnel import Funnel
from pallasopt.search.spend import Budget
from pallasopt.search.tiers import TierResult, model_tier

# The scenarios below (which fake-timed candidates rank where, which stay unchecked) were laid out on the datasheet
# HBM bandwidth; the search logic they test does not depend on it, so they keep it (`Chip.hbm_efficiency` = 1).
V5E = replace(get_chip("v5e"), hbm_efficiency=1.0)
MATMUL = ROOT / "examples" / "matmul.py"
PASSES = (TilePass, VmemLimitPass)


class Floored:
    """Compiler = model x 1.25 x (1 + block rows / 1e6) (the rows break ties), never below its floor = model x 1.0
    (as the real tier: max(static, HBM floor)); every check passes. Records the digests each tier saw."""

    def __init__(self, floor: bool = True) -> None:
        self.seen: dict[str, list[str]] = {"compiler": [], "check": []}
        if not floor:
            self.compile_floor = None  # type: ignore[assignment]

    def model(self, ir: KernelIR) -> TierResult:
        return model_tier(ir, V5E)

    def compile_floor(self, ir: KernelIR) -> float | None:
        return model_tier(ir, V5E).time_s

    def compiler(self, ir: KernelIR) -> TierResult | None:
        self.seen["compiler"].append(ir.digest)
        t = model_tier(ir, V5E).time_s or 0.0
        return TierResult("compiler", True, t * 1.25 * (1 + ir.calls[0].operands[0].block_shape[0] / 1e6), "fake")

    def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
        self.seen["check"].append(ir.digest)
        return TierResult("check", True, None, "fake")

    def hardware(self, ir: KernelIR) -> TierResult | None:
        return None


@pytest.fixture(scope="module")
def matmul_ir() -> KernelIR:
    return KernelIR.from_file(MATMUL)


def funnel(ir: KernelIR, tiers: Floored, **kw: object) -> Funnel:
    cfg = SearchConfig(**{"beam": 2, "depth": 2, "jobs": 1, **kw})  # type: ignore[arg-type]
    return Funnel(ir, tiers, V5E, cfg, clock=time.perf_counter)


def test_a_compile_whose_floor_is_not_under_the_bar_is_skipped_and_recorded(matmul_ir) -> None:
    tiers = Floored()
    f = funnel(matmul_ir, tiers)
    assert f.score_tier == "compiler"
    children = f.expand(f.root, (TilePass,), {"tile": 8})
    floors = sorted(model_tier(c.ir, V5E).time_s for c in children)
    bar = floors[len(floors) // 2]  # by construction, the slower half has floor >= bar
    ranked = f.rank(children, want=None, bar=bar)
    skipped = [c for c in children if c.skipped]
    assert skipped and len(skipped) == sum(1 for t in floors if t >= bar)
    assert all(model_tier(c.ir, V5E).time_s >= bar and "compiler" not in c.results for c in skipped)
    assert not {c.digest for c in skipped} & set(tiers.seen["compiler"])  # never compiled
    assert all(f.key(c) < float("inf") for c in ranked) and not {c.digest for c in ranked} & {c.digest for c in skipped}
    assert f.ledger.snapshot()["skipped-compiler"].candidates == len(skipped)
    assert "not checked: compile skipped" in skipped[0].verdict()
    # without a floor from the evaluator nothing is skipped
    g = funnel(matmul_ir, Floored(floor=False))
    g.rank(g.expand(g.root, (TilePass,), {"tile": 8}), want=None, bar=bar)
    assert "skipped-compiler" not in g.ledger.snapshot()


CHOICES = {"tile": 4}  # fewer tile choices per state than beam's 12: the test stays fast


def _full_funnel_beam(ir: KernelIR, tiers: Floored, cfg: SearchConfig) -> tuple[tuple[str, ...], float, str]:
    """The beam loop as it was before the skips: every child through `Funnel.evaluate`, no floor told."""
    tiers.compile_floor = None  # type: ignore[assignment]
    f = Funnel(ir, tiers, V5E, cfg, clock=time.perf_counter)
    beam, stop, best_time = [f.root], "depth limit", f.key(f.root)
    for _depth in range(1, cfg.depth + 1):
        children = [c for s in beam for c in f.expand(s, PASSES, CHOICES)]
        worst = max(f.key(n) for n in beam) if len(beam) >= cfg.beam else float("inf")
        verified = f.evaluate(children, cfg.beam, worst)
        beam = sorted({n.digest: n for n in beam + verified}.values(), key=lambda n: (f.key(n), n.spec))[: cfg.beam]
        if f.key(beam[0]) > best_time * 0.99:
            stop = "no progress"
            break
        best_time = f.key(beam[0])
    out = f.outcome(stop)
    return out.best.recipe, f.key(out.best), stop


def test_beam_skips_work_that_cannot_change_its_result_and_wins_the_same(matmul_ir, monkeypatch) -> None:
    monkeypatch.setattr("pallasopt.search.beam.BEAM_CHOICES", CHOICES)
    cfg = SearchConfig(beam=3, depth=2, jobs=1)
    tiers = Floored()
    out = beam_search(matmul_ir, PASSES, tiers, V5E, cfg)
    reference = Floored()
    recipe, best_s, stop = _full_funnel_beam(matmul_ir, reference, cfg)
    assert (out.best.recipe, out.score(out.best).time_s, out.stop_reason) == (recipe, best_s, stop)
    # The beam's states slower than the best are kept unchecked (the full funnel checks every one of them).
    skipped = [n for n in out.nodes.values() if n.skipped]
    assert any("check deferred" in n.skipped for n in skipped)
    assert all("check" not in n.results for n in skipped)
    spend = out.spend
    n_skipped = spend.get("skipped-check", None), spend.get("skipped-compiler", None)
    assert sum(s.candidates for s in n_skipped if s) == len(skipped)
    assert len(tiers.seen["check"]) < len(reference.seen["check"])
    assert len(tiers.seen["compiler"]) <= len(reference.seen["compiler"])
    line = Budget(None, out.wall_s, spend).line()
    assert "skipped (could not change the result):" in line


def test_compiles_roll_on_jobs_workers_without_waiting_for_a_batch(matmul_ir) -> None:
    """With --jobs 2 the next compile starts as soon as one ends: the first (slow) compile is only released after two
    others have finished, which a lock-step batch of two could never do (it would wait out the timeout)."""
    import threading

    class Slow(Floored):
        def __init__(self) -> None:
            super().__init__(floor=False)
            self.lock, self.done, self.in_flight, self.peak = threading.Lock(), 0, 0, 0
            self.released, self.first, self.timed_out = threading.Event(), "", False

        def compiler(self, ir):
            with self.lock:
                self.first = self.first or ir.digest
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
            if ir.digest == self.first and self.seen["compiler"]:  # the baseline's compile came first: not it
                self.timed_out = not self.released.wait(30)
            r = super().compiler(ir)
            with self.lock:
                self.in_flight -= 1
                self.done += 1
                if self.done >= 3:  # the baseline and two candidates
                    self.released.set()
            return r

    tiers = Slow()
    f = funnel(matmul_ir, tiers, jobs=2)
    tiers.first = ""  # the next compile to start is the slow one
    children = f.expand(f.root, (TilePass,), {"tile": 4})
    ranked = f.rank(children, want=None)
    assert not tiers.timed_out and tiers.peak == 2 and not f.cut
    assert len(ranked) >= 3 and all(c.passed("compiler") for c in ranked)


class Tied(Floored):
    """Every candidate compiles to the same time (half the baseline's): the result is decided by the tie-break."""

    def __init__(self, root: KernelIR) -> None:
        super().__init__(floor=False)
        self.root = root.digest

    def compiler(self, ir: KernelIR) -> TierResult | None:
        self.seen["compiler"].append(ir.digest)
        return TierResult("compiler", True, 1e-3 if ir.digest == self.root else 5e-4, "fake")


def test_ties_are_broken_by_recipe_in_the_outcome_and_in_every_strategy(matmul_ir, monkeypatch) -> None:
    """One rule (`Funnel.rank_key`): equal scores are ordered by recipe, never by the order candidates were made."""
    from pallasopt.search import trust
    from pallasopt.search.evolve import evolve_search

    # The fake compiler's times are far from the model's; with the dense-matmul trust rule the model would rank and
    # the compiler's ties would never be looked at. No rule here: the compiler ranks.
    monkeypatch.setattr(trust, "TRUST", {})

    f = funnel(matmul_ir, Tied(matmul_ir))
    verified = f.evaluate(f.expand(f.root, (TilePass,), {"tile": 6}), None)
    assert len(verified) >= 3 and len({f.key(n) for n in verified}) == 1
    by_recipe = min(verified, key=lambda n: n.spec)
    first_made = next(n for n in f.nodes.values() if n in verified)
    assert first_made is not by_recipe  # else this test could not tell the two rules apart
    assert f.outcome("done").best is by_recipe and verified[0] is by_recipe
    f.nodes = dict(reversed(list(f.nodes.items())))  # the same candidates made in the other order
    assert f.outcome("done").best is by_recipe

    # evolve sorts its population by the same rule and returns its rank 0
    cfg = SearchConfig(beam=3, depth=2, jobs=1, strategy="evolve")
    out = evolve_search(matmul_ir, PASSES, Tied(matmul_ir), V5E, cfg)
    tied = [n for n in out.nodes.values() if n.passed("check") and f.key(n) == 5e-4]
    assert len(tied) >= 2 and out.best.spec == min(n.spec for n in tied)


def test_metadata_is_resolved_once_per_module_and_edits_are_unchanged(matmul_ir, monkeypatch) -> None:
    from pallasopt.ir import matchers

    loc = matchers.Located.of(matmul_ir.module)
    assert matchers.Located.of(matmul_ir.module) is loc  # the same module object: the same metadata
    choices = TilePass.choices(matmul_ir, V5E)[:6]
    cached = [c.apply(matmul_ir).source for c in choices]
    monkeypatch.setattr(matchers, "LOCATED_CACHE", 0)  # resolved afresh for every edit, as before the cache
    assert matchers.Located.of(matmul_ir.module) is not loc
    assert [c.apply(matmul_ir).source for c in choices] == cached


class FailingRows(Floored):
    """As `Floored`, but every candidate whose first operand's block has `rows` rows fails its check."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows = rows

    def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
        self.seen["check"].append(ir.digest)
        ok = ir.calls[0].operands[0].block_shape[0] != self.rows
        return TierResult("check", ok, None, "fake" if ok else "wrong rows")


def test_lazy_checks_never_keep_or_return_a_failed_state(matmul_ir, monkeypatch) -> None:
    """Beam keeps states unchecked, but a state that failed its check never enters the beam (no child of it is made),
    the result passed its check, and when the fastest children fail the next ones are checked in rank order."""
    monkeypatch.setattr("pallasopt.search.beam.BEAM_CHOICES", CHOICES)
    cfg = SearchConfig(beam=3, depth=2, jobs=1)
    all_pass = beam_search(matmul_ir, PASSES, Floored(), V5E, cfg)
    rows = all_pass.best.ir.calls[0].operands[0].block_shape[0]  # make the all-pass winner's row block wrong
    tiers = FailingRows(rows)
    out = beam_search(matmul_ir, PASSES, tiers, V5E, cfg)
    failed = {d for d, n in out.nodes.items() if n.failed("check")}
    assert failed, "the winner's rows fail, so some check must have failed"
    assert out.best.passed("check") and out.best.ir.calls[0].operands[0].block_shape[0] != rows
    assert not any(n.parent in failed for n in out.nodes.values())
    # every candidate faster than the result was checked and failed (nothing faster was left unchecked)
    faster = [n for n in out.nodes.values() if n.depth and "compiler" in n.results and out.score(n)]
    assert all(n.failed("check") for n in faster if out.score(n).time_s < out.score(out.best).time_s)
    unchecked = [n for n in out.nodes.values() if n.skipped and "check deferred" in n.skipped]
    assert unchecked and all("check" not in n.results for n in unchecked)


def test_a_candidate_with_the_signature_of_a_compiled_one_is_not_compiled_again(matmul_ir) -> None:
    """`vmem-limit{mib=32}` on the baseline (which fits the default limit) has the baseline's blocks, grid and model
    time: the compiler tier's answer is the baseline's, so it is not compiled (the skip is recorded)."""
    from pallasopt.search.candidates import signature

    tiers = Floored(floor=False)
    f = funnel(matmul_ir, tiers)
    kids = f.expand(f.root, (VmemLimitPass,))
    assert kids and all(signature(k) == signature(f.root) for k in (f.rank(kids, None) or kids))
    assert all("the same blocks, grid and model time as (baseline)" in (k.skipped or "") for k in kids)
    assert not {k.digest for k in kids} & set(tiers.seen["compiler"])
    assert f.ledger.snapshot()["skipped-compiler"].candidates == len(kids)


def test_ranking_more_candidates_keeps_the_check_reserve_of_the_fastest_so_far(matmul_ir) -> None:
    """Composites are ranked after their depth's children (`rank(..., joining=True)`): the check the compiles keep time
    for stays that of the fastest compiled candidate of them all (a fresh rank starts over)."""
    f = funnel(matmul_ir, Floored(floor=False))
    children = sorted(f.expand(f.root, (TilePass,), {"tile": 8}), key=lambda c: model_tier(c.ir, V5E).time_s)
    first, slower, others = children[:3], children[3:5], children[5:7]
    lead = f.rank(first, want=None)[0]
    f.check_seconds = lambda c: 100.0 if c is lead else 1.0  # type: ignore[method-assign]
    assert f.check_reserve() == 100.0
    later = f.rank(slower, want=None, joining=True)
    assert later and all(f.rank_key(c) > f.rank_key(lead) for c in later)
    assert f.check_reserve() == 100.0  # still the first batch's fastest
    f.rank(others, want=None)
    assert f.check_reserve() == max(f.check_s, 1.0)  # a fresh rank: only what it compiled
