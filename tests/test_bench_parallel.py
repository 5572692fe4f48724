"""`bench --executor ray`'s suite runner: several kernels' searches at once on driver threads (fakes, no Ray)."""

from __future__ import annotations

import json
import threading

from conftest import ROOT
from rich.console import Console

from pallasopt.bench.estimate import Estimate
from pallasopt.bench.parallel import kernels_in_flight, run_parallel
from pallasopt.cost_model.hardware import get_chip
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.search.tiers import TierResult, model_tier

V5E = get_chip("v5e")
MATMUL = ROOT / "examples" / "matmul.py"


class MeetingTiers:
    """Fixed-table tiers whose first check of each kernel waits until two kernels' searches are both checking:
    run one after the other, the wait would time out and the check fail."""

    def __init__(self) -> None:
        self.meet = threading.Barrier(2, timeout=240)  # generous: a loaded 2-core CI machine is slow, not serial
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def model(self, ir: KernelIR) -> TierResult:
        return model_tier(ir, V5E)

    def compiler(self, ir: KernelIR) -> TierResult | None:
        t = model_tier(ir, V5E).time_s
        return TierResult("compiler", True, (t or 0.0) * 1.25, "fake")

    def check(self, ir: KernelIR, seeds: tuple[int, ...], deadline: float | None = None) -> TierResult:
        with self.lock:
            first = ir.path not in self.seen
            self.seen.add(ir.path)
        if first:
            try:
                self.meet.wait()
            except threading.BrokenBarrierError:
                return TierResult("check", False, None, "the searches did not run at the same time")
        return TierResult("check", True, None, "fake check")

    def hardware(self, ir: KernelIR) -> TierResult | None:
        return None


def test_kernels_run_at_the_same_time_and_rows_keep_suite_order(tmp_path) -> None:
    kernels = []
    for name in ("a_matmul", "b_matmul"):
        (tmp_path / f"{name}.py").write_text(MATMUL.read_text())
        kernels.append(tmp_path / f"{name}.py")
    meta = {"command": "test", "target": "v5e", "date": "2000-01-01", "beam": 2, "depth": 1, "jobs": 1}
    meta |= {"budget_seconds": None, "machine": "test", "versions": {}, "wall_s": 0.0}
    out = tmp_path / "results"
    console = Console(file=open(tmp_path / "log.txt", "w"), width=200)  # noqa: SIM115
    rows, paths = run_parallel(
        kernels,
        out,
        "v5e-test",
        meta,
        console=console,
        estimator=lambda ir, fn: Estimate(fn, 0.01, method="fake"),
        in_flight=2,
        evaluator=MeetingTiers(),
        beam=2,
        depth=1,
        db_path=out / "bench.db",
        jobs=1,
    )
    console.file.close()
    assert [r.kernel for r in rows] == ["a_matmul", "b_matmul"]
    assert all(r.correct for r in rows), [(r.kernel, r.error, r.correct) for r in rows]
    assert all(r.xla is not None for r in rows)  # the estimator ran for each (one at a time)
    assert [r["kernel"] for r in json.loads(paths["json"].read_text())["rows"]] == ["a_matmul", "b_matmul"]
    assert kernels_in_flight(slots=64, jobs=2, kernels=50) == 32 and kernels_in_flight(2, 2, 50) == 2
    assert kernels_in_flight(64, 2, 3) == 3
