"""Survey: where does the `epilogue` pass apply on JAXBench's LLM-written kernels, and why not elsewhere.

    python bench/epilogue_survey.py --jaxbench /work/ext/aryatschand+JAXBench [--models gemini3,gpt53]
        [--modules /tmp/epi_survey] [--check] [--label before] [--out-dir bench/results/jaxbench]

Each kernel in `pallas_eval/generated/<model>/...` (every task, not only those the suite marks correct; model `suite`:
the suite's own benchmark/*/optimized.py and priority_kernels) is imported
through `pallasopt import` (`--fix-api`; modules cached under `--modules`), traced, and for every pallas_call the
pass is applied (`EpiloguePass(call=i).apply`: planned, rewritten, re-traced): the row says `applies` or the decline
reason. With `--check` every application is checked by the interpret-mode oracle (fresh inputs, seeds 0 and 1 at
the module's CHECK_DIMS). Writes `epilogue-survey-<label>.json` and `.md` (per-call table and counts by reason).
No timing is measured here: the figures are counts.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pallasopt.bench.suites import import_tasks, jaxbench_tasks
from pallasopt.errors import PallasoptError, PassNotApplicable, short
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.epilogue import EpiloguePass

BUCKETS = [  # (label, pattern on the decline reason): how the table groups reasons
    ("returned as it is by a method (KernelBench's Model.forward: no epilogue outside the kernel)", r"^the method"),
    ("the helper's caller: no epilogue to take (reason per row)", r"^the caller of"),
    ("returned as it is (by the entry or a helper)", r"returns it as it is|returns the call's value as it is"),
    ("helper with several returns", r"several returns"),
    ("reshape after the call", r"reshape"),
    ("control flow (if/for/with)", r"nested block"),
    ("reduction after the call", r"jnp\.(sum|mean|max|min)|lax\.(psum|reduce)"),
    ("indexed / sliced", r"indexes it"),
    ("no elementwise work (assigned/used as is)", r"assigned as it is|not read by the next statement"),
    ("library kernel", r"library kernel"),
    ("several outputs", r"several outputs"),
    ("output revisited across a non-innermost axis", r"revisited|not innermost"),
    ("epilogue reads another call's result", r"another call's result|another pallas_call"),
]


def bucket(reason: str) -> str:
    for label, pat in BUCKETS:
        if re.search(pat, reason):
            return label
    return "other: " + reason.split(":")[0][:70]


def survey_module(path: Path, check: bool) -> list[dict[str, Any]]:
    try:
        ir = KernelIR.from_file(path)
    except PallasoptError as e:
        return [{"call": None, "result": "load error", "reason": short(e, 200)}]
    rows, applied = [], []
    for c in ir.calls:
        row: dict[str, Any] = {"call": c.index, "line": c.span[0] if c.span else None}
        try:
            new = EpiloguePass(call=c.index).apply(ir)
            row["result"] = "applies"
            applied.append((row, new))
        except PassNotApplicable as e:
            row["result"], row["reason"] = "declines", e.reason
        except Exception as e:  # a bug in the pass: counted, never hidden
            row["result"], row["reason"] = "crash", f"{type(e).__name__}: {short(e, 200)}"
        rows.append(row)
    if check and applied:
        results = check_many([n.source for _, n in applied], str(path), seeds=(0, 1))
        for (row, _), r in zip(applied, results, strict=True):
            row["oracle"] = "ok" if r.ok else f"FAIL: {short(r.message, 200)}"
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jaxbench", default="/work/ext/aryatschand+JAXBench")
    ap.add_argument("--models", default="gemini3,gpt53", help="generated/<model> folders; `suite`: the suite's own")
    ap.add_argument("--modules", default="/tmp/epi_survey", help="where imported modules are written (cached)")
    ap.add_argument("--check", action="store_true", help="check every application in interpret mode")
    ap.add_argument("--only", default="", help="regex on the task name")
    ap.add_argument("--cached-only", action="store_true", help="survey only the modules already imported")
    ap.add_argument("--label", default="now")
    ap.add_argument("--out-dir", default="bench/results/jaxbench")
    args = ap.parse_args()
    root = Path(args.jaxbench)
    out: list[dict[str, Any]] = []
    start = time.perf_counter()
    for model in args.models.split(","):
        found = jaxbench_tasks(root, None) if model == "suite" else jaxbench_tasks(root, model, all_generated=True)
        tasks = [t for t in found if re.search(args.only, t.name)]
        mdir = Path(args.modules) / model
        todo = [t for t in tasks if not (mdir / f"{t.name}.py").is_file() and not (mdir / f"{t.name}.error").is_file()]
        if args.cached_only:  # only the tasks an earlier run imported (a partial survey: the table says so)
            tasks = [t for t in tasks if t not in todo]
            todo = []
        for i in import_tasks(todo, mdir, fix_api=True):
            if i.error:
                (mdir / f"{i.task.name}.error").write_text(i.error, encoding="utf-8")
        errors = {t.name: (mdir / f"{t.name}.error").read_text() for t in tasks if (mdir / f"{t.name}.error").is_file()}
        for t in tasks:
            base = {"model": model, "task": t.name, "correct": bool(t.recorded.get("generated_ms") is not None)}
            if t.name in errors:
                out.append({**base, "call": None, "result": "import error", "reason": errors[t.name]})
                continue
            path = mdir / f"{t.name}.py"
            if not path.is_file():
                out.append({**base, "call": None, "result": "import error", "reason": "module missing (earlier run)"})
                continue
            rows = survey_module(path, args.check)
            out += [{**base, **row} for row in rows]
            print(f"[{time.perf_counter() - start:6.0f}s] {model}/{t.name}: {[r['result'] for r in rows]}", flush=True)
    write(out, Path(args.out_dir), args.label, " ".join(["python bench/epilogue_survey.py", *_argv()]))


def _argv() -> list[str]:
    import sys

    return sys.argv[1:]


def write(rows: list[dict[str, Any]], out_dir: Path, label: str, command: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    calls = [r for r in rows if r["call"] is not None]
    counts = Counter(r["result"] for r in calls)
    reasons = Counter(bucket(r.get("reason", "")) for r in calls if r["result"] == "declines")
    not_loaded = Counter(r["result"] for r in rows if r["call"] is None)
    doc = {"command": command, "calls": len(calls), "counts": dict(counts), "declines": dict(reasons)}
    doc["not_loaded"] = dict(not_loaded)
    doc["rows"] = rows
    (out_dir / f"epilogue-survey-{label}.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    lines = [f"# epilogue on JAXBench's LLM kernels ({label})", "", f"`{command}`", ""]
    lines += [f"{len(calls)} pallas_calls traced; " + ", ".join(f"{k}: {v}" for k, v in counts.most_common())]
    lines += [f"kernels not loaded: {dict(not_loaded)}", "", "| declines by reason | calls |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in reasons.most_common()]
    lines += ["", "| model | task | call | result | reason / oracle |", "|---|---|---|---|---|"]
    for r in rows:
        why = r.get("oracle", "") if r["result"] == "applies" else r.get("reason", "")
        why = why.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r['model']} | {r['task']} | {r['call']} | {r['result']} | {why} |")
    (out_dir / f"epilogue-survey-{label}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
