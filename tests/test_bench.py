"""The bench runner: summary math on fixed rows, and the runner on tiny kernels with a fake evaluator and a fake
estimator (no compile, no interpret-mode check: milliseconds per kernel)."""

from __future__ import annotations

import argparse
import json
import math

import pytest
from conftest import ROOT, bench_script
from rich.console import Console

from pallasopt.bench import (
    ADD_BENCH,
    QUICK_KERNELS,
    Estimate,
    Row,
    bench_kernel,
    fast_p,
    find_kernels,
    geomean,
    loop_trips,
    render_markdown,
    run_suite,
    summarize,
)
from pallasopt.bench.render import summary_lines
from pallasopt.cost_model.hardware import get_chip
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.search.tiers import TierResult, model_tier

V5E = get_chip("v5e")
MATMUL = ROOT / "examples" / "matmul.py"


def row(
    name: str,
    speedup: float,
    *,
    correct: bool = True,
    xla: float | None = None,
    ht: float | None = None,
    error: str | None = None,
) -> Row:
    """A row whose best time is 1 ms (compiler tier) and baseline `speedup` ms."""
    est = lambda fn, t: Estimate(fn, t) if t is not None else None
    return Row(
        kernel=name,
        path=f"{name}.py",
        correct=correct,
        tier="compiler",
        baseline_s=speedup * 1e-3,
        best_s=1e-3,
        speedup=speedup,
        xla=est("reference", xla),
        hand_tuned=est("hand_tuned", ht),
        error=error,
    )


ROWS = [
    row("a", 4.0, xla=2e-3, ht=0.5e-3),  # 2x faster than XLA, at half the hand-tuned speed
    row("b", 1.0, xla=0.5e-3),  # no gain, slower than XLA
    row("c", 1.6, correct=False, xla=1e-3),  # not verified: counts as 1x
    row("d", 2.5),
    Row(kernel="e", path="e.py", error="KernelError: boom"),  # crashed search
]


def test_geomean() -> None:
    assert geomean([]) is None
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([0.5, 2.0]) == pytest.approx(1.0)


def test_summary_math_on_fixed_rows() -> None:
    s = summarize(ROWS)
    assert (s["kernels"], s["correct"], s["errors"]) == (5, 3, 1)
    # effective speedups: 4, 1, 1 (unverified), 2.5, 1 (crashed)
    assert s["geomean_speedup"] == pytest.approx((4 * 2.5) ** (1 / 5))
    assert s["geomean_speedup_clipped"] == pytest.approx(s["geomean_speedup"])
    assert s["fast_p"] == {"1": pytest.approx(2 / 5), "1.5": pytest.approx(2 / 5), "2": pytest.approx(2 / 5)}
    # vs XLA over every finished row with an estimate (c kept its baseline, which is its best time): 2, 0.5, 1
    assert s["vs_xla_kernels"] == 3 and s["vs_xla_geomean"] == pytest.approx(1.0) and s["beats_xla"] == 1
    assert (s["behind_xla"], s["behind_xla_by_2pct"]) == (1, 1)  # 0.5; the 1.0 is a tie, neither side
    assert s["hand_tuned_kernels"] == 1 and s["frac_hand_tuned_geomean"] == pytest.approx(0.5)
    assert s["tiers"] == {"compiler": 4}


def test_slower_than_xla_counts_ties_apart_and_names_the_2pct_band() -> None:
    rows = [row("tie", 2.0, xla=1e-3), row("near", 2.0, xla=0.99e-3), row("far", 2.0, xla=0.9e-3), row("x", 2.0)]
    s = summarize(rows)
    assert (s["vs_xla_kernels"], s["beats_xla"], s["behind_xla"], s["behind_xla_by_2pct"]) == (3, 0, 2, 1)
    assert dict(summary_lines(s))["geomean vs XLA reference (3 kernels)"].endswith(
        "faster than XLA on 0/3, slower on 2 (1 by more than 2%)"
    )


def test_clipping_and_fast_p_thresholds() -> None:
    rows = [row("slow", 0.5), row("x", 1.5), row("y", 2.0), row("z", 3.0)]
    s = summarize(rows)
    assert s["geomean_speedup"] == pytest.approx((0.5 * 1.5 * 2 * 3) ** 0.25)
    assert s["geomean_speedup_clipped"] == pytest.approx((1.0 * 1.5 * 2 * 3) ** 0.25)
    assert fast_p(rows, 1.0) == 0.75 and fast_p(rows, 1.5) == 0.5 and fast_p(rows, 2.0) == 0.25  # strictly faster
    assert fast_p([], 1.0) == 0.0


def test_ratios_need_the_same_tier() -> None:
    r = row("m", 2.0, xla=2e-3)
    assert r.vs_xla == pytest.approx(2.0)
    model_row = Row(kernel="m", path="m.py", correct=True, tier="model", best_s=1e-3, xla=Estimate("reference", 2e-3))
    assert model_row.vs_xla is None


def test_loop_trips_counts_nested_scans() -> None:
    import jax
    import jax.numpy as jnp

    def f(x):
        def outer(c, _):
            inner = jax.lax.scan(lambda c2, _: (c2 * 2, None), c, None, length=3)[0]
            return inner, None

        return jax.lax.scan(outer, x, None, length=4)[0] + jax.lax.map(jnp.sin, x).sum()

    assert loop_trips(jax.make_jaxpr(f)(jnp.ones((5,))).jaxpr) == (12, False)
    g = lambda x: jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1]), (0, x))[1]
    assert loop_trips(jax.make_jaxpr(g)(jnp.ones(2)).jaxpr) == (1, True)


def test_the_xla_reference_is_never_faster_than_its_flops_at_the_matmul_peak() -> None:
    """fused_21_causal_conv1d_silu (v5e): libtpu's profile of XLA's convolution gave 0.215 ms (its HBM floor) for
    137 GFLOP, which take >= 0.70 ms at v5e's 197 TFLOP/s; the kernel was reported at 0.27x of XLA."""
    import jax.numpy as jnp

    from pallasopt.bench.estimate import reference_floor

    flops, nbytes = 2 * 16 * 1024 * 1024 * 1024 * 4, 2 * (16 * 1027 * 1024 + 4 * 1024 * 1024 + 16 * 1024 * 1024)
    t, why = reference_floor(V5E, flops, nbytes, (jnp.bfloat16, jnp.bfloat16))
    assert t == pytest.approx(flops / V5E.device_peak_bf16_flops) and t > 6.9e-4 and why.startswith("MXU floor")
    t8, _ = reference_floor(V5E, flops, nbytes, (jnp.int8,))  # 8-bit inputs: the faster int8 rate bounds it
    assert t8 < t
    # f32 inputs: the default-precision rate our kernels' f32 dots are charged (a bf16 pass and the conversions), not
    # bf16's; with a bf16 input beside them, bf16's (fused_18's f32 convolution: 0.536 ms measured on a v5e)
    t32, _ = reference_floor(V5E, flops, nbytes, (jnp.float32, jnp.float32))
    assert t32 == pytest.approx(flops / V5E.device_peak_flops(jnp.float32)) and t32 == pytest.approx(1.2 * t)
    assert reference_floor(V5E, flops, nbytes, (jnp.float32, jnp.bfloat16))[0] == pytest.approx(t)
    # the static schedule is joined (the p-norm fitted on our kernels) with the larger of the HBM floor and the FLOPs
    # at bf16's rate, as before estimate version 7 (which joined the HBM floor alone: further from the chip), and the
    # result is never under the FLOPs at the inputs' own rate (fused_18's f32 convolution: 0 cycles in the profile)
    from pallasopt.bench.estimate import reference_bounds, reference_time

    hbm, fast, own = reference_bounds(V5E, flops, nbytes, (jnp.float32, jnp.float32))
    assert own == pytest.approx(1.2 * fast) and hbm < fast
    assert reference_time(V5E, 1e-3, (hbm, fast, own)) == pytest.approx(V5E.compiler_time(1e-3, fast))
    assert reference_time(V5E, 0.0, (hbm, fast, own)) == pytest.approx(own)  # a 0-cycle convolution: its FLOPs
    t, why = reference_floor(V5E, 1e6, 1e9)  # a copy: its bytes bound it
    assert t == pytest.approx(1e9 / V5E.floor_chip.delivered_hbm_bw_bytes_s) and why.startswith("HBM floor")
    # At the bandwidth the chip delivers by the compiler tier's fit (hardware.py: v5e 0.79 of the datasheet's with
    # its p-norm, measured), as for our kernels' floor; not the datasheet's.
    assert t == pytest.approx(1e9 / (0.79 * 819e9))


def test_io_bytes_counts_each_input_and_output_once() -> None:
    import jax
    import jax.numpy as jnp

    from pallasopt.bench.estimate import io_bytes

    structs = (jax.ShapeDtypeStruct((64, 128), jnp.float32), jax.ShapeDtypeStruct((128,), jnp.bfloat16))
    f = lambda x, b: (x / jnp.linalg.norm(x, axis=-1, keepdims=True) + b, x.sum())
    assert io_bytes(jax.make_jaxpr(f)(*structs)) == 64 * 128 * 4 + 128 * 2 + 64 * 128 * 4 + 4


L2_MODULE = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl


def _kernel(x_ref, o_ref):
    x = x_ref[...]
    o_ref[...] = x / jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))


def l2(x):
    return pl.pallas_call(
        _kernel,
        grid=(x.shape[0] // 256,),
        in_specs=[pl.BlockSpec((256, x.shape[1]), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((256, x.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def reference(x):
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def make_inputs(key, M: int = 8192, D: int = 4096):
    return (jax.random.normal(key, (M, D), jnp.float32),)
"""


def test_the_xla_reference_floor_is_its_inputs_and_outputs_not_xlas_bytes_accessed(tmp_path) -> None:
    """On a v5e XLA's l2 normalization ran in 0.167 ms where its "bytes accessed" floor said 0.287 ms
    (bench/results/hw-v5e-2026-12-05): that figure counts x once per fusion that reads it."""
    pytest.importorskip("libtpu")
    from pallasopt.bench.estimate import CompilerEstimator, xla_work
    from pallasopt.cost_model.compiler import compile_module

    path = tmp_path / "l2.py"
    path.write_text(L2_MODULE)
    ir = KernelIR.from_file(path)
    io = 2 * 8192 * 4096 * 4
    _, accessed = xla_work(compile_module(ir.source, ir.path, "reference", dict(ir.dims), "v5e", timeout_s=240))
    assert accessed > 1.2 * io  # XLA's own figure counts more than one read of x and one write
    est = CompilerEstimator(V5E, None)(ir, "reference")
    assert est.error is None and est.time_s is not None
    assert est.time_s >= io / V5E.delivered_hbm_bw_bytes_s * (1 - 1e-9)
    assert est.time_s < accessed / V5E.delivered_hbm_bw_bytes_s
    assert "bytes accessed" not in est.method


class FakeTiers:
    """Compiler time = model time x 1.25; every check passes; no accelerator."""

    def model(self, ir: KernelIR) -> TierResult:
        return model_tier(ir, V5E)

    def compiler(self, ir: KernelIR) -> TierResult | None:
        t = model_tier(ir, V5E).time_s
        assert t is not None
        return TierResult("compiler", True, t * 1.25, "fake")

    def check(self, ir: KernelIR, seeds: tuple[int, ...]) -> TierResult:
        return TierResult("check", True, None, "fake check")

    def hardware(self, ir: KernelIR) -> TierResult | None:
        return None


def fake_estimator(ir: KernelIR, fn: str) -> Estimate:
    return Estimate(fn, 0.01, method="fake")


@pytest.fixture
def suite(tmp_path):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "matmul.py").write_text(MATMUL.read_text())
    (kernels / "broken.py").write_text("import jax\n\ndef make_inputs(key, M=8):\n    return ()\n")  # no entry
    return kernels


def test_bench_kernel_records_result_and_estimates(suite, tmp_path) -> None:
    r = bench_kernel(
        suite / "matmul.py",
        estimator=fake_estimator,
        evaluator=FakeTiers(),
        beam=2,
        depth=1,
        db_path=tmp_path / "b.db",
        jobs=1,
    )
    assert r.error is None and r.correct and r.tier == "compiler" and r.speedup > 1 and r.recipe
    assert r.xla is not None and r.xla.time_s == 0.01 and r.hand_tuned is None  # matmul.py has no hand_tuned
    assert r.vs_xla == pytest.approx(0.01 / r.best_s)
    again = bench_kernel(suite / "matmul.py", evaluator=FakeTiers(), beam=2, depth=1, db_path=tmp_path / "b.db")
    assert again.from_cache and again.recipe == r.recipe  # the suite DB makes a rerun resume


def test_run_suite_goes_on_after_a_crash_and_writes_results(suite, tmp_path) -> None:
    out = tmp_path / "results"
    meta = {
        "command": "pallasopt bench (test)",
        "target": "v5e",
        "date": "2000-01-01",
        "beam": 2,
        "depth": 1,
        "jobs": 1,
        "budget_seconds": None,
        "machine": "test",
        "versions": {},
        "wall_s": 0.0,
    }
    console = Console(file=open(tmp_path / "log.txt", "w"), width=200)  # noqa: SIM115
    kernels = find_kernels(suite)
    assert [k.stem for k in kernels] == ["broken", "matmul"]
    rows, paths = run_suite(
        kernels,
        out,
        "v5e-test",
        meta,
        console=console,
        estimator=fake_estimator,
        evaluator=FakeTiers(),
        beam=2,
        depth=1,
        db_path=out / "bench.db",
        jobs=1,
    )
    console.file.close()
    assert rows[0].error and "broken.py" in rows[0].error and rows[1].correct
    doc = json.loads(paths["json"].read_text())
    assert doc["summary"]["correct"] == 1 and doc["summary"]["errors"] == 1 and len(doc["rows"]) == 2
    assert math.isclose(doc["rows"][1]["speedup"], rows[1].speedup)
    md = paths["md"].read_text()
    assert "| `broken` | ERROR |" in md and "[C]" in md and "fast_p" in md
    assert paths["png"].stat().st_size > 1000
    log = (tmp_path / "log.txt").read_text()
    assert "[1/2] broken" in log and "[2/2] matmul" in log


def test_markdown_labels_tiers() -> None:
    meta = {
        "command": "c",
        "target": "v5e",
        "date": "d",
        "beam": 1,
        "depth": 1,
        "jobs": 1,
        "budget_seconds": None,
        "machine": "m",
        "versions": {"jax": "0.10.2"},
        "wall_s": 1.0,
    }
    md = render_markdown(ROWS, summarize(ROWS), meta)
    assert "4.000 ms [C]" in md and "compiler estimate" in md and "| 3/5 |" in md


def test_cli_registration_and_quick_selection() -> None:
    parser = argparse.ArgumentParser()
    ADD_BENCH(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--quick", "--kernels", "llm_*", "--budget-seconds", "60"])
    assert args.quick and args.kernels == "llm_*" and args.budget_seconds == 60 and callable(args.handler)
    quick = find_kernels(ROOT / "bench" / "kernels", quick=True)
    assert sorted(k.stem for k in quick) == sorted(QUICK_KERNELS)
    assert all(k.name.startswith("llm_") for k in find_kernels(ROOT / "bench" / "kernels", ("llm_*",)))


def test_retier_times_an_old_recipe_at_the_new_hbm_floor(monkeypatch) -> None:
    """bench/retier.py: a floor-bound old time moves to the new floor; a static-bound one stays unless the new floor
    passes it; a time under its own recomputed old floor is refused (the runs differ by more than the floor). It
    handles a max-joined tier only: at the v5e's p-norm it refuses."""
    import math
    from dataclasses import replace

    import pallasopt.cost_model.hardware as hardware
    from pallasopt.search.tiers import compile_floor

    retier = bench_script("retier")
    ir = KernelIR.from_file(MATMUL)
    with pytest.raises(RuntimeError, match="handles max only"):
        retier.retime({"kernel": "m", "path": str(MATMUL), "recipe": [], "best_s": 1.0}, "v5e")
    v5e = replace(V5E, overlap_p=math.inf, compiler_hbm_efficiency=None)  # the tier of 2026-12-05: max at 0.70
    monkeypatch.setattr(hardware, "get_chip", lambda name: v5e)
    old_floor, new_floor = compile_floor(ir, replace(v5e, hbm_efficiency=1.0)), compile_floor(ir, v5e)
    assert new_floor > old_floor
    row = {"kernel": "m", "path": str(MATMUL), "recipe": [], "best_s": old_floor}
    r = retier.retime(row, "v5e")
    assert r["retier_s"] == pytest.approx(new_floor) and r["bound"] == "HBM floor"
    r = retier.retime({**row, "best_s": 10 * new_floor}, "v5e")
    assert r["retier_s"] == pytest.approx(10 * new_floor) and r["bound"] == "static schedule"
    with pytest.raises(RuntimeError, match="under its recomputed old floor"):
        retier.retime({**row, "best_s": 0.5 * old_floor}, "v5e")


def test_reestimate_replaces_only_the_xla_figures_and_recounts_against_them(monkeypatch, tmp_path) -> None:
    """bench/reestimate.py: each row's XLA figure comes from today's estimator; recipes, times and tiers stay, and
    the summary's count against XLA follows the new figures (the estimator is faked: no libtpu compile here)."""
    from pallasopt.bench import estimate
    from pallasopt.bench.rows import Estimate

    rows = [
        {"kernel": "a", "path": "examples/matmul.py", "correct": True, "tier": "compiler", "baseline_s": 2e-3,
         "best_s": 1e-3, "recipe": ["tile{call=0,bm=256}"], "xla": {"fn": "reference", "time_s": 0.9e-3}},
        {"kernel": "b", "path": "examples/matmul.py", "correct": True, "tier": "compiler", "baseline_s": 2e-3,
         "best_s": 1e-3, "recipe": [], "xla": None},
    ]  # fmt: skip
    src = tmp_path / "run.json"
    meta = {"target": "v5e", "command": "pallasopt bench", "date": "2026-12-08", "beam": 4, "depth": 2, "jobs": 2,
            "budget_seconds": 120, "machine": "test", "versions": {"jax": "0.10.2"}, "wall_s": 1.0}  # fmt: skip
    src.write_text(json.dumps({"meta": meta, "rows": rows}))

    def fake(self, ir, fn):
        assert fn == "reference" and ir.path.endswith("matmul.py")
        return Estimate(fn, 1.1e-3, method="faked")

    monkeypatch.setattr(estimate.CompilerEstimator, "__call__", fake)
    assert bench_script("reestimate").main([str(src), "--out", str(tmp_path / "out"), "--jobs", "1"]) == 0
    (out,) = (tmp_path / "out").glob("run-xla*.json")
    doc = json.loads(out.read_text())
    a, b = doc["rows"]
    assert a["xla"]["time_s"] == 1.1e-3 and a["recipe"] == ["tile{call=0,bm=256}"] and a["best_s"] == 1e-3
    assert b["xla"] is None  # no figure before: none made
    assert doc["summary"]["behind_xla"] == 0 and doc["summary"]["beats_xla"] == 1  # 0.9x before, 1.1x now
    assert "re-estimated" in doc["meta"]["command"] and doc["meta"]["reestimated_from"] == str(src)
