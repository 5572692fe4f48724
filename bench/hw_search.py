"""Run pallasopt's own search on a lent TPU, ranked by its hardware tier, from the fastest recipes the chip has timed.

Where `hw_measure.py` times variants made here, this runs `python -m pallasopt run --target v5e` on the chip host,
so the search's candidates are checked in interpret mode and timed on the chip (the hardware tier ranks them), each
kernel starting from its fastest chip-timed recipe (`hw_measure.py best`) and the bench's pick.

    # here: what to search, and the packages the chip host lacks (rich, libcst>=1.4, PyYAML), into .hw/
    python bench/hw_search.py plan bench/results/hw-v5e-2026-12-07c/best-known-merged-eaa8649.json \\
        --bench bench/results/v5e-2026-12-07-merged-eaa8649.json --out .hw/search
    python bench/hw_search.py setup .hw/pylib
    # on the chip host (device tool, carry [".hw"]): kernels one after another, none started past --limit-s
    export PYTHONPATH=$PWD/.hw/pylib:$PWD/src:$PYTHONPATH
    python bench/hw_search.py run .hw/search --out /tmp/s --limit-s 540 --budget-seconds 100 [--done DIR]
    tar czf $OUT/s.tgz -C /tmp s  # the device tool brings back 8 files a call: one archive, not 3 files a kernel
    # here: the table
    python bench/hw_search.py table DIR... --best <best-known json> [--md FILE]

Each kernel's result is `<kernel>.json` (the run's `--json` object), its database `<kernel>.db` and its optimized
module `<kernel>.opt.py` under `--out`. All times in them are [H] where the run says `ranked by: measured`.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# What the lent v5e host lacked in session 33 (it has jax, jaxlib, libtpu, numpy, networkx, an old libcst).
HOST_PACKAGES = ("rich==15.0.0", "markdown-it-py==4.3.0", "mdurl==0.1.2", "pygments==2.21.0", "libcst==1.9.0")
HOST_PACKAGES_YAML = ("pyyaml==6.0.4",)
SLACK_S = 90.0  # past the search budget: the baseline's timing, one batch in flight, the final re-check, the write


def plan(best: Path, bench: Path | None, kernels: str | None, all_kernels: bool, out: Path) -> int:
    """Per kernel: its start recipes (the fastest chip-timed one, then the bench's pick), cheapest on the chip first;
    by default only the kernels the chip times slower than XLA."""
    rows = json.loads(best.read_text())["rows"]
    picks: dict[str, str] = {}
    if bench is not None:
        picks = {r["kernel"]: _spec(r.get("recipe")) for r in json.loads(bench.read_text())["rows"]}
    todo: list[dict[str, Any]] = []
    for r in rows:
        k, rec = r["kernel"], r.get("recipe") or {}
        if kernels and not any(fnmatch.fnmatch(k, g) for g in kernels.split(",")):
            continue
        if not all_kernels and not (rec.get("vs_xla_h") is not None and rec["vs_xla_h"] < 1.0):
            continue
        starts = [_spec(rec["how"])] if rec.get("how") else []
        if picks.get(k) and picks[k] not in starts:
            starts.append(picks[k])
        todo.append({"kernel": k, "start_from": starts, "best_h": rec.get("best_h"), "xla_h": rec.get("xla_h")})
    todo.sort(key=lambda e: e["best_h"] if e["best_h"] is not None else float("inf"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps({"best": str(best), "kernels": todo}, indent=1))
    print(f"{len(todo)} kernels in {out / 'plan.json'}: {', '.join(e['kernel'] for e in todo)}")
    return 0


def _spec(recipe: str | list[str] | None) -> str:
    """A recipe as `--start-from` takes it (the bench JSON holds a list of pass specs, or a string)."""
    return ",".join(recipe) if isinstance(recipe, list) else (recipe or "")


def setup(target: Path) -> int:
    """The chip host's missing packages, as wheels unpacked into `target` (put it first on PYTHONPATH there)."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
    return subprocess.call([*cmd, *HOST_PACKAGES, *HOST_PACKAGES_YAML])


def run(folder: Path, out: Path, limit_s: float, budget_s: float, jobs: int, done: list[Path]) -> int:
    """Search each planned kernel on this host's chip until starting the next could pass `limit_s`."""
    t0 = time.monotonic()
    entries = json.loads((folder / "plan.json").read_text())["kernels"]
    finished = {p.stem for d in (out, *done) for p in d.glob("*.json")}
    out.mkdir(parents=True, exist_ok=True)
    for e in entries:
        k = e["kernel"]
        if k in finished:
            continue
        left = limit_s - (time.monotonic() - t0)
        if left < budget_s + SLACK_S:
            print(f"stop: {left:.0f} s left, a search takes up to {budget_s + SLACK_S:.0f}", flush=True)
            break
        argv = [sys.executable, "-m", "pallasopt", "run", str(ROOT / "bench" / "kernels" / f"{k}.py")]
        argv += ["--target", "v5e", "--beam", "4", "--depth", "2", "--budget-seconds", str(budget_s)]
        argv += ["--jobs", str(jobs), "--db", str(out / f"{k}.db"), "-o", str(out / f"{k}.opt.py"), "--json"]
        for s in e["start_from"]:
            argv += ["--start-from", s]
        started = time.monotonic()
        p = subprocess.run(argv, capture_output=True, text=True, timeout=left, check=False)
        try:
            result = json.loads(p.stdout) if p.stdout.strip() else None
        except json.JSONDecodeError:
            result = None
        record = {"kernel": k, "rc": p.returncode, "wall_s": time.monotonic() - started, "result": result}
        if result is None:
            record["stderr_tail"] = p.stderr[-2000:]
        (out / f"{k}.json").write_text(json.dumps(record, indent=1))
        best = (result or {}).get("best") or {}
        print(f"{k}: rc {p.returncode}, {record['wall_s']:.0f} s, best {_ms(best.get('time_s'))} [{best.get('tier')}]")
    return 0


def table(folders: list[Path], best: Path, md: Path | None) -> int:
    """Per kernel searched: the chip-ranked run's baseline and best [H], XLA [H] from `best`, and the recipe."""
    xla = {r["kernel"]: (r.get("recipe") or {}).get("xla_h") for r in json.loads(best.read_text())["rows"]}
    lines = [
        "| kernel | ranked by | baseline | best | XLA [H] ms (`hw_measure`) | vs XLA | recipe |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for f in sorted(p for d in folders for p in d.glob("*.json") if p.name != "plan.json"):
        rec = json.loads(f.read_text())
        r = rec.get("result") or {}
        b, s = r.get("baseline") or {}, r.get("best") or {}
        x = xla.get(rec["kernel"])
        t = s.get("time_s")
        tier = s.get("tier") or f"failed: rc {rec.get('rc')}"
        ratio = f"{x / t:.2f}x" if x and t and tier == "hardware" else "-"  # [H] against [H] only
        recipe = ",".join(r.get("recipe") or []) or "-"
        lines.append(
            f"| `{rec['kernel']}` | {tier} | {_ms(b.get('time_s'))} | {_ms(t)} | {_ms(x)} | {ratio} | `{recipe}` |"
        )
    text = "\n".join(lines) + "\n"
    if md:
        md.write_text(text)
    print(text)
    return 0


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f} ms"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("best", type=Path)
    p.add_argument("--bench", type=Path)
    p.add_argument("--kernels")
    p.add_argument("--all", action="store_true", help="every kernel, not only those slower than XLA on the chip")
    p.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("setup")
    s.add_argument("target", type=Path)
    r = sub.add_parser("run")
    r.add_argument("folder", type=Path)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--limit-s", type=float, default=540.0)
    r.add_argument("--budget-seconds", type=float, default=200.0)
    r.add_argument("--jobs", type=int, default=8)
    r.add_argument("--done", type=Path, action="append", default=[])
    t = sub.add_parser("table")
    t.add_argument("folders", type=Path, nargs="+")
    t.add_argument("--best", type=Path, required=True)
    t.add_argument("--md", type=Path)
    a = ap.parse_args()
    if a.cmd == "plan":
        return plan(a.best, a.bench, a.kernels, a.all, a.out)
    if a.cmd == "setup":
        return setup(a.target)
    if a.cmd == "run":
        return run(a.folder, a.out, a.limit_s, a.budget_seconds, a.jobs, a.done)
    return table(a.folders, a.best, a.md)


if __name__ == "__main__":
    sys.exit(main())
