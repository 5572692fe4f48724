"""`pallasopt bench --jaxbench / --maxkernel`: task discovery on a JAXBench-shaped tree built from our fixtures,
and one real end-to-end run through the console script (model tier, smallest search)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pallasopt.bench.suites import import_tasks, jaxbench_tasks, maxkernel_tasks
from pallasopt.errors import UsageError

FIX = Path(__file__).resolve().parent / "fixtures"
CLI = str(Path(sys.executable).with_name("pallasopt"))


@pytest.fixture
def jaxbench_tree(tmp_path: Path) -> Path:
    """The layout of aryatschand/JAXBench with our own files: a level2 task, the LLM's reply for it (a .py file
    holding prose and fences, as JAXBench stores raw replies), one the suite marks incorrect, and its eval JSON."""
    root = tmp_path / "JAXBench"
    (root / "jaxkernelbench" / "level2").mkdir(parents=True)
    gen = root / "pallas_eval" / "generated" / "m1" / "jaxkernelbench_level2"
    gen.mkdir(parents=True)
    (root / "pallas_eval" / "results").mkdir(parents=True)
    for name in ("1_Gemm_Bias_ReLU", "2_Gemm_Bias_ReLU_wrong"):
        shutil.copy(FIX / "kernelbench" / "gemm_bias_relu.py", root / "jaxkernelbench" / "level2" / f"{name}.py")
    shutil.copy(FIX / "kernelbench" / "gemm_bias_relu_reply.md", gen / "1_Gemm_Bias_ReLU.py")
    shutil.copy(FIX / "kernelbench" / "gemm_no_bias.py", gen / "2_Gemm_Bias_ReLU_wrong.py")
    shutil.copytree(FIX / "jaxbench" / "12p_RMSNorm", root / "benchmark" / "12p_RMSNorm")
    results = [
        {"name": "1_Gemm_Bias_ReLU", "level": "level2", "correct": True, "original_ms": 0.15, "generated_ms": 1.2},
        {"name": "2_Gemm_Bias_ReLU_wrong", "level": "level2", "status": "error", "error": "shape mismatch"},
    ]
    (root / "pallas_eval" / "results" / "eval_m1.json").write_text(json.dumps({"metadata": {}, "results": results}))
    return root


def test_jaxbench_discovery_follows_the_suite_record(jaxbench_tree: Path) -> None:
    tasks = jaxbench_tasks(jaxbench_tree, "m1")
    assert [t.name for t in tasks] == ["1_Gemm_Bias_ReLU"]
    assert tasks[0].recorded == {"original_ms": 0.15, "generated_ms": 1.2}
    assert len(jaxbench_tasks(jaxbench_tree, "m1", all_generated=True)) == 2
    (own,) = jaxbench_tasks(jaxbench_tree)  # without --generated: the suite's own optimized.py kernels
    assert own.name == "12p_RMSNorm" and own.kernel is not None and own.kernel.name == "optimized.py"
    with pytest.raises(UsageError, match="no generated kernels"):
        jaxbench_tasks(jaxbench_tree, "m2")
    with pytest.raises(UsageError, match="not a JAXBench checkout"):
        jaxbench_tasks(jaxbench_tree / "jaxkernelbench")


def test_import_failures_are_rows_not_crashes(jaxbench_tree: Path, tmp_path: Path) -> None:
    tasks = jaxbench_tasks(jaxbench_tree, "m1", all_generated=True)
    broken = jaxbench_tree / "jaxkernelbench" / "level2" / "2_Gemm_Bias_ReLU_wrong.py"
    broken.write_text(broken.read_text().replace("def get_inputs", "def get_inputz"))
    done = import_tasks(tasks, tmp_path / "modules")
    assert done[0].module is not None and done[0].fixed and done[0].error is None
    assert done[1].module is None and done[1].error is not None and "no `get_inputs`" in done[1].error


def test_maxkernel_tasks_with_kernels_from(tmp_path: Path) -> None:
    root = tmp_path / "dataset"
    shutil.copytree(FIX / "maxkernel", root)
    names = {t.name: t.kernel for t in maxkernel_tasks(root)}
    assert set(names) == {"12p_RMSNorm", "21k_Scale_Chained"}  # 11p_Megablox_GMM ships no kernel
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    shutil.copy(FIX / "maxkernel" / "12p_RMSNorm" / "optimized.py", kernels / "11p_Megablox_GMM.py")
    assert maxkernel_tasks(root, kernels)[0].kernel == kernels / "11p_Megablox_GMM.py"


@pytest.mark.slow
def test_bench_jaxbench_end_to_end(jaxbench_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    argv = [CLI, "bench", "--jaxbench", str(jaxbench_tree), "--generated", "m1", "--no-compile"]
    argv += ["--beam", "1", "--depth", "1", "--jobs", "1", "--out", str(out)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr
    (json_path,) = out.glob("jaxbench-m1-v6e-*.json")  # JAXBench's numbers are v6e: the default target
    doc = json.loads(json_path.read_text())
    (row,) = doc["rows"]
    assert row["kernel"] == "1_Gemm_Bias_ReLU" and row["correct"] and row["tier"] == "model"
    assert row["suite"]["original_ms"] == 0.15 and "pltpu.repeat" in row["suite"]["fixed"][0]
    assert row["suite_speedup"] == pytest.approx(0.15 / 1.2)
    assert doc["summary"]["suite_speedup_kernels"] == 1 and (out / "modules" / "1_Gemm_Bias_ReLU.py").is_file()
    assert "The suite's own record beside ours" in json_path.with_suffix(".md").read_text()


def test_merge_combines_shards_into_one_result_set(tmp_path: Path) -> None:
    from pallasopt.bench import Row
    from pallasopt.bench.render import write_results
    from pallasopt.bench.runner import merge_results

    meta = {
        "command": "c",
        "target": "v6e",
        "date": "d",
        "beam": 1,
        "depth": 1,
        "jobs": 1,
        "budget_seconds": None,
        "machine": "m",
        "versions": {},
        "wall_s": 10.0,
    }
    a = Row(
        "k1",
        "k1.py",
        correct=True,
        tier="compiler",
        baseline_s=2.0,
        best_s=1.0,
        speedup=2.0,
        recipe=("tile{x=1}",),
        suite={"original_ms": 1.0, "generated_ms": 4.0},
    )
    b = Row("k2", "k2.py", correct=True, tier="compiler", baseline_s=3.0, best_s=1.0, speedup=3.0)
    pa = write_results(tmp_path / "a", "s-v6e", [a], meta, plot=False)["json"]
    pb = write_results(tmp_path / "b", "s-v6e", [b], {**meta, "command": "c2"}, plot=False)["json"]
    out = merge_results([pa, pb], tmp_path / "m")
    doc = json.loads(out["json"].read_text())
    assert [r["kernel"] for r in doc["rows"]] == ["k1", "k2"] and doc["meta"]["wall_s"] == 20.0
    assert doc["summary"]["geomean_speedup"] == pytest.approx(6**0.5) and doc["summary"]["suite_speedup_kernels"] == 1
    assert Row.from_dict(doc["rows"][0]) == a
