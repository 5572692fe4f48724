"""Porting bench: real Triton kernels (liger-kernel, the Triton tutorials) through `pallasopt port` and the oracle.

The external kernels are fetched at bench time and never committed:
  --liger DIR     liger_kernel/ops of an unpacked liger-kernel wheel; without it the bench runs
                  `pip download --no-deps liger-kernel -d /work/ext/liger` and unzips the wheel there
  --tutorials DIR a folder holding the Triton tutorials (python/tutorials of a triton-lang/triton checkout)
  --only A,B      run those cases; their rows replace the same cases' rows in an existing port.json
References are ours (bench/port/refs/). Per kernel it records: ported by rules / declined (with FILE:LINE: reason),
port time, the oracle's verdict (`pallasopt check`, interpret mode on the CPU). With --optimize it then runs
`pallasopt bench --suite WORK` on the ported modules (beam search, compiler-estimate tier on the target, the XLA
reference estimated by the same compiler), whose JSON/Markdown land in --out beside this bench's own files.

Full run (about an hour on a quiet 2-core machine):
  python bench/port_bench.py --optimize --beam 4 --depth 2 --budget-seconds 120
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFS = ROOT / "bench" / "port" / "refs"

# (case, source family, file relative to the family's folder, launcher)
CASES = (
    ("liger_geglu_forward", "liger", "geglu.py", "geglu_forward"),
    ("liger_geglu_backward", "liger", "geglu.py", "geglu_backward"),
    ("liger_swiglu_forward", "liger", "swiglu.py", "swiglu_forward"),
    ("liger_swiglu_backward", "liger", "swiglu.py", "swiglu_backward"),
    ("liger_relu_squared_forward", "liger", "relu_squared.py", "relu_squared_forward"),
    ("liger_relu_squared_backward", "liger", "relu_squared.py", "relu_squared_backward"),
    ("liger_softmax_forward", "liger", "softmax.py", "_softmax_forward"),
    ("liger_softmax_backward", "liger", "softmax.py", "_softmax_backward"),
    ("liger_rms_norm_forward", "liger", "rms_norm.py", "rms_norm_forward"),
    ("liger_layer_norm_forward", "liger", "layer_norm.py", "layer_norm_forward"),
    ("liger_fused_add_rms_norm_forward", "liger", "fused_add_rms_norm.py", "fused_add_rms_norm_forward"),
    ("tutorial_vector_add", "tutorials", "01-vector-add.py", "add"),
    ("tutorial_fused_softmax", "tutorials", "02-fused-softmax.py", "softmax"),
    ("tutorial_matmul", "tutorials", "03-matrix-multiplication.py", "matmul"),
)
# kernels expected outside the rule subset: ported only to record the decline line (no reference needed)
DECLINE_CASES = (
    ("liger_dyt_forward", "liger", "dyt.py", "liger_dyt_fwd"),
    ("liger_rms_norm_backward", "liger", "rms_norm.py", "rms_norm_backward"),
    ("liger_layer_norm_backward", "liger", "layer_norm.py", "layer_norm_backward"),
    ("liger_cross_entropy_forward", "liger", "cross_entropy.py", "cross_entropy_forward"),
    ("liger_kl_div_forward", "liger", "kl_div.py", "kldiv_forward_triton"),
    ("liger_rope_forward", "liger", "rope.py", "rope_forward"),
)


def fetch_liger(dest: Path) -> Path:
    ops = dest / "unz" / "liger_kernel" / "ops"
    if ops.is_dir():
        return ops
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "liger-kernel", "-d", str(dest)], check=True)
    wheel = sorted(dest.glob("liger_kernel-*.whl"))[-1]
    with zipfile.ZipFile(wheel) as z:
        z.extractall(dest / "unz")
    return ops


def port_one(src: Path, launcher: str | None, ref: Path | None, out: Path) -> dict:
    from pallasopt.errors import UserError
    from pallasopt.port import port_source

    ref_text = ref.read_text() if ref else "def reference(*a):\n    pass\n\n\ndef make_inputs(key):\n    pass\n"
    t0 = time.perf_counter()
    try:
        res = port_source(str(src), src.read_text(), str(ref or "none"), ref_text, launcher)
    except UserError as e:
        return {"status": "declined", "reason": str(e), "port_s": time.perf_counter() - t0}
    port_s = time.perf_counter() - t0
    out.write_text(res.source)
    return {
        "status": "rules",
        "port_s": port_s,
        "kernels": [k.line_text(src.name) for k in res.kernels],
        "notes": list(res.notes),
    }


def check(path: Path, timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "pallasopt.cli", "check", str(path)], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"verdict": "TIMEOUT", "check_s": timeout}
    text = (p.stdout + p.stderr).strip().splitlines()
    line = next((ln for ln in text if ln.startswith(("PASS", "FAIL"))), text[-1] if text else "")
    verdict = "PASS" if p.returncode == 0 else ("FAIL" if p.returncode == 1 else f"ERROR (exit {p.returncode})")
    return {"verdict": verdict, "check": line, "check_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--liger", type=Path, help="liger_kernel/ops folder (default: pip download into /work/ext/liger)")
    ap.add_argument("--tutorials", type=Path, default=Path("/work/ext/triton_tutorials"))
    ap.add_argument("--work", type=Path, default=Path("/work/ext/port_work"), help="where the ported modules go")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "port")
    ap.add_argument("--only", default="", help="comma-separated case names")
    ap.add_argument("--check-timeout", type=float, default=600)
    ap.add_argument("--optimize", action="store_true", help="then `pallasopt bench --suite WORK` on the ported ones")
    ap.add_argument("--target", default="v5e")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--budget-seconds", type=float, default=120)
    args = ap.parse_args(argv)
    folders = {"liger": args.liger or fetch_liger(Path("/work/ext/liger")), "tutorials": args.tutorials}
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    only = {s for s in args.only.split(",") if s}
    rows = []
    for case, family, rel, launcher in CASES + DECLINE_CASES:
        if only and case not in only:
            continue
        src = folders[family] / rel
        ref = REFS / f"{case}.py"
        out = args.work / f"{case}.py"
        row = {"case": case, "source": f"{family}/{rel}", "launcher": launcher}
        if not src.exists():
            row.update(status="missing", reason=f"{src} not found")
        else:
            row.update(port_one(src, launcher, ref if ref.exists() else None, out))
            if row["status"] == "rules" and ref.exists():
                row.update(check(out, args.check_timeout))
        rows.append(row)
        print(f"{case}: {row['status']} {row.get('verdict', '')} {row.get('reason', '')}", flush=True)
    if only and (args.out / "port.json").exists():  # a subset run updates its rows in the full table
        kept = {r["case"]: r for r in json.loads((args.out / "port.json").read_text())["rows"]}
        kept.update({r["case"]: r for r in rows})
        order = [c[0] for c in CASES + DECLINE_CASES]
        rows_all = sorted(kept.values(), key=lambda r: order.index(r["case"]) if r["case"] in order else len(order))
    else:
        rows_all = rows
    passed = [r for r in rows if r.get("verdict") == "PASS"]
    summary = {
        "cases": len(rows_all),
        "ported_by_rules": sum(r["status"] == "rules" for r in rows_all),
        "verified": sum(r.get("verdict") == "PASS" for r in rows_all),
        "declined": sum(r["status"] == "declined" for r in rows_all),
    }
    for r in rows:  # paths relative to the fetched folders, so the committed results name no local folder
        if "notes" in r:
            r["notes"] = [
                n.replace(str(folders["liger"]) + "/", "").replace(str(folders["tutorials"]) + "/", "")
                for n in r["notes"]
            ]
        for key in ("reason", "check"):
            if key in r:
                r[key] = r[key].replace(str(args.work) + "/", "").replace(str(folders["liger"]) + "/", "")
                r[key] = r[key].replace(str(folders["tutorials"]) + "/", "")
    (args.out / "port.json").write_text(json.dumps({"summary": summary, "rows": rows_all}, indent=1) + "\n")
    (args.out / "port.md").write_text(render(summary, rows_all))
    print(json.dumps(summary))
    if args.optimize and passed:
        suite = args.work / "verified"
        suite.mkdir(exist_ok=True)
        for old in suite.glob("*.py"):
            old.unlink()
        for r in passed:
            (suite / f"{r['case']}.py").write_text((args.work / f"{r['case']}.py").read_text())
        cmd = [
            sys.executable,
            "-m",
            "pallasopt.cli",
            "bench",
            "--suite",
            str(suite),
            "--out",
            str(args.out),
            "--target",
            args.target,
            "--beam",
            str(args.beam),
            "--depth",
            str(args.depth),
            "--budget-seconds",
            str(args.budget_seconds),
            "--jobs",
            "1",
        ]
        print(" ".join(cmd), flush=True)
        return subprocess.run(cmd).returncode
    return 0


def render(summary: dict, rows: list[dict]) -> str:
    lines = [
        "# Porting bench: Triton -> Pallas (`pallasopt port`)",
        "",
        f"{summary['verified']} of {summary['cases']} real Triton kernels ported by rules and verified by the oracle "
        f"(`pallasopt check`, interpret mode on the CPU: correctness only, no timing); {summary['declined']} declined.",
        "Command: `python bench/port_bench.py` (kernels fetched at bench time: liger-kernel wheel, Triton tutorials).",
        "",
        "| case | source | launcher | port | check | port time | why / note |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        why = r.get("reason") or "; ".join(r.get("kernels", []) + r.get("notes", []))
        check_s = r.get("check", "")
        lines.append(
            f"| {r['case']} | {r['source']} | {r['launcher']} | {r['status']} | {r.get('verdict', '-')} | "
            f"{r.get('port_s', 0) * 1e3:.0f} ms | {why.replace('|', '/')} {'' if not check_s else '(' + check_s.split(':', 1)[-1].strip()[:80] + ')'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
