"""The executor layer without Ray: nothing imports Ray unless asked, a missing Ray is one line and exit 4, and the
tiers send each evaluation to their executor as a job with its resources (a recording fake executor)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from concurrent.futures import Future
from typing import Any

from conftest import ROOT

from pallasopt import cli
from pallasopt.cost_model.hardware import get_chip
from pallasopt.executors import Job, Needs, Submitting, make_executor
from pallasopt.executors.jobs import hardware_needs
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.search.tiers import Tiers

MATMUL = ROOT / "examples" / "matmul.py"


def test_nothing_imports_ray_without_executor_ray() -> None:
    code = (
        "import sys\n"
        "import pallasopt.optimize\nfrom pallasopt import cli\n"
        "from pallasopt.bench import runner\n"
        "from pallasopt.executors import make_executor\n"
        "from pallasopt.search.tiers import Tiers\n"
        "from pallasopt.cost_model.hardware import get_chip\n"
        "cli.build_parser().parse_args(['run', 'k.py'])\n"
        "ex = make_executor('local')\n"
        "Tiers(get_chip('v5e'), executor=ex).unavailable('hardware')\n"
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_executor_ray_without_ray_is_one_line_and_exit_4(monkeypatch, capsys) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    assert cli.main(["run", str(MATMUL), "--executor", "ray"]) == 4
    assert cli.main(["bench", "--kernels", "nothing", "--executor", "ray"]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        err == ["pallasopt: error: --executor ray needs Ray, which is not installed (pip install 'pallasopt[ray]')"] * 2
    )


def test_ray_address_needs_executor_ray(capsys) -> None:
    assert cli.main(["run", str(MATMUL), "--ray-address", "127.0.0.1:6379"]) == 2
    assert "--ray-address needs --executor ray" in capsys.readouterr().err


class Recording(Submitting):
    """An executor that answers each job with its `lost` record and keeps the job."""

    name = "recording"

    def __init__(self, hosts: dict[str, float]) -> None:
        self.jobs: list[Job] = []
        self.hosts = hosts

    def run(self, job: Job) -> Any:
        self.jobs.append(job)
        return job.lost("recorded")

    def slots(self) -> int:
        return 1

    def unavailable(self, needs: Needs) -> str | None:
        missing = [k for k, v in needs.resources.items() if self.hosts.get(k, 0) < v]
        return f"no host has {missing}" if missing else None


def test_tiers_send_jobs_with_their_needs_and_get_the_failed_record_back() -> None:
    v5e = get_chip("v5e")
    ir = KernelIR.from_file(MATMUL)
    ex = Recording({"TPU": 4})
    tiers = Tiers(v5e, executor=ex)
    assert tiers.unavailable("hardware") == "no host has ['v5e']"  # a TPU host, but not declared as a v5e one
    check = tiers.check(ir, (1, 2))
    assert not check.ok and check.data["status"] == "crash" and check.message == "recorded"
    compiled = tiers.compiler(ir)
    assert compiled is not None and not compiled.ok and "crash: recorded" in compiled.message
    kinds = [(j.kind, j.needs) for j in ex.jobs]
    assert kinds[0] == ("check", Needs(cpus=1.0)) and {k for k, _ in kinds[1:]} == {"compile"}
    assert ex.jobs[0].kwargs["seeds"] == (1, 2) and ex.jobs[0].timeout_s == 300.0
    assert hardware_needs(v5e) == Needs(cpus=1.0, resources={"TPU": 1.0, "v5e": 1.0})
    assert hardware_needs(get_chip("h100")).gpus == 1.0
    ex.hosts["v5e"] = 4
    assert tiers.unavailable("hardware") is None


def _div(a: int, b: int) -> tuple[int, int]:
    return divmod(a, b)


def test_local_executor_runs_the_job_here() -> None:
    ex = make_executor("local")
    fut: Future[Any] = ex.submit(Job("x", _div, {"a": 7, "b": 2}, 1.0, str))
    assert fut.result(timeout=10) == (3, 1) and ex.run(Job("x", _div, {"a": 9, "b": 4}, 1.0, str)) == (2, 1)
    ex.close()


class TimingOut(Recording):
    """Compiles time out when given less than the tier's own timeout (as a compile stopped by the budget would)."""

    def run(self, job: Job) -> Any:
        self.jobs.append(job)
        if job.kind == "compile" and job.timeout_s < 180.0:
            from pallasopt.cost_model.compiler import CompileReport

            return CompileReport(ok=False, target="v5e", error="did not finish", error_kind="timeout")
        return job.lost("recorded")


def test_a_compile_stopped_at_the_search_budget_is_no_verdict_and_is_not_kept(tmp_path) -> None:
    # With a deadline the compile's timeout is what the budget leaves; stopped there, the result says so, the tier
    # does not retry at the full dims (slower still), and the kernel DB does not keep it (a later run tries again).
    import time

    from pallasopt.db.store import KernelDB
    from pallasopt.search.cached import CachedEvaluator

    ir = KernelIR.from_file(MATMUL)
    ex = TimingOut({})
    tiers = Tiers(get_chip("v5e"), executor=ex)
    r = tiers.compiler(ir, deadline=time.perf_counter() + 30.0)
    assert r is not None and not r.ok and r.data.get("budget_cut") and "search budget" in r.message
    assert len(ex.jobs) == 1 and 25.0 <= ex.jobs[0].timeout_s <= 30.0
    with KernelDB.open(tmp_path / "k.db") as db:
        wid = db.workload(ir.digest, str(MATMUL), dict(ir.dims), "v5e", {"jax": "test"})
        cached = CachedEvaluator(tiers, db, wid, "v5e")
        r2 = cached.compiler(ir, deadline=time.perf_counter() + 30.0)
        assert r2 is not None and r2.data.get("budget_cut")
        assert db.get_eval(cached.candidate_id(ir), "compiler", "v5e") is None  # no verdict: not kept
        r3 = cached.compiler(ir)  # without a budget: the tier's own timeout, and the verdict is kept
        assert r3 is not None and not r3.data.get("budget_cut") and ex.jobs[-1].timeout_s == 180.0
        assert db.get_eval(cached.candidate_id(ir), "compiler", "v5e") is not None
