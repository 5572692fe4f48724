"""A bug met while evaluating one candidate fails that candidate, never the search; Python parsing from several job
threads at once (CPython 3.11's AST constructor shares its recursion depth between threads) goes through one lock."""

from __future__ import annotations

import threading

from conftest import ROOT

from pallasopt.config import SearchConfig
from pallasopt.cost_model.hardware import get_chip
from pallasopt.ir.kernel_ir import KernelIR, source_digest
from pallasopt.passes.tile import TilePass
from pallasopt.search.beam import beam_search
from pallasopt.search.tiers import TierResult, model_tier

V5E = get_chip("v5e")
MATMUL = ROOT / "examples" / "matmul.py"


class Buggy:
    """Compiler = model; the check raises (a bug in the evaluator, not a candidate's fault) for one candidate."""

    def __init__(self, bad: str) -> None:
        self.bad = bad
        self.checked: list[str] = []

    def model(self, ir: KernelIR) -> TierResult:
        return model_tier(ir, V5E)

    def compiler(self, ir: KernelIR) -> TierResult | None:
        return TierResult("compiler", True, model_tier(ir, V5E).time_s, "fake")

    def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
        self.checked.append(ir.digest)
        if self.bad in (ir.source, ir.digest):
            raise SystemError("AST constructor recursion depth mismatch (before=39, after=35)")
        return TierResult("check", True, None, "fake")

    def hardware(self, ir: KernelIR) -> TierResult | None:
        return None


def test_a_crash_evaluating_one_candidate_fails_it_and_the_search_goes_on() -> None:
    ir = KernelIR.from_file(MATMUL)
    cfg = SearchConfig(beam=4, depth=1, jobs=2)
    winner = beam_search(ir, (TilePass,), Buggy(bad="<none>"), V5E, cfg).best  # type: ignore[arg-type]
    assert winner.depth == 1
    tiers = Buggy(bad=winner.digest)  # the candidate that wins without the bug hits it
    res = beam_search(ir, (TilePass,), tiers, V5E, cfg)  # type: ignore[arg-type]
    assert len(tiers.checked) >= 3  # the baseline, the crash, the next one
    crashed = [
        n
        for n in res.nodes.values()
        if "internal error: SystemError" in n.results.get("check", TierResult("", True)).message
    ]
    assert [n.digest for n in crashed] == [winner.digest]
    assert res.best.digest != winner.digest and res.best.depth == 1 and res.best.passed("check")
    assert all(not n.results["check"].ok for n in crashed)


def test_parsing_from_many_threads_at_once_never_fails() -> None:
    source = MATMUL.read_text()
    want = source_digest(source)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(40):
                assert source_digest(source) == want
        except BaseException as e:  # collected: a thread's exception would otherwise be lost
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_a_candidate_that_changes_the_reference_problem_is_a_failure_not_a_kernel() -> None:
    """Every candidate of every pass must leave `reference`, `make_inputs`, ... and the module names they read
    byte-identical (the LLM validator's rule, now applied to rule passes too): a rewrite of fused_11's GROUP_SIZE
    (read by its reference's group norm) is recorded as a failure, and `apply` declines it, with the reason."""
    from dataclasses import dataclass
    from typing import ClassVar

    from pallasopt.passes.base import Pass
    from pallasopt.passes.pipeline import apply_pipeline
    from pallasopt.search.candidates import apply_choice
    from pallasopt.search.node import Node

    @dataclass(frozen=True)
    class Regroup(Pass):
        name: ClassVar[str] = "regroup"

        def apply(self, ir: KernelIR) -> KernelIR:
            return ir.with_source(ir.source.replace("GROUP_SIZE = 256", "GROUP_SIZE = 512"), self.spec())

    ir = KernelIR.from_file(ROOT / "bench" / "kernels" / "fused_11_matmul_groupnorm.py")
    root = Node((), ir.digest, None, 0, ir)
    nodes: dict[str, Node] = {root.digest: root}
    events: list[tuple[str, dict]] = []
    node, new = apply_choice(root, Regroup(), nodes, lambda e, i: events.append((e, i)))
    assert node is None and not new
    (failed,) = [n for n in nodes.values() if n.error]
    assert "changes what the oracle checks" in failed.error and "GROUP_SIZE" in failed.error
    _, (rec,) = apply_pipeline(ir, [Regroup()])
    assert not rec.applied and "GROUP_SIZE" in rec.reason
