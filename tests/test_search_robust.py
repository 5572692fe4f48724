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
        if self.bad in ir.source:
            raise SystemError("AST constructor recursion depth mismatch (before=39, after=35)")
        return TierResult("check", True, None, "fake")

    def hardware(self, ir: KernelIR) -> TierResult | None:
        return None


def test_a_crash_evaluating_one_candidate_fails_it_and_the_search_goes_on() -> None:
    ir = KernelIR.from_file(MATMUL)
    tiers = Buggy(bad="bm=512")  # every candidate with 512-row blocks hits the bug
    cfg = SearchConfig(beam=4, depth=1, jobs=2)
    res = beam_search(ir, (TilePass,), tiers, V5E, cfg)  # type: ignore[arg-type]
    assert len(tiers.checked) >= 2
    crashed = [
        n
        for n in res.nodes.values()
        if "internal error: SystemError" in n.results.get("check", TierResult("", True)).message
    ]
    assert crashed, "no candidate met the bug: the test kernel's knobs changed"
    assert all("bm=512" not in n.ir.source for n in [res.best])
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
