"""bench/hw_neighbors.py: one step around a bench kernel's best recipe, for the chip to time (hw_measure's probe)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import ROOT, bench_script

from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.registry import parse_pipeline

MATMUL = ROOT / "examples" / "matmul.py"
RECIPE = ["tile{call=0,bm=256}", "tile{call=0,bn=256}"]


def _source(recipe: list[str]) -> str:
    ir = KernelIR.from_file(MATMUL)
    for p in parse_pipeline(",".join(recipe)) if recipe else ():
        ir = p.rewrite(ir)
    return ir.source


def test_the_best_first_then_its_prefixes_then_one_choice_of_each_pass(tmp_path: Path) -> None:
    nb = bench_script("hw_neighbors")
    bench = tmp_path / "bench.json"
    row = {"kernel": "matmul", "path": str(MATMUL.relative_to(ROOT)), "recipe": RECIPE}
    bench.write_text(json.dumps({"meta": {"target": "v5e"}, "rows": [row]}))
    out = tmp_path / "probe.json"
    assert nb.main([str(bench), "--kernels", "mat*", "--tiles", "3", "--out", str(out)]) == 0
    probe = json.loads(out.read_text())
    recipes = [r.split("|") for r in probe["kernels"]["matmul"]]
    why = probe["why"]["matmul"]
    assert recipes[:2] == [RECIPE, RECIPE[:1]] and why[:2] == ["best", "prefix 1"]
    steps = recipes[2:]
    assert all(r[:2] == RECIPE and len(r) == 3 for r in steps)
    assert sum(w.startswith("tile ") for w in why) == 3  # the tile pass's three best by the model
    assert {r[2].split("{")[0] for r in steps} - {"tile"}  # other passes' choices too
    shas = [hashlib.sha1(_source(r).encode()).hexdigest() for r in recipes]
    assert len(set(shas)) == len(shas)  # no two variants with the same source


def test_a_probe_recipe_of_nothing_is_the_naive_kernel(tmp_path: Path) -> None:
    hw = bench_script("hw_measure")
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"kernels": {"fused_30_avgpool_linear": ["", "tile{call=1,tm=32}"]}}))
    assert hw.prepare(None, None, tmp_path / "run", probe) == 0
    entries = json.loads((tmp_path / "run" / "manifest.json").read_text())["entries"]
    naive = (ROOT / "bench" / "kernels" / "fused_30_avgpool_linear.py").read_text()
    assert [e["id"] for e in entries] == ["fused_30_avgpool_linear__p0", "fused_30_avgpool_linear__p1"]
    assert (tmp_path / "run" / entries[0]["file"]).read_text() == naive
    assert entries[0]["sha1"] == hashlib.sha1(naive.encode()).hexdigest()


def test_a_probe_times_hand_written_variants_beside_the_recipes(tmp_path: Path) -> None:
    hw = bench_script("hw_measure")
    (tmp_path / "v").mkdir()
    hand = "# a rewrite no pass makes yet\n" + (ROOT / "bench" / "kernels" / "fused_30_avgpool_linear.py").read_text()
    (tmp_path / "v" / "fused.py").write_text(hand)
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"kernels": {}, "files": {"fused_30_avgpool_linear": ["v/fused.py"]}}))
    assert hw.prepare(None, None, tmp_path / "run", probe) == 0
    (entry,) = json.loads((tmp_path / "run" / "manifest.json").read_text())["entries"]
    assert entry["id"] == "fused_30_avgpool_linear__fused" and entry["recipe"] == [] and entry["hand"] == "v/fused.py"
    assert entry["kernel_path"] == "bench/kernels/fused_30_avgpool_linear.py"  # its reference and inputs
    assert (tmp_path / "run" / entry["file"]).read_text() == hand
    assert entry["sha1"] == hashlib.sha1(hand.encode()).hexdigest()


def test_best_takes_the_fastest_recipe_that_still_replays_and_lists_hand_variants_apart(tmp_path: Path) -> None:
    hw = bench_script("hw_measure")
    fast, slow, stale = RECIPE, RECIPE[:1], ["tile{call=0,bm=512}"]
    hand = "# hand-written\n" + MATMUL.read_text()
    sha = {k: hashlib.sha1(s.encode()).hexdigest() for k, s in (("fast", _source(fast)), ("slow", _source(slow)))}
    entries = [
        {"id": "a", "kernel": "matmul", "recipe": fast, "sha1": sha["fast"]},
        {"id": "b", "kernel": "matmul", "recipe": slow, "sha1": sha["slow"]},
        {"id": "c", "kernel": "matmul", "recipe": stale, "sha1": "0" * 40},  # no longer what the recipe makes
        {
            "id": "d",
            "kernel": "matmul",
            "recipe": [],
            "hand": "v/h.py",
            "sha1": hashlib.sha1(hand.encode()).hexdigest(),
        },
    ]
    (tmp_path / "manifest.json").write_text(json.dumps({"entries": entries}))
    xla = {"median_s": 2e-3, "ok": True}
    times = {"a": 1.5e-3, "b": 2.5e-3, "c": 1e-3, "d": 1.2e-3}
    (tmp_path / "hw.jsonl").write_text(
        "".join(json.dumps({"id": i, "ok": True, "median_s": t, "xla": xla}) + "\n" for i, t in times.items())
    )
    runs = tmp_path / "runs.json"
    runs.write_text(
        json.dumps({"runs": [{"manifest": str(tmp_path / "manifest.json"), "results": [str(tmp_path / "hw.jsonl")]}]})
    )
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": [{"kernel": "matmul", "path": str(MATMUL.relative_to(ROOT))}]}))
    out = tmp_path / "best.json"
    assert hw.main(["best", str(bench), "--runs", str(runs), "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["recipe"]["how"] == fast and row["recipe"]["best_h"] == 1.5e-3  # not the stale 1.0 ms record
    assert row["recipe"]["vs_xla_h"] == pytest.approx(2e-3 / 1.5e-3)
    assert row["hand"]["how"] == "v/h.py" and row["hand"]["best_h"] == 1.2e-3
    summary = json.loads(out.read_text())["summary"]
    assert summary["timed"] == 1 and summary["slower_than_xla_h"] == 0
