"""Measure the bench's kernels on a real TPU: the naive kernel, pallasopt's best recipe and the XLA reference, plus
the tile configurations of the fidelity sweep, so the model and compiler tiers can be checked against the chip.

    # on the CPU machine: write every variant's source and a manifest (needs pallasopt and libcst)
    python bench/hw_measure.py prepare --bench bench/results/v5e-....json --fidelity bench/results/fidelity-v5e-....json \
        [--probe bench/results/hw-probe-....json] --out .hw/run
    # on the TPU machine: time them (needs only jax + numpy and pallasopt's src/ on PYTHONPATH)
    PYTHONPATH=$PYTHONPATH:src python bench/hw_measure.py time .hw/run --out $OUT/hw.jsonl [--group bench|fidelity] \
        [--only 'llm_*'] [--done .hw/earlier.jsonl]   # --done: skip what an earlier call timed (carry the file in)
    # back on the CPU machine: tables and rank correlations
    python bench/hw_measure.py report .hw/run hw.jsonl [...] --md bench/results/hw-....md --json bench/results/hw-....json
    # any time, no chip: a bench run's recipes on the chip, from every earlier chip run that timed the same source
    python bench/hw_measure.py current bench/results/v5e-....json --runs bench/results/hw-chip-runs.json [--md ...]
    # any time, no chip: per kernel the fastest recipe any chip run timed (that still replays), and hand variants
    python bench/hw_measure.py best bench/results/v5e-....json --runs bench/results/hw-chip-runs.json [--md ...]

Timing (tier [H]): each function is jitted, compiled and run once, then timed by the hardware tier's own
`pallasopt.harness.timing.time_batched`: batches of back-to-back calls with one `block_until_ready` per batch (so
Python dispatch overlaps the device's work), a batch >= 20 ms (at most 200 calls); the figure is the median over 7
batches of the batch time / calls, the inputs rotating over two seeds call by call (before 2026-12-08 each batch
ran on one seed's inputs, and XLA's figures were too fast: `rotating`; `current` and `best` use the rotating records
of a kernel where it has any). Correctness on the chip: each variant's outputs for two seeds are compared (the
oracle's `compare`, the module's tolerance) with the reference run by XLA at `highest` matmul precision; the XLA
reference at its default precision is compared the same way, so a kernel is never held to a stricter bar than XLA's
own default-precision result. Where the reference cannot run at `highest` (jax.lax.ragged_dot lowers to a Mosaic kernel
on the TPU, which refuses an fp32 contract precision on bf16 operands: "Bad lhs type"), the variants are compared with
its default-precision outputs instead, and each record of that kernel says so (`reference`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from fidelity import spearman  # noqa: E402  (bench/fidelity.py: Spearman with average ranks for ties)

SEEDS = (11, 12)


# ---------------------------------------------------------------------------------------------------- prepare (CPU)


def _apply(source_path: Path, recipe: Sequence[str]) -> str:
    from pallasopt.ir.kernel_ir import KernelIR
    from pallasopt.passes.registry import parse_pipeline

    if not any(recipe):  # the naive kernel (a probe's "" recipe): its file as it is
        return source_path.read_text()
    ir = KernelIR.from_file(source_path)
    for p in parse_pipeline(",".join(recipe)):
        ir = p.apply(ir)
    return ir.source


def prepare(bench: Path | None, fidelity: Path | None, out: Path, probe: Path | None = None) -> int:
    src_dir = out / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []

    def add(entry: dict[str, Any], source: str) -> None:
        f = src_dir / f"{entry['id']}.py"
        f.write_text(source)
        entries.append({**entry, "file": str(f.relative_to(out)), "sha1": source_sha1(source)})

    if bench is not None:
        data = json.loads(bench.read_text())
        for row in data["rows"]:
            path = ROOT / row["path"]
            base = path.read_text()
            k = row["kernel"]
            common = {"group": "bench", "kernel": k, "kernel_path": row["path"]}
            add({**common, "id": f"{k}__baseline", "variant": "baseline", "tiers": _tiers(row, "baseline")}, base)
            if row.get("recipe"):
                try:
                    best = _apply(path, row["recipe"])
                except Exception as e:
                    print(f"{k}: recipe did not replay: {type(e).__name__}: {e}", file=sys.stderr)
                    continue
                tiers = _tiers(row, "best")
                add({**common, "id": f"{k}__best", "variant": "best", "recipe": row["recipe"], "tiers": tiers}, best)
    if fidelity is not None:
        data = json.loads(fidelity.read_text())
        from pallasopt.ir.kernel_ir import KernelIR
        from pallasopt.passes.registry import parse_pipeline
        from pallasopt.passes.tile import knobs_of

        for i, row in enumerate(data["rows"]):
            if row.get("error") or not (row.get("compiler") or {}).get("time_s"):
                continue
            spec = "tile{call=0," + ",".join(f"{k}={v}" for k, v in row["sizes"].items()) + "}"
            try:
                ir = KernelIR.from_file(ROOT / row["kernel"])
                current = {k.name: k.value for k in knobs_of(ir) if k.call == 0}
                if any(current.get(k) != v for k, v in row["sizes"].items()):
                    ir = parse_pipeline(spec)[0].apply(ir)
            except Exception as e:
                print(f"{row['label']}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            tiers = {"compiler": row["compiler"]["time_s"], "model": row["model"]["time_s"]}
            entry = {"group": "fidelity", "kernel": row["kernel"], "kernel_path": row["kernel"], "variant": spec}
            add({**entry, "id": f"fid{i:03d}", "label": row["label"], "tiers": tiers}, ir.source)
    if probe is not None:  # {"kernel": [recipe, ...]}: variants to time beside each other (group "probe")
        data = json.loads(probe.read_text())
        for k, recipes in data.get("kernels", {}).items():
            path = ROOT / "bench" / "kernels" / f"{k}.py"
            for i, recipe in enumerate(recipes):
                try:
                    source = _apply(path, recipe.split("|"))
                except Exception as e:
                    print(f"{k} {recipe}: {type(e).__name__}: {e}", file=sys.stderr)
                    continue
                entry = {"group": "probe", "kernel": k, "kernel_path": str(path.relative_to(ROOT)), "variant": recipe}
                add({**entry, "id": f"{k}__p{i}", "recipe": recipe.split("|"), "tiers": {}}, source)
        # {"files": {kernel: [path, ...]}}: hand-written variants (a rewrite no pass makes yet), paths relative to the
        # probe file; each is timed against the kernel's reference like a recipe's source (no recipe: it replays
        # from the file only).
        for k, files in data.get("files", {}).items():
            path = ROOT / "bench" / "kernels" / f"{k}.py"
            for f in map(Path, files):
                source = (probe.parent / f).read_text()
                entry = {
                    "group": "probe",
                    "kernel": k,
                    "kernel_path": str(path.relative_to(ROOT)),
                    "variant": f"file {f}",
                }
                add({**entry, "id": f"{k}__{f.stem}", "recipe": [], "hand": str(f), "tiers": {}}, source)
    manifest = {"bench": str(bench) if bench else None, "fidelity": str(fidelity) if fidelity else None}
    (out / "manifest.json").write_text(json.dumps({**manifest, "entries": entries}, indent=1))
    print(f"{len(entries)} variants in {out}")
    return 0


def source_sha1(source: str) -> str:
    """What `current` joins chip records on: a variant's exact source, whatever run or recipe text produced it."""
    return hashlib.sha1(source.encode()).hexdigest()


def _tiers(row: dict[str, Any], which: str) -> dict[str, Any]:
    tier = row.get("tier")
    t = row.get(f"{which}_s")
    d: dict[str, Any] = {"model": row.get(f"model_{which}_s")}
    if tier and t is not None:
        d[tier] = t
    xla = row.get("xla") or {}
    if xla.get("time_s") is not None:
        d["xla_" + str(xla.get("tier"))] = xla["time_s"]
    return d


# ---------------------------------------------------------------------------------------------------- time (TPU)


def _check_all(outs: Sequence[Any], refs: Sequence[Any], tol: Any) -> tuple[bool, str, float]:
    """(all within tolerance, the first reason one is not, the largest relative error) over the seeds' outputs."""
    from pallasopt.harness.timing import compare_outputs

    results = [compare_outputs(o, r, tol) for o, r in zip(outs, refs, strict=True)]
    why = next((w for w, _ in results if w), "")
    return not why, why, max(err for _, err in results)


def time_one(entry: dict[str, Any], run_dir: Path, refs: dict[str, Any]) -> dict[str, Any]:
    import jax

    from pallasopt.harness.timing import time_batched as _batch_time
    from pallasopt.workload import load_source

    path = run_dir / entry["file"]
    w = load_source(path.read_text(), str(ROOT / entry["kernel_path"]))
    inputs = [tuple(w.make_inputs(jax.random.key(s))) for s in SEEDS]
    rec: dict[str, Any] = {"id": entry["id"], "device": jax.devices()[0].device_kind, "jax": jax.__version__}
    key = entry["kernel_path"]
    if key not in refs:  # the reference once per kernel: its exact outputs and its own time at default precision
        ref_fn = jax.jit(w.reference)
        exact_failed = ""
        try:
            with jax.default_matmul_precision("highest"):  # traced again under this precision: a separate compile
                exact = [jax.block_until_ready(ref_fn(*a)) for a in inputs]
        except Exception as ex:  # jax.lax.ragged_dot's TPU kernel: Mosaic "Bad lhs type" for fp32 contract on bf16
            exact_failed = f"{type(ex).__name__}: {' '.join(str(ex).split())[:200]}"
        t0 = time.perf_counter()
        default = [jax.block_until_ready(ref_fn(*a)) for a in inputs]
        compile_s = time.perf_counter() - t0
        if exact_failed:  # said in every record of the kernel: held to XLA's own default-precision outputs
            exact, ok, why, err = default, True, "", 0.0
        else:
            ok, why, err = _check_all(default, exact, w.tolerance)
        refs[key] = {
            "exact": exact,
            "exact_failed": exact_failed,
            "xla": {**_batch_time(ref_fn, inputs), "ok": ok, "why": why, "max_rel": err, "first_s": compile_s},
        }
    fn = jax.jit(w.entry)
    t0 = time.perf_counter()
    outs = [jax.block_until_ready(fn(*a)) for a in inputs]
    rec["first_s"] = time.perf_counter() - t0
    ok, why, err = _check_all(outs, refs[key]["exact"], w.tolerance)
    rec.update(ok=ok, why=why, max_rel=err, xla=refs[key]["xla"], **_batch_time(fn, inputs))
    if refs[key]["exact_failed"]:
        rec["reference"] = f"default precision (at highest it failed: {refs[key]['exact_failed']})"
    return rec


def time_all(run_dir: Path, out: Path, group: str | None, only: str | None, done_in: Sequence[Path] = ()) -> int:
    import fnmatch

    manifest = json.loads((run_dir / "manifest.json").read_text())
    done = set()
    for f in (out, *done_in):  # variants an earlier run timed (a chip's $OUT starts empty: carry its files in)
        if f.exists():
            done |= {json.loads(line)["id"] for line in f.read_text().splitlines() if line.strip()}
    refs: dict[str, Any] = {}
    todo = [
        e
        for e in manifest["entries"]
        if e["id"] not in done
        and (group is None or e["group"] == group)
        and (only is None or any(fnmatch.fnmatch(e["kernel"], g) for g in only.split(",")))
    ]
    print(f"{len(todo)} to time ({len(done)} done): {', '.join(sorted({e['kernel'] for e in todo}))}", flush=True)
    last_kernel = None
    for e in todo:
        if e["kernel_path"] != last_kernel:
            refs.clear()  # keep one kernel's reference outputs on the chip at a time
            last_kernel = e["kernel_path"]
        t0 = time.perf_counter()
        try:
            rec = time_one(e, run_dir, refs)
        except Exception as ex:
            rec = {"id": e["id"], "ok": False, "why": f"{type(ex).__name__}: {' '.join(str(ex).split())[:400]}"}
        rec["wall_s"] = time.perf_counter() - t0
        with out.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        t = rec.get("median_s")
        x = (rec.get("xla") or {}).get("median_s")
        print(
            f"{e['id']}: {'ok' if rec.get('ok') else 'FAIL ' + rec.get('why', '')} "
            f"{t * 1e3 if t else float('nan'):.3f} ms (xla {x * 1e3 if x else float('nan'):.3f}) "
            f"{rec['wall_s']:.1f} s",
            flush=True,
        )
    return 0


# ---------------------------------------------------------------------------------------------------- report (CPU)


def _load(run_dir: Path, results: Sequence[Path]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    entries = json.loads((run_dir / "manifest.json").read_text())["entries"]
    runs: dict[str, list[dict[str, Any]]] = {}
    for p in results:
        for line in p.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                runs.setdefault(r["id"], []).append(r)
    return entries, {k: _merge(v) for k, v in runs.items()}


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from a variant's runs (in several result files): the mean of their times, the spread kept."""
    ok = [r for r in runs if r.get("ok") and r.get("median_s")]
    if not ok:
        return runs[-1]
    t = [r["median_s"] for r in ok]
    x = [r["xla"]["median_s"] for r in ok if (r.get("xla") or {}).get("median_s")]
    rec = {**ok[-1], "median_s": statistics.fmean(t), "runs": len(ok), "spread": max(t) / min(t) - 1}
    if x:
        rec["xla"] = {**ok[-1]["xla"], "median_s": statistics.fmean(x), "spread": max(x) / min(x) - 1}
    return rec


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f}"


def report(run_dir: Path, results: Sequence[Path], md: Path | None, out_json: Path | None) -> int:
    entries, recs = _load(run_dir, results)
    by_kernel: dict[str, dict[str, Any]] = {}
    for e in entries:
        if e["group"] == "bench":
            by_kernel.setdefault(e["kernel"], {})[e["variant"]] = (e, recs.get(e["id"]))
    lines = [
        "| kernel | on chip | naive [H] | best [H] | speedup [H] | XLA [H] | vs XLA [H] | speedup [C]/[M] | vs XLA [C] "
        "| recipe |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows_out = []
    pairs_c: list[tuple[float, float]] = []  # (the bench tier's speedup, hardware speedup)
    pairs_x: list[tuple[float, float]] = []  # (vs XLA at the compiler tier, vs XLA on the chip)
    vs_h: list[float] = []
    for k in sorted(by_kernel):
        v = by_kernel[k]
        eb, rb = v.get("baseline", (None, None))
        ee, re_ = v.get("best", (None, None))
        if ee is None and not (eb or {}).get("recipe"):  # no recipe: the naive kernel is the best
            ee, re_ = eb, rb
        tb = rb.get("median_s") if rb and _usable(rb) else None
        te = re_.get("median_s") if re_ and _usable(re_) else None
        x = ((re_ or rb or {}).get("xla") or {}).get("median_s")
        sp = tb / te if tb and te else None
        vsx = x / te if x and te else None
        tiers = (ee or eb or {}).get("tiers", {})
        tb_tiers = (eb or {}).get("tiers", {})
        tier = "compiler" if "compiler" in tiers else "model"
        sp_c = tb_tiers.get(tier) / tiers.get(tier) if tb_tiers.get(tier) and tiers.get(tier) else None
        xla_c = tiers.get("xla_compiler")
        vsx_c = xla_c / tiers["compiler"] if xla_c and tiers.get("compiler") else None
        if sp and sp_c:
            pairs_c.append((sp_c, sp))
        if vsx and vsx_c:
            pairs_x.append((vsx_c, vsx))
        if vsx:
            vs_h.append(vsx)
        status = _status(re_)
        if re_ is not rb and rb and not rb.get("ok") and not _as_xla(rb) and status.startswith("FAIL"):
            status += "; the naive kernel fails too: " + str(rb.get("why", ""))[:80]
        recipe = ",".join((ee or {}).get("recipe", [])) or "(none)"
        lines.append(
            f"| `{k}` | {status} | {_ms(tb)} | {_ms(te)} | {_x(sp)} | {_ms(x)} | {_x(vsx)} | "
            f"{_x(sp_c)} {'[C]' if tier == 'compiler' else '[M]'} | {_x(vsx_c)} | `{recipe}` |"
        )
        rows_out.append(
            {
                "kernel": k,
                "baseline": rb,
                "best": re_,
                "speedup_h": sp,
                "vs_xla_h": vsx,
                "speedup_tier": sp_c,
                "tier": tier,
                "vs_xla_c": vsx_c,
                "recipe": (ee or {}).get("recipe"),
            }
        )
    summary = _bench_summary(rows_out, pairs_c, vs_h)
    summary["spearman_vs_xla_c_vs_h"] = spearman([a for a, _ in pairs_x], [b for _, b in pairs_x])
    summary["median_ratio_vs_xla_c_over_h"] = statistics.median(a / b for a, b in pairs_x) if pairs_x else None
    summary["vs_xla_pairs"] = len(pairs_x)
    spreads = [r.get("spread", 0.0) for r in recs.values() if r.get("runs", 1) > 1]
    summary["repeated_variants"] = len(spreads)
    summary["max_run_to_run_spread"] = max(spreads, default=None)
    summary["median_run_to_run_spread"] = statistics.median(spreads) if spreads else None
    fid = _fidelity(entries, recs)
    text = _markdown(lines, summary, fid, entries, recs)
    if md:
        md.write_text(text)
    if out_json:
        out_json.write_text(json.dumps({"summary": summary, "fidelity": fid, "rows": rows_out}, indent=1, default=str))
    print(text)
    return 0


# ------------------------------------------------------------------------------------------ current (CPU, no chip)


def chip_records(runs: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Every chip record of `runs` ({"manifest": path, "results": [paths]}, relative to the repository) by the sha1
    of the variant's source (manifests written before `prepare` recorded it have none and join nothing)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        manifest = ROOT / run["manifest"]
        sha = {e["id"]: e["sha1"] for e in json.loads(manifest.read_text())["entries"] if e.get("sha1")}
        for res in run["results"]:
            for line in (ROOT / res).read_text().splitlines():
                r = json.loads(line) if line.strip() else None
                if r and r["id"] in sha:
                    out.setdefault(sha[r["id"]], []).append({**r, "source": f"{res} {r['id']}"})
    return out


def rotating(r: dict[str, Any]) -> bool:
    """Whether a record was timed with the inputs rotating call by call (`time_batched` since 2026-12-08 says how many
    sets in `input_sets`). Earlier records ran each batch on one input set, where XLA keeps an input on the chip
    between runs (fused_10's reference on a v5e: 0.210 ms with the same inputs, 0.300 rotating; the Pallas pick 0.280
    both ways): their XLA figures are too fast."""
    return "input_sets" in r


def fair(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records timed with rotating inputs where there are any, else all of them (marked by `rotating`)."""
    rot = [r for r in records if rotating(r)]
    return rot or list(records)


def current_rows(bench: dict[str, Any], records: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each kernel of `bench` at its best recipe (the naive kernel where it has none) with the chip records of that
    exact source: the median of their times and of the XLA times beside them; records that fail on the chip count
    only when XLA's own default-precision result misses as far (`_usable`)."""
    rows = []
    for row in bench["rows"]:
        path = ROOT / row["path"]
        base = path.read_text()
        best_all = records.get(source_sha1(_apply(path, row["recipe"]) if row.get("recipe") else base), [])
        best = fair([r for r in best_all if _usable(r)])
        naive = fair([r for r in records.get(source_sha1(base), []) if _usable(r)])
        tb = statistics.median(r["median_s"] for r in best) if best else None
        tn = statistics.median(r["median_s"] for r in naive) if naive else None
        xla = [r["xla"]["median_s"] for r in best if (r.get("xla") or {}).get("median_s")]
        x = statistics.median(xla) if xla else None
        rows.append({
            "kernel": row["kernel"], "recipe": row.get("recipe") or [], "best_h": tb, "naive_h": tn, "xla_h": x,
            "vs_xla_h": x / tb if x and tb else None, "speedup_h": tn / tb if tn and tb else None,
            "vs_xla_tier": row.get("vs_xla"), "xla_tier": (row.get("xla") or {}).get("tier"), "tier": row.get("tier"),
            "records": [r["source"] for r in best], "failed_on_chip": len(best_all) - len(best),
            "inputs": "rotating" if best and all(map(rotating, best)) else "same",
        })  # fmt: skip
    return rows


def current(bench: Path, runs_file: Path, md: Path | None, out_json: Path | None) -> int:
    data = json.loads(bench.read_text())
    runs = json.loads(runs_file.read_text())["runs"]
    rows = current_rows(data, chip_records(runs))
    vs = [r["vs_xla_h"] for r in rows if r["vs_xla_h"]]
    summary = {
        "bench": str(bench), "runs": str(runs_file), "kernels": len(rows),
        "timed": sum(1 for r in rows if r["best_h"]), "vs_xla_timed": len(vs),
        "slower_than_xla_h": sum(1 for v in vs if v < 1), "slower_by_2pct_h": sum(1 for v in vs if v < 0.98),
        "geomean_vs_xla_h": _geomean(vs),
        "geomean_speedup_h": _geomean([r["speedup_h"] for r in rows if r["speedup_h"]]),
        "speedup_timed": sum(1 for r in rows if r["speedup_h"]),
    }  # fmt: skip
    lines = [
        f"# The recipes of `{bench.name}` on a TPU v5e [H]",
        "",
        f"Each kernel's best recipe (the naive kernel where none) joined by the sha1 of its source to the chip records "
        f"of the runs in `{runs_file.name}`: {summary['timed']}/{summary['kernels']} timed; against XLA timed beside "
        f"them, slower on **{summary['slower_than_xla_h']}/{summary['vs_xla_timed']}** "
        f"({summary['slower_by_2pct_h']} by more than 2%), geomean {_x(summary['geomean_vs_xla_h'])}; "
        f"over the naive kernel {_x(summary['geomean_speedup_h'])} on the {summary['speedup_timed']} kernels whose "
        "naive kernel has a record with its source's sha1.",
        "",
        "| kernel | best [H] ms | XLA [H] ms | vs XLA [H] | vs XLA (bench tier) | naive [H] ms | records | inputs | recipe |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        tier = f"{_x(r['vs_xla_tier'])} [{'C' if r['xla_tier'] == 'compiler' else 'M'}]" if r["vs_xla_tier"] else "-"
        seen = len(r["records"]) if r["best_h"] else ("fails on the chip" if r["failed_on_chip"] else "not timed")
        lines.append(
            f"| `{r['kernel']}` | {_ms(r['best_h'])} | {_ms(r['xla_h'])} | {_x(r['vs_xla_h'])} | {tier} | "
            f"{_ms(r['naive_h'])} | {seen} | {r['inputs']} | `{','.join(r['recipe']) or '(none)'}` |"
        )
    return _emit(lines, summary, rows, md, out_json)


def chip_variants(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every chip-timed source of `runs` by its sha1: its kernel, how it was made (the recipe, or the hand-written
    file of a probe) and its records (as `chip_records`)."""
    records = chip_records(runs)
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        for e in json.loads((ROOT / run["manifest"]).read_text())["entries"]:
            if e.get("sha1") in records and e["sha1"] not in out:
                how = {"hand": e["hand"]} if e.get("hand") else {"recipe": list(e.get("recipe") or [])}
                out[e["sha1"]] = {"kernel": e["kernel"], **how, "records": records[e["sha1"]]}
    return out


def best_rows(bench: dict[str, Any], variants: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per kernel of `bench`, its fastest source on the chip among every recipe of pallasopt's passes timed there
    (median of its usable records, `_usable`) that still replays to that source from today's kernel file, and the
    fastest hand-written variant beside it, each with XLA's median time from the same records."""
    rows = []
    for row in bench["rows"]:
        k, path = row["kernel"], ROOT / row["path"]
        best: dict[str, Any] = {}
        mine = {sha: v for sha, v in variants.items() if v["kernel"] == k}
        # Rotating-input records only, where the kernel has any (`rotating`): XLA's same-input figures are too fast.
        fair_only = any(rotating(r) for v in mine.values() for r in v["records"])
        for sha, v in mine.items():
            usable = [
                r
                for r in v["records"]
                if _usable(r) and (r.get("xla") or {}).get("median_s") and (rotating(r) or not fair_only)
            ]
            if not usable:
                continue
            kind = "hand" if "hand" in v else "recipe"
            if kind == "recipe":
                try:
                    if source_sha1(_apply(path, v["recipe"])) != sha:
                        continue  # the kernel file or a pass changed since: not today's recipe
                except Exception:
                    continue
            t = statistics.median(r["median_s"] for r in usable)
            x = statistics.median(r["xla"]["median_s"] for r in usable)
            if kind not in best or t < best[kind]["best_h"]:
                best[kind] = {
                    "best_h": t,
                    "xla_h": x,
                    "vs_xla_h": x / t,
                    "how": v.get("hand") or v["recipe"],
                    "inputs": "rotating" if fair_only else "same",
                }
        if best:
            rows.append({"kernel": k, **{kind: best.get(kind) for kind in ("recipe", "hand")}})
    return rows


def best(bench: Path, runs_file: Path, md: Path | None, out_json: Path | None) -> int:
    data = json.loads(bench.read_text())
    runs = json.loads(runs_file.read_text())["runs"]
    rows = best_rows(data, chip_variants(runs))
    vs = [r["recipe"]["vs_xla_h"] for r in rows if r["recipe"]]
    summary = {
        "bench": str(bench), "runs": str(runs_file), "kernels": len(data["rows"]), "timed": len(vs),
        "slower_than_xla_h": sum(1 for v in vs if v < 1), "slower_by_2pct_h": sum(1 for v in vs if v < 0.98),
        "geomean_vs_xla_h": _geomean(vs),
    }  # fmt: skip
    lines = [
        f"# The fastest recipe of each kernel of `{bench.name}` timed on a TPU v5e [H]",
        "",
        f"Of every source the runs in `{runs_file.name}` timed on the chip, per kernel the fastest that a recipe of "
        "pallasopt's passes still replays to from today's kernel file (not the bench's pick: the chip chose among "
        f"what it timed): {summary['timed']}/{summary['kernels']} kernels; against XLA timed beside them, slower on "
        f"**{summary['slower_than_xla_h']}/{summary['timed']}** ({summary['slower_by_2pct_h']} by more than 2%), "
        f"geomean {_x(summary['geomean_vs_xla_h'])}. Hand-written variants (probes for passes not yet written) are "
        "listed beside them and not counted. Inputs: `rotating` (a fresh input set every call) where the kernel has "
        "such records, else `same` (each batch on one set: XLA's figure too fast, see `rotating`).",
        "",
        "| kernel | fastest recipe [H] ms | XLA [H] ms | vs XLA [H] | inputs | recipe | fastest hand variant [H] ms | vs XLA |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        a, h = r["recipe"] or {}, r["hand"] or {}
        how = ",".join(a.get("how") or []) or "(naive)"
        lines.append(
            f"| `{r['kernel']}` | {_ms(a.get('best_h'))} | {_ms(a.get('xla_h'))} | {_x(a.get('vs_xla_h'))} | "
            f"{a.get('inputs', '-')} | `{how if a else '-'}` | {_ms(h.get('best_h'))} {'`' + h['how'] + '`' if h else ''} | {_x(h.get('vs_xla_h'))} |"
        )
    return _emit(lines, summary, rows, md, out_json)


def _emit(
    lines: list[str], summary: dict[str, Any], rows: list[dict[str, Any]], md: Path | None, out_json: Path | None
) -> int:
    """Print a table's Markdown and write it (`md`) and its summary and rows (`out_json`) where asked."""
    text = "\n".join(lines) + "\n"
    if md:
        md.write_text(text)
    if out_json:
        out_json.write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print(text)
    return 0


def _as_xla(r: dict[str, Any]) -> bool:
    """The variant misses the module's tolerance against the exact reference, but XLA's own result at its default
    matmul precision misses it too, by as much or more (within 1.5x of its error): the chip's default-precision
    matmul, not the kernel."""
    x = r.get("xla") or {}
    return not r.get("ok") and not x.get("ok", True) and r.get("max_rel", math.inf) <= 1.5 * x.get("max_rel", 0.0)


def _usable(r: dict[str, Any]) -> bool:
    return bool(r.get("median_s")) and (bool(r.get("ok")) or _as_xla(r))


def _status(r: dict[str, Any] | None) -> str:
    if r is None:
        return "not timed"
    if r.get("ok"):
        return "yes"
    if _as_xla(r):
        return f"as XLA (max rel err {r['max_rel']:.1e}, XLA's {r['xla']['max_rel']:.1e})"
    if not r.get("median_s"):
        return "FAIL: " + str(r.get("why", ""))[:120].replace("|", "/")
    return "FAIL: " + str(r.get("why", ""))[:120].replace("|", "/") + " (timed anyway)"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _geomean(v: Sequence[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(x) for x in v)) if v else None


def _bench_summary(rows: list[dict[str, Any]], pairs: list[tuple[float, float]], vs_h: list[float]) -> dict[str, Any]:
    timed = [r for r in rows if r["speedup_h"]]
    return {
        "kernels": len(rows),
        "timed_both": len(timed),
        "geomean_speedup_h": _geomean([r["speedup_h"] for r in timed]),
        "geomean_vs_xla_h": _geomean(vs_h),
        "faster_than_xla_h": sum(1 for v in vs_h if v > 1.0),
        "slower_than_xla_h": sum(1 for v in vs_h if v < 1.0),
        "slower_by_2pct_h": sum(1 for v in vs_h if v < 0.98),
        "with_xla_h": len(vs_h),
        "spearman_speedup_tier_vs_h": spearman([a for a, _ in pairs], [b for _, b in pairs]),
        "median_ratio_speedup_tier_over_h": statistics.median(a / b for a, b in pairs) if pairs else None,
        "failed": [r["kernel"] for r in rows if r["best"] and r["best"].get("median_s") and not _usable(r["best"])],
        # no time for the naive kernel: it did not compile or run on the chip (the record says why), or no record
        "not_run": [r["kernel"] for r in rows if r["baseline"] and not r["baseline"].get("median_s")],
        "not_timed": [r["kernel"] for r in rows if not r["baseline"]],
    }


def _fidelity(entries: list[dict[str, Any]], recs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for e in entries:
        r = recs.get(e["id"])
        if e["group"] != "fidelity" or not r or not r.get("ok"):
            continue
        rows.append({"kernel": e["kernel"], "label": e["label"], "h": r["median_s"], **e["tiers"]})
    out: dict[str, Any] = {"configs": len(rows), "rows": rows}
    for tier in ("compiler", "model"):
        pts = [(r[tier], r["h"]) for r in rows if r.get(tier)]
        out[f"spearman_{tier}_pooled"] = spearman([a for a, _ in pts], [b for _, b in pts])
        per = {}
        top1 = 0
        regret = []
        kernels = sorted({r["kernel"] for r in rows})
        for k in kernels:
            kr = [r for r in rows if r["kernel"] == k and r.get(tier)]
            if len(kr) < 3:
                continue
            per[k] = spearman([r[tier] for r in kr], [r["h"] for r in kr])
            pick = min(kr, key=lambda r: r[tier])
            best = min(kr, key=lambda r: r["h"])
            top1 += pick is best
            regret.append(pick["h"] / best["h"])
        out[f"spearman_{tier}_within"] = per
        out[f"top1_{tier}"] = f"{top1}/{len(regret)}"
        out[f"regret_{tier}"] = regret
        out[f"median_ratio_{tier}_over_h"] = statistics.median(a / b for a, b in pts) if pts else None
    return out


def _markdown(
    lines: list[str], s: dict[str, Any], fid: dict[str, Any], entries: list[Any], recs: dict[str, Any]
) -> str:
    dev = next((r.get("device") for r in recs.values() if r.get("device")), "?")
    head = [
        f"# pallasopt bench measured on a chip ({dev})",
        "",
        "Tier [H]: median over 7 batches of back-to-back calls (each batch >= 20 ms or 200 calls) of jit-compiled "
        "functions at the modules' default dims, inputs from two seeds; correctness: every output vs the reference "
        "run by XLA at `highest` matmul precision, the module's tolerance. [C]/[M] columns are the bench run's own "
        "figures (libtpu static estimate / roofline model), for comparison.",
        "",
        f"- kernels timed (naive and best): {s['timed_both']}/{s['kernels']}; wrong on the chip: "
        f"{', '.join(s['failed']) or 'none'}; did not run on the chip: {', '.join(s['not_run']) or 'none'}; not "
        f"timed (no record: the chip time ran out): {len(s['not_timed'])}",
        f"- geomean speedup over the naive kernel [H]: {_x(s['geomean_speedup_h'])}",
        f"- vs the XLA reference [H] ({s['with_xla_h']} kernels): geomean {_x(s['geomean_vs_xla_h'])}; faster on "
        f"{s['faster_than_xla_h']}, slower on {s['slower_than_xla_h']} ({s['slower_by_2pct_h']} by more than 2%)",
        f"- the bench tier's speedup over the naive kernel vs the measured one: Spearman "
        f"{s['spearman_speedup_tier_vs_h']:.2f}, median ratio tier / chip {s['median_ratio_speedup_tier_over_h'] or math.nan:.2f}",
        f"- vs XLA at the compiler tier [C] vs on the chip [H] ({s['vs_xla_pairs']} kernels with both): Spearman "
        f"{s['spearman_vs_xla_c_vs_h']:.2f}, median ratio [C] / [H] {s['median_ratio_vs_xla_c_over_h'] or math.nan:.2f}",
        f"- run-to-run: {s['repeated_variants']} variants timed in two runs; spread (slower / faster - 1) median "
        f"{(s['median_run_to_run_spread'] or 0) * 100:.1f}%, largest {(s['max_run_to_run_spread'] or 0) * 100:.1f}%",
        "",
    ]
    fl = []
    if fid["configs"]:
        fl = [
            "## Tile sweep: model [M] and compiler [C] vs the chip [H]",
            "",
            f"{fid['configs']} configurations timed. Spearman pooled: compiler {fid['spearman_compiler_pooled']:.2f}, "
            f"model {fid['spearman_model_pooled']:.2f}. Picked the chip's fastest configuration of a kernel: compiler "
            f"{fid['top1_compiler']}, model {fid['top1_model']}; regret (chip time of the pick / chip's best) "
            f"compiler {_fmt_list(fid['regret_compiler'])}, model {_fmt_list(fid['regret_model'])}. Median tier / chip "
            f"time: compiler {fid['median_ratio_compiler_over_h'] or math.nan:.2f}, "
            f"model {fid['median_ratio_model_over_h'] or math.nan:.2f}.",
            "",
            "| kernel | Spearman [C] vs [H] | Spearman [M] vs [H] |",
            "| --- | --- | --- |",
        ]
        for k in sorted(fid["spearman_compiler_within"]):
            fl.append(
                f"| `{k}` | {fid['spearman_compiler_within'][k]:.2f} | "
                f"{fid['spearman_model_within'].get(k, math.nan):.2f} |"
            )
        fl += ["", "| configuration | [H] ms | [C] ms | [M] ms |", "| --- | --- | --- | --- |"]
        for r in fid["rows"]:
            fl.append(f"| `{r['label']}` | {_ms(r['h'])} | {_ms(r.get('compiler'))} | {_ms(r.get('model'))} |")
    return "\n".join([*head, "## Bench kernels", "", *lines, "", *fl]) + "\n"


def _fmt_list(v: Sequence[float]) -> str:
    return ", ".join(f"{x:.2f}" for x in v) or "-"


def compare(old: tuple[Path, Sequence[Path]], new: tuple[Path, Sequence[Path]], md: Path | None) -> int:
    """Two chip runs of the bench (each a folder with its `manifest.json` and result files): per kernel, the best
    recipe of each and their times on the chip, so a tier change is judged by what the chip says of the recipes it
    made the search pick. Recipes the same in both give the run-to-run spread between the sessions."""
    (old_entries, old_recs), (new_entries, new_recs) = _load(*old), _load(*new)

    def bests(entries: list[dict[str, Any]], recs: dict[str, dict[str, Any]]) -> dict[str, tuple[str, float]]:
        out = {}
        for e in entries:
            r = recs.get(e["id"])
            if e["group"] == "bench" and e["variant"] == "best" and r and _usable(r):
                out[e["kernel"]] = (",".join(e.get("recipe") or ()), float(r["median_s"]))
        return out

    a, b = bests(old_entries, old_recs), bests(new_entries, new_recs)
    lines = [
        "| kernel | old recipe | old [H] ms | new recipe | new [H] ms | new / old |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    changed: list[float] = []
    same: list[float] = []
    for k in sorted(set(a) & set(b)):
        (ra, ta), (rb, tb) = a[k], b[k]
        (same if ra == rb else changed).append(tb / ta)
        shown = "(same)" if ra == rb else f"`{rb}`"
        lines.append(f"| `{k}` | `{ra}` | {ta * 1e3:.3f} | {shown} | {tb * 1e3:.3f} | {tb / ta:.3f} |")
    head = [
        f"- kernels with a usable best on the chip in both runs: {len(changed) + len(same)}",
        f"- recipe changed on {len(changed)}: faster by more than 2% on {sum(r < 0.98 for r in changed)}, slower by more "
        f"than 2% on {sum(r > 1.02 for r in changed)}; geomean new / old {_geomean(changed) or float('nan'):.3f}",
        f"- same recipe on {len(same)} (the sessions' run-to-run spread): new / old "
        f"{min(same, default=float('nan')):.3f} - {max(same, default=float('nan')):.3f}",
        "",
    ]
    text = "\n".join(head + lines) + "\n"
    if md:
        md.write_text(text)
    print(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--bench", type=Path)
    p.add_argument("--fidelity", type=Path)
    p.add_argument(
        "--probe",
        type=Path,
        help='{"kernels": {kernel: [recipe, ...]}, "files": {kernel: [variant.py, ...]}}: recipes (passes split by "|"), '
        "hand-written variants (paths relative to the probe file)",
    )
    p.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("time")
    t.add_argument("run_dir", type=Path)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--group", choices=("bench", "fidelity", "probe"))
    t.add_argument("--only", help="comma-separated globs on kernel names")
    t.add_argument(
        "--done", type=Path, nargs="*", default=[], help="result files of earlier runs: skip what they timed"
    )
    r = sub.add_parser("report")
    r.add_argument("run_dir", type=Path)
    r.add_argument("results", type=Path, nargs="+")
    r.add_argument("--md", type=Path)
    r.add_argument("--json", type=Path)
    c = sub.add_parser("compare", help="the best recipes of two chip runs (e.g. before and after a tier change)")
    c.add_argument("old_dir", type=Path, help="a folder with the old run's manifest.json")
    c.add_argument("new_dir", type=Path)
    c.add_argument("--old-results", type=Path, nargs="+", required=True)
    c.add_argument("--new-results", type=Path, nargs="+", required=True)
    c.add_argument("--md", type=Path)
    cur = sub.add_parser("current", help="a bench run's recipes on the chip, from earlier chip runs' records")
    cur.add_argument("bench", type=Path)
    cur.add_argument("--runs", type=Path, required=True, help='{"runs": [{"manifest": ..., "results": [...]}]}')
    cur.add_argument("--md", type=Path)
    cur.add_argument("--json", type=Path)
    bst = sub.add_parser("best", help="each kernel's fastest recipe the chip timed, against XLA (earlier records)")
    bst.add_argument("bench", type=Path)
    bst.add_argument("--runs", type=Path, required=True, help='{"runs": [{"manifest": ..., "results": [...]}]}')
    bst.add_argument("--md", type=Path)
    bst.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "current":
        return current(a.bench, a.runs, a.md, a.json)
    if a.cmd == "best":
        return best(a.bench, a.runs, a.md, a.json)
    if a.cmd == "compare":
        return compare((a.old_dir, a.old_results), (a.new_dir, a.new_results), a.md)
    if a.cmd == "prepare":
        return prepare(a.bench, a.fidelity, a.out, a.probe)
    if a.cmd == "time":
        return time_all(a.run_dir, a.out, a.group, a.only, a.done)
    return report(a.run_dir, a.results, a.md, a.json)


if __name__ == "__main__":
    sys.exit(main())
