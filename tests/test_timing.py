"""The hardware tier's timing and on-chip comparison (run here on the CPU, where they must refuse to time a kernel),
and the report of bench/hw_measure.py (the bench measured on a chip)."""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ROOT, bench_script

from pallasopt.harness import timing
from pallasopt.workload import load_source


def test_time_batched_batches_short_calls_and_not_long_ones() -> None:
    short = jax.jit(lambda x: x + 1.0)
    args = [(jnp.ones((8, 128)),), (jnp.zeros((8, 128)),)]
    r = timing.time_batched(short, args, batches=3)
    assert r["calls"] > 1 and r["batches"] == 3
    assert 0 < r["min_s"] <= r["median_s"] < timing.MIN_BATCH_S

    def slow(x: Any) -> Any:
        time.sleep(timing.MIN_BATCH_S * 1.5)
        return x

    r = timing.time_batched(slow, args, batches=3)
    assert r["calls"] == 1 and r["median_s"] >= timing.MIN_BATCH_S


def test_time_batched_never_hands_two_consecutive_calls_the_same_inputs() -> None:
    # XLA keeps an input on the chip between two runs given the same buffer (fused_10's reference on a v5e: 0.210 ms
    # with the same inputs every call, 0.300 ms rotating); a timing must not credit any program with that.
    seen: list[int] = []

    def record(x: Any) -> Any:
        seen.append(int(x))
        return x

    r = timing.time_batched(record, [(0,), (1,), (2,)], batches=4)
    assert r["input_sets"] == 3 and len(seen) == 2 + r["calls"] * 4  # a warm-up call, one to size a batch
    assert all(a != b for a, b in itertools.pairwise(seen))
    assert set(seen[2:]) == {0, 1, 2}


def test_compare_outputs_uses_the_oracles_tolerance_and_never_passes_nan() -> None:
    ref = np.linspace(-1, 1, 4096, dtype=np.float32).reshape(32, 128)
    assert timing.compare_outputs(ref.copy(), ref, None)[0] == ""
    off = ref + 0.05
    why, err = timing.compare_outputs(off, ref, None)
    assert "outside" in why and err == pytest.approx(0.05, rel=1e-3)
    assert "systematic" in timing.compare_outputs(off, ref, {"rtol": 0.1, "atol": 0.1})[0]
    noisy = ref * (1 + 0.01 * np.random.default_rng(0).standard_normal(ref.shape)).astype(np.float32)
    assert timing.compare_outputs(noisy, ref, {"rtol": 0.1, "atol": 0.1})[0] == ""
    nan = ref.copy()
    nan[3, 5] = np.nan
    assert "NaN" in timing.compare_outputs(nan, ref, {"rtol": 1.0, "atol": 1.0})[0]
    assert timing.compare_outputs((ref, off), (ref, ref), None)[0].startswith("output 1")


def test_run_timing_refuses_the_cpu() -> None:
    w = load_source((ROOT / "examples" / "matmul.py").read_text(), str(ROOT / "examples" / "matmul.py"))
    r = timing.run_timing(w, 3)
    assert not r["ok"] and "no accelerator" in r["message"]


class _ChipLike:
    """A workload whose reference, like XLA's float32 matmul on a TPU, is off the exact result at default precision
    (by `xla_off`) and exact at "highest" (read at trace time, as the matmul precision is)."""

    def __init__(self, xla_off: float) -> None:
        self.tolerance = {"rtol": 1e-4, "atol": 1e-4}
        self.xla_off = xla_off
        self.exact = jnp.asarray(np.random.default_rng(1).standard_normal((64, 128)), jnp.float32)

    def reference(self, x: Any) -> Any:
        highest = str(jax.config.jax_default_matmul_precision or "").lower() in ("highest", "float32")
        return x + self.exact if highest else x + self.exact * (1 + self.xla_off)


@pytest.mark.parametrize(
    ("xla_off", "kernel_off", "ok", "note"),
    [
        (0.0, 0.0, True, ""),  # both exact
        (3e-3, 0.0, True, "highest precision"),  # the kernel is exact, XLA's default precision is not (fused_30)
        (3e-3, 3e-3, True, ""),  # the same result as XLA's at default precision
        (3e-3, 4e-3, True, "as XLA"),  # within AS_XLA of it
        (3e-3, 3e-2, False, ""),  # ten times XLA's error: the kernel
        (0.0, 3e-3, False, ""),  # XLA is exact, the kernel is not
    ],
)
def test_the_chip_holds_a_kernel_to_the_exact_reference_or_to_xlas_own_error(xla_off, kernel_off, ok, note) -> None:
    w = _ChipLike(xla_off)
    x = jnp.zeros((64, 128), jnp.float32)
    out = x + w.exact * (1 + kernel_off)
    why, got = timing.device_verdict(w, out, jax.jit(w.reference), (x,))
    assert (why == "") is ok and note in got and (got == "") is (note == "")
    if not ok:
        assert "outside" in why and "highest precision" in why


def _record(i: str, t: float, x: float, ok: bool = True, err: float = 0.0, x_ok: bool = True, x_err: float = 0.0):
    return {"id": i, "ok": ok, "max_rel": err, "median_s": t, "why": "" if ok else "output 0: outside",
            "device": "TPU v5 lite", "xla": {"median_s": x, "ok": x_ok, "max_rel": x_err}}  # fmt: skip


def test_hw_report_counts_against_xla_merges_runs_and_holds_kernels_to_xlas_precision(tmp_path: Path) -> None:
    hw = bench_script("hw_measure")
    entries = []
    for k, recipe in (("a", ["tile{call=0}"]), ("b", ["tile{call=0}"]), ("c", ["tile{call=0}"]), ("d", [])):
        tiers = {"compiler": 1.0, "model": 1.0, "xla_compiler": 1.0}
        base = {"group": "bench", "kernel": k, "kernel_path": f"{k}.py", "tiers": {**tiers, "compiler": 4.0}}
        entries.append({**base, "id": f"{k}__baseline", "variant": "baseline", "file": "x"})
        if recipe:
            entries.append({**base, "id": f"{k}__best", "variant": "best", "recipe": recipe, "tiers": tiers})
    (tmp_path / "manifest.json").write_text(json.dumps({"entries": entries}))
    run1 = [
        _record("a__baseline", 4e-3, 1e-3),
        _record("a__best", 0.9e-3, 1e-3),  # faster than XLA
        _record("b__baseline", 4e-3, 1e-3, ok=False, err=2e-3, x_ok=False, x_err=2e-3),
        _record("b__best", 1.2e-3, 1e-3, ok=False, err=2e-3, x_ok=False, x_err=2e-3),  # as XLA, slower
        _record("c__baseline", 4e-3, 1e-3),
        _record("c__best", 0.5e-3, 1e-3, ok=False, err=5e-2, x_ok=True),  # wrong on the chip: not counted
        _record("d__baseline", 2e-3, 1e-3),  # no recipe: the naive kernel is the best, slower than XLA
    ]
    run2 = [_record("a__best", 1.1e-3, 1e-3)]
    f1, f2 = tmp_path / "r1.jsonl", tmp_path / "r2.jsonl"
    f1.write_text("\n".join(json.dumps(r) for r in run1))
    f2.write_text(json.dumps(run2[0]))
    out = tmp_path / "out.json"
    assert hw.report(tmp_path, [f1, f2], tmp_path / "out.md", out) == 0
    data = json.loads(out.read_text())
    s = data["summary"]
    rows = {r["kernel"]: r for r in data["rows"]}
    assert rows["a"]["best"]["runs"] == 2 and rows["a"]["best"]["median_s"] == pytest.approx(1e-3)
    assert s["max_run_to_run_spread"] == pytest.approx(1.1 / 0.9 - 1)
    assert rows["a"]["vs_xla_h"] == pytest.approx(1.0) and rows["b"]["vs_xla_h"] == pytest.approx(1 / 1.2)
    assert rows["c"]["vs_xla_h"] is None and s["failed"] == ["c"]
    assert rows["d"]["speedup_h"] == pytest.approx(1.0) and rows["d"]["vs_xla_h"] == pytest.approx(0.5)
    assert (s["faster_than_xla_h"], s["slower_than_xla_h"], s["slower_by_2pct_h"]) == (0, 2, 2)
    md = (tmp_path / "out.md").read_text()
    assert "as XLA (max rel err 2.0e-03" in md and "| `c` | FAIL" in md


def test_spearman_of_hw_measure() -> None:
    hw = bench_script("hw_measure")
    assert hw.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert hw.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(hw.spearman([1, 2], [1, 2]))


def test_hw_time_skips_what_earlier_runs_timed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hw = bench_script("hw_measure")
    entries = [{"id": i, "group": "bench", "kernel": i, "kernel_path": "x.py", "file": "x"} for i in ("a", "b", "c")]
    (tmp_path / "manifest.json").write_text(json.dumps({"entries": entries}))
    out, earlier = tmp_path / "out.jsonl", tmp_path / "earlier.jsonl"
    out.write_text(json.dumps({"id": "a"}) + "\n")
    earlier.write_text(json.dumps({"id": "b"}) + "\n")
    assert hw.time_all(tmp_path, out, None, "a,b", [earlier]) == 0
    assert capsys.readouterr().out.startswith("0 to time (2 done)")
    assert out.read_text().count("\n") == 1


def test_the_bandwidth_fit_recovers_the_efficiency_behind_synthetic_chip_times() -> None:
    """Chip times made as max(static, floor / 0.6), one in four 10% off: the fit (training kernels only) finds 0.6, and
    the validation error at the fitted value is below the error at eff = 1."""
    fit = bench_script("hw_bandwidth_fit")
    pts = []
    for i in range(16):
        static, floor = 1e-3 * (1 + i % 5), 1e-3 * (0.5 + 0.4 * i)
        wobble = 1.10 if i % 8 in (0, 5) else 1.0  # one outlier in four, in either half
        pts.append((f"k{i:02d}", "best", static, floor, max(static, floor / 0.6) * wobble))
    r = fit.fit(pts)
    assert r["eff"] == pytest.approx(0.6, abs=0.03)
    assert set(r["train_kernels"]).isdisjoint(r["validation_kernels"])
    val = r["validation_median_abs_log_err"]
    assert val["fitted"] < val["eff=1"]


def test_the_bandwidth_fit_scores_the_model_on_the_same_split() -> None:
    fit = bench_script("hw_bandwidth_fit")
    report = {
        "rows": [{"kernel": f"k{i}", "baseline": {"median_s": 2e-3}, "best": {"median_s": 1e-3}} for i in range(4)]
    }
    # Model times per eff: right at eff = 0.5 (2x the datasheet-bandwidth time), off by 2x at eff = 1.
    data = {
        f"k{i}__{v}": {e: (2e-3 if v == "baseline" else 1e-3) * 0.5 / e for e in (0.5, 0.75, 1.0)}
        for i in range(4)
        for v in ("baseline", "best")
    }
    split = {"eff": 0.75, "train_kernels": ["k0", "k2"], "validation_kernels": ["k1", "k3"]}
    m = fit.model_fit(report, data, split)
    assert m["points"] == 8 and m["model_own_eff"] == 0.5
    assert m["validation_median_abs_log_err"]["model_own"] == pytest.approx(0.0)
    assert m["validation_median_abs_log_err"]["eff=1"] == pytest.approx(math.log(2))


def test_the_joint_fit_recovers_a_p_norm_behind_synthetic_chip_times() -> None:
    """Chip times made as (S^4 + (F / 0.8)^4)^(1/4): the joint fit on the training kernels finds p = 4 and eff near
    0.8; it beats max on held-out points and orders their close pairs as the chip does, where max (at its own eff)
    ties floor-bound variants that differ in their static part."""
    fit = bench_script("hw_bandwidth_fit")

    def chip(s: float, f: float) -> float:
        return float((s**4 + (f / 0.8) ** 4) ** 0.25)

    train = [(f"k{i:02d}", "best", 1e-3 * (1 + i % 5), 1e-3 * (0.5 + 0.4 * i), 0.0) for i in range(16)]
    train = [(k, v, s, f, chip(s, f)) for k, v, s, f, _ in train]
    # held out: per kernel two floor-bound tiles with the same floor, one with three times the static part
    held = [(f"h{i}", v, s, 2e-3, chip(s, 2e-3)) for i in range(6) for v, s in (("a", 0.6e-3), ("b", 1.8e-3))]
    r = fit.joint_fit(train, {"later": held}, 0.7)
    assert r["p"] == 4.0 and r["eff"] == pytest.approx(0.8, abs=0.02)
    later = r["scores"]["later"]
    assert later["median_abs_log_err"]["p-norm"] < later["median_abs_log_err"]["max"]
    assert later["pairs_ordered_right"] == {"max": 0, "p-norm": 6, "pairs": 6}


def test_hw_compare_puts_two_chip_runs_best_recipes_side_by_side(tmp_path: Path) -> None:
    hw = bench_script("hw_measure")
    for run, recipes in (("old", {"a": "tile{call=0,bm=256}", "b": "tile{call=0}"}),
                         ("new", {"a": "tile{call=0,bm=512}", "b": "tile{call=0}"})):  # fmt: skip
        d = tmp_path / run
        d.mkdir()
        entries = [{"group": "bench", "kernel": k, "id": f"{k}__best", "variant": "best", "recipe": [r]}
                   for k, r in recipes.items()]  # fmt: skip
        (d / "manifest.json").write_text(json.dumps({"entries": entries}))
        times = {"old": (1e-3, 2e-3), "new": (0.8e-3, 2.02e-3)}[run]
        (d / "r.jsonl").write_text(
            "\n".join(json.dumps(_record(f"{k}__best", t, 1e-3)) for k, t in zip("ab", times, strict=True))
        )
    md = tmp_path / "cmp.md"
    assert (
        hw.compare((tmp_path / "old", [tmp_path / "old/r.jsonl"]), (tmp_path / "new", [tmp_path / "new/r.jsonl"]), md)
        == 0
    )
    text = md.read_text()
    assert "recipe changed on 1: faster by more than 2% on 1, slower by more than 2% on 0" in text
    assert "same recipe on 1 (the sessions' run-to-run spread): new / old 1.010 - 1.010" in text
    assert "| `a` | `tile{call=0,bm=256}` | 1.000 | `tile{call=0,bm=512}` | 0.800 | 0.800 |" in text


def test_hw_current_joins_chip_records_to_a_bench_run_by_exact_source(tmp_path: Path) -> None:
    """`hw_measure.py current`: a recipe's chip figure is one timed on that exact source (sha1), from any earlier run;
    a recipe whose source no run timed is not timed, whatever its text; a record that fails on the chip (and not
    as XLA's own default-precision result does) never counts."""
    hw = bench_script("hw_measure")
    naive = (ROOT / "examples" / "matmul.py").read_text()
    tiled = hw._apply(ROOT / "examples" / "matmul.py", ["tile{call=0,bm=256}"])
    other = hw._apply(ROOT / "examples" / "matmul.py", ["tile{call=0,bm=512}"])
    entries = [{"id": "m__p0", "sha1": hw.source_sha1(naive)}, {"id": "m__p1", "sha1": hw.source_sha1(tiled)},
               {"id": "m__p2", "sha1": hw.source_sha1(other)}, {"id": "old", "file": "x"}]  # fmt: skip
    (tmp_path / "manifest.json").write_text(json.dumps({"entries": entries}))
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in (
        _record("m__p0", 4e-3, 1e-3), _record("m__p1", 0.9e-3, 1e-3), _record("old", 1e-6, 1e-3),
        _record("m__p2", 0.1e-3, 1e-3, ok=False, err=5e-2),  # wrong on the chip
    )))  # fmt: skip
    (tmp_path / "b.jsonl").write_text(json.dumps(_record("m__p1", 1.1e-3, 1.2e-3)))
    results = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    runs = [{"manifest": str(tmp_path / "manifest.json"), "results": results}]
    records = hw.chip_records(runs)
    assert len(records[hw.source_sha1(tiled)]) == 2 and "old" not in str(records)  # no sha1: joins nothing
    bench = {"rows": [
        {"kernel": "t", "path": "examples/matmul.py", "recipe": ["tile{call=0,bm=256}"], "vs_xla": 1.5,
         "xla": {"tier": "compiler"}},
        {"kernel": "n", "path": "examples/matmul.py", "recipe": []},
        {"kernel": "u", "path": "examples/matmul.py", "recipe": ["tile{call=0,bn=256}"]},  # never timed
        {"kernel": "w", "path": "examples/matmul.py", "recipe": ["tile{call=0,bm=512}"]},
    ]}  # fmt: skip
    t, n, u, w = hw.current_rows(bench, records)
    assert t["best_h"] == pytest.approx(1.0e-3) and t["xla_h"] == pytest.approx(1.1e-3)
    assert t["vs_xla_h"] == pytest.approx(1.1) and t["speedup_h"] == pytest.approx(4.0) and t["vs_xla_tier"] == 1.5
    assert n["best_h"] == pytest.approx(4e-3) and n["vs_xla_h"] == pytest.approx(0.25)
    assert u["best_h"] is None and u["records"] == [] and u["failed_on_chip"] == 0
    assert w["best_h"] is None and w["failed_on_chip"] == 1


def test_hw_current_and_best_take_a_kernels_rotating_input_records_over_same_input_ones(tmp_path: Path) -> None:
    """Records timed with the inputs rotating call by call (`input_sets`, since 2026-12-08) replace a kernel's older
    same-input ones, whose XLA figure is too fast; a kernel with only old records keeps them, marked 'same'."""
    hw = bench_script("hw_measure")
    tiled = hw._apply(ROOT / "examples" / "matmul.py", ["tile{call=0,bm=256}"])
    other = hw._apply(ROOT / "examples" / "matmul.py", ["tile{call=0,bm=512}"])
    entries = [{"id": "p1", "sha1": hw.source_sha1(tiled), "kernel": "t", "recipe": ["tile{call=0,bm=256}"]},
               {"id": "p2", "sha1": hw.source_sha1(other), "kernel": "t", "recipe": ["tile{call=0,bm=512}"]}]  # fmt: skip
    (tmp_path / "manifest.json").write_text(json.dumps({"entries": entries}))
    old = [_record("p1", 1.0e-3, 0.8e-3), _record("p2", 0.9e-3, 0.8e-3)]  # XLA kept its input on the chip
    new = [{**_record("p1", 1.0e-3, 1.2e-3), "input_sets": 2}]
    (tmp_path / "old.jsonl").write_text("\n".join(json.dumps(r) for r in old))
    (tmp_path / "new.jsonl").write_text("\n".join(json.dumps(r) for r in new))
    runs = [{"manifest": str(tmp_path / "manifest.json"), "results": [str(tmp_path / "old.jsonl")]}]
    bench = {"rows": [{"kernel": "t", "path": "examples/matmul.py", "recipe": ["tile{call=0,bm=256}"]}]}
    (before,) = hw.current_rows(bench, hw.chip_records(runs))
    assert before["vs_xla_h"] == pytest.approx(0.8) and before["inputs"] == "same"
    (row,) = hw.best_rows(bench, hw.chip_variants(runs))
    assert row["recipe"]["best_h"] == pytest.approx(0.9e-3) and row["recipe"]["inputs"] == "same"
    runs[0]["results"].append(str(tmp_path / "new.jsonl"))
    (after,) = hw.current_rows(bench, hw.chip_records(runs))
    assert after["vs_xla_h"] == pytest.approx(1.2) and after["inputs"] == "rotating" and len(after["records"]) == 1
    (row,) = hw.best_rows(bench, hw.chip_variants(runs))  # p2's same-input record no longer competes
    assert row["recipe"]["best_h"] == pytest.approx(1.0e-3) and row["recipe"]["vs_xla_h"] == pytest.approx(1.2)


def test_hw_time_says_when_the_reference_cannot_run_at_highest_precision(tmp_path: Path) -> None:
    """On the TPU jax.lax.ragged_dot's own Mosaic kernel refuses `highest` precision on bf16 ("Bad lhs type"): the
    kernel was reported as failing on the chip before anything of it ran. Now it is timed, compared with XLA's
    default-precision outputs, and every record says so."""
    hw = bench_script("hw_measure")
    module = tmp_path / "k.py"
    module.write_text(
        "import jax\nimport jax.numpy as jnp\nfrom jax._src import config\nfrom jax.experimental import pallas as pl\n\n"
        'ENTRY = "double"\n\n\n'
        "def _kernel(x_ref, o_ref):\n    o_ref[...] = x_ref[...] * 2.0\n\n\n"
        "def double(x):\n"
        "    return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x)\n\n\n"
        "def reference(x):\n"
        '    if config.default_matmul_precision.value == "highest":\n'
        '        raise ValueError("Bad lhs type")\n'
        "    return x + x\n\n\n"
        "def make_inputs(key):\n    return (jax.random.normal(key, (8, 128), jnp.float32),)\n"
    )
    entry = {"id": "k__best", "file": "k.py", "kernel_path": str(module)}
    rec = hw.time_one(entry, tmp_path, {})
    assert rec["ok"] and rec["median_s"] > 0
    assert rec["reference"].startswith("default precision (at highest it failed: ValueError: Bad lhs type")
