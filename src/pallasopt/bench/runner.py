"""The bench runner: find the suite's kernels, optimize and estimate each one, and the `pallasopt bench` command."""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from ..commands import add_strategy
from ..errors import ExitCode, UsageError
from ..ir.kernel_ir import KernelIR
from .estimate import CompilerEstimator, Estimator, versions
from .render import fmt_ratio, fmt_time, summary_lines, write_results
from .rows import Row, summarize

# --quick: one kernel of each kind (GEMM, attention, norm, softmax, conv, data movement); three have `hand_tuned`
# or a looped reference, so every column of the table is exercised.
QUICK_KERNELS = (
    "llm_large_gemm",
    "llm_flash_attention",
    "llm_rmsnorm",
    "fused_23_softmax_vocab",
    "fused_20_depthwise3x3_bias",
    "fused_31_transpose_scale",
)
QUICK_SEARCH = (2, 1)  # beam, depth
SUITE_SEARCH = (4, 2)

Progress = Callable[[str, dict[str, Any]], None]


# ------------------------------------------------------------------------------------------------------- runner


def find_kernels(suite: Path, patterns: Sequence[str] = (), quick: bool = False) -> list[Path]:
    """Kernel modules of `suite` (sorted), filtered by glob `patterns` on the file name or stem."""
    files = sorted(p for p in suite.glob("*.py") if not p.name.endswith(".opt.py") and not p.name.startswith("_"))
    if quick:
        files = [p for p in files if p.stem in QUICK_KERNELS]
    if patterns:
        files = [p for p in files if any(fnmatch.fnmatch(p.name, g) or fnmatch.fnmatch(p.stem, g) for g in patterns)]
    return files


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 400 else text[:397] + "..."


def bench_kernel(
    path: Path,
    *,
    estimator: Estimator | None = None,
    progress: Progress | None = None,
    starts: Mapping[str, tuple[tuple[str, ...], ...]] | None = None,
    **opts: Any,
) -> Row:
    """Optimize one kernel (write_output=False) and estimate its XLA reference and hand-tuned kernel.

    `opts` go to `optimize()`: SearchConfig fields (target, beam, depth, strategy, jobs, budget_seconds,
    use_compiler) and its run options (db_path, fresh, evaluator). `starts`: recipes by kernel stem that the
    search starts from (`--start-from`: an earlier bench's best, re-verified and kept unless beaten).
    A search that raises becomes a row with `error`; the estimates are still attempted.
    """
    from ..optimize import optimize

    say = progress or (lambda e, i: None)
    started = (starts or {}).get(path.stem, ())
    t0 = time.perf_counter()
    try:
        res = optimize(str(path), write_output=False, progress=progress, start_from=started, **opts)
        row = Row(
            kernel=path.stem,
            path=str(path),
            correct=res.correct,
            tier=res.best.tier,
            baseline_s=res.baseline.time_s,
            best_s=res.best.time_s,
            # No ratio (the baseline does not compile on the target): the bench's math counts the kernel as kept.
            speedup=res.speedup,
            recipe=tuple(res.recipe),
            wall_s=res.wall_s,
            candidates=res.candidates_evaluated,
            stop_reason=res.stop_reason,
            from_cache=res.from_cache,
            model_baseline_s=res.model_baseline_s,
            model_best_s=res.model_best_s,
            started_from=started,
            notes=tuple(res.notes),
        )
    except KeyboardInterrupt:
        raise
    except Exception as e:
        row = Row(kernel=path.stem, path=str(path), wall_s=time.perf_counter() - t0, error=_one_line(e))
    if estimator is None:
        return row
    try:
        ir = KernelIR.from_file(path)
    except Exception:
        return row  # the search already recorded why the module cannot be used
    say("estimate", {"fn": "reference"})
    xla = estimator(ir, "reference")
    hand = None
    if ir.workload is not None and ir.workload.spec.has_hand_tuned:
        say("estimate", {"fn": "hand_tuned"})
        hand = estimator(ir, "hand_tuned")
    return replace(row, xla=xla, hand_tuned=hand)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()}-core {cpu}, {platform.system()} {platform.release()}, Python {platform.python_version()}"


# ---------------------------------------------------------------------------------------------------------- CLI


def _add_bench(sub: Any) -> None:
    p = sub.add_parser("bench", help="optimize every kernel of the benchmark suite and summarize")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{len(QUICK_KERNELS)} representative kernels, beam "
        f"{QUICK_SEARCH[0]}, depth {QUICK_SEARCH[1]} (a few minutes)",
    )
    p.add_argument("--target", default=None, help="chip (default v5e; v6e with --jaxbench, the chip of its numbers)")
    p.add_argument("--beam", type=int, default=None, help=f"default {SUITE_SEARCH[0]} ({QUICK_SEARCH[0]} with --quick)")
    p.add_argument(
        "--depth", type=int, default=None, help=f"default {SUITE_SEARCH[1]} ({QUICK_SEARCH[1]} with --quick)"
    )
    add_strategy(p)
    p.add_argument("--kernels", default="", help="comma-separated globs on kernel file names, e.g. 'llm_*'")
    p.add_argument("--suite", default="bench/kernels", help="folder of kernel modules")
    p.add_argument("--jaxbench", metavar="DIR", help="a local JAXBench checkout: its tasks with a Pallas kernel")
    p.add_argument(
        "--generated", metavar="MODEL", help="with --jaxbench: the LLM kernels of pallas_eval/generated/MODEL"
    )
    p.add_argument(
        "--all-generated", action="store_true", help="with --generated: also the tasks the suite marks incorrect"
    )
    p.add_argument("--maxkernel", metavar="DIR", help="MaxKernel task folders (reference.py) below DIR")
    p.add_argument("--kernels-from", metavar="DIR", help="with --maxkernel: DIR/<task>/optimized.py or DIR/<task>.py")
    p.add_argument("--out", default="bench/results", help="folder for the JSON / Markdown / PNG results")
    p.add_argument("--db", default=None, help="kernel database (default OUT/bench.db): a rerun resumes from it")
    p.add_argument("--budget-seconds", type=float, default=None, help="search budget per kernel")
    p.add_argument("--jobs", type=int, default=2, help="evaluations run in parallel per search")
    from ..commands import add_executor_options

    add_executor_options(p)  # --executor ray: also several kernels' searches at once, sharing the cluster
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="RESULTS.json",
        help="combine the results of bench runs (shards of one suite run in parallel) into one set of files in --out",
    )
    p.add_argument("--fresh", action="store_true", help="search again even where the database has a finished run")
    p.add_argument(
        "--start-from",
        action="append",
        default=[],
        metavar="RESULTS.json",
        help="start each kernel's search from its best recipe in these earlier bench results (re-verified; kept "
        "unless the search finds better); repeatable",
    )
    p.add_argument("--no-compile", action="store_true", help="model tier only; no XLA / hand-tuned estimates")
    p.set_defaults(handler=cmd_bench)


ADD_BENCH = _add_bench


def _resolve_suite(suite: str) -> Path:
    p = Path(suite)
    if not p.is_dir() and not p.is_absolute():
        alt = Path(__file__).resolve().parents[3] / suite  # the repository's bench/kernels from any cwd
        p = alt if alt.is_dir() else p
    if not p.is_dir():
        raise UsageError(f"no kernel suite folder {suite}", hint="pass --suite DIR")
    return p


def _external(args: argparse.Namespace, out: Path, patterns: Sequence[str]) -> tuple[list[Path], list[Row], dict]:
    """--jaxbench / --maxkernel: the suite's tasks imported into OUT/modules; import failures as error rows."""
    from .suites import SUITE_TIMES_NOTE, import_tasks, jaxbench_tasks, maxkernel_tasks

    if args.jaxbench and args.maxkernel:
        raise UsageError("give --jaxbench or --maxkernel, not both")
    if args.jaxbench:
        tasks = jaxbench_tasks(Path(args.jaxbench), args.generated, all_generated=args.all_generated)
    else:
        tasks = maxkernel_tasks(Path(args.maxkernel), Path(args.kernels_from) if args.kernels_from else None)
    if patterns:
        tasks = [t for t in tasks if any(fnmatch.fnmatch(t.name, g) for g in patterns)]
    imported = import_tasks(tasks, out / "modules")
    failed = [Row(kernel=i.task.name, path=str(i.task.task), error=i.error) for i in imported if i.module is None]
    notes: dict[str, dict[str, Any]] = {}
    for i in imported:
        rec = dict(i.task.recorded)
        if rec:
            rec["tier"] = SUITE_TIMES_NOTE
        if i.fixed:
            rec["fixed"] = list(i.fixed)
        rec["task"], rec["kernel_file"] = str(i.task.task), str(i.task.kernel)
        notes[i.task.name] = rec
    return [i.module for i in imported if i.module is not None], failed, notes


def merge_results(paths: Sequence[Path], out: Path) -> dict[str, Path]:
    """One results set from several runs' JSON (rows in the given order; a kernel in two runs: the later one)."""
    docs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in paths]
    rows: dict[str, Row] = {}
    for doc in docs:
        rows.update({r["kernel"]: Row.from_dict(r) for r in doc["rows"]})
    metas = [d["meta"] for d in docs]
    if len({m["target"] for m in metas}) != 1:
        raise UsageError("the results to merge are for different targets", hint="merge runs of one target")
    meta = dict(metas[0])
    meta["command"] = " ; ".join(m["command"] for m in metas) + " (merged with --merge)"
    meta["kernels"] = list(rows)
    meta["wall_s"] = sum(float(m.get("wall_s") or 0.0) for m in metas)
    meta["merged_from"] = [str(p) for p in paths]
    stem = Path(paths[0]).stem
    out.mkdir(parents=True, exist_ok=True)
    return write_results(out, stem, list(rows.values()), meta)


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    from ..optimize import resolve_target

    if args.merge:
        paths = merge_results([Path(p) for p in args.merge], Path(args.out))
        console.print("wrote " + ", ".join(str(p) for p in paths.values()))
        return ExitCode.OK

    from ..commands import check_executor

    check_executor(args)
    external = bool(args.jaxbench or args.maxkernel)
    chip = resolve_target(args.target or ("v6e" if args.jaxbench else "v5e"))
    beam, depth = QUICK_SEARCH if args.quick else SUITE_SEARCH
    beam, depth = args.beam or beam, depth if args.depth is None else args.depth
    patterns = tuple(g.strip() for g in args.kernels.split(",") if g.strip())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    failed: list[Row] = []
    notes: dict[str, dict[str, Any]] = {}
    if external:
        kernels, failed, notes = _external(args, out, patterns)
        if not kernels and not failed:
            raise UsageError("no task with a Pallas kernel found", hint="check the folder and --generated")
    else:
        kernels = find_kernels(_resolve_suite(args.suite), patterns, args.quick)
    if not kernels and not failed:
        raise UsageError("no kernel matches", hint=f"check --suite {args.suite} and --kernels {args.kernels!r}")

    starts = start_recipes([Path(p) for p in args.start_from])
    db = Path(args.db) if args.db else out / "bench.db"
    estimator = None if args.no_compile else CompilerEstimator(chip, db.with_name(db.stem + ".estimates.json"))
    date = datetime.date.today().isoformat()
    suite = "jaxbench" + (f"-{args.generated}" if args.generated else "") if args.jaxbench else "maxkernel"
    stem = (f"{suite}-" if external else "") + f"{chip.name}-{date}" + ("-quick" if args.quick else "")
    meta: dict[str, Any] = {
        "command": _command_line(args),
        "target": chip.name,
        "date": date,
        "quick": args.quick,
        "beam": beam,
        "depth": depth,
        "strategy": args.strategy,
        "jobs": args.jobs,
        "budget_seconds": args.budget_seconds,
        "start_from": list(args.start_from),
        "kernels": [k.stem for k in kernels] + [r.kernel for r in failed],
        "suite": suite if external else str(args.suite),
        "db": str(db),
        "machine": machine(),
        "versions": versions(),
        "wall_s": 0.0,
    }
    console.print(
        f"[bold]pallasopt bench[/] {len(kernels)} kernels, target {chip.name}, beam {beam}, depth {depth}, db {db}"
    )
    from ..config import read_env
    from ..executors import make_executor
    from .parallel import kernels_in_flight, run_parallel

    address = args.ray_address or (read_env().ray_address if args.executor == "ray" else None)
    executor = make_executor(args.executor, address)
    opts: dict[str, Any] = {
        "target": chip.name,
        "beam": beam,
        "depth": depth,
        "db_path": db,
        "jobs": args.jobs,
        "budget_seconds": args.budget_seconds,
        "use_compiler": not args.no_compile,
        "strategy": args.strategy,
        "fresh": args.fresh,
        "executor": executor,
        "starts": starts,
    }
    try:
        if executor.name == "local":
            rows, paths = run_suite(
                kernels, out, stem, meta, console=console, estimator=estimator, failed=failed, notes=notes, **opts
            )
        else:
            meta["executor"] = executor.name
            n = kernels_in_flight(executor.slots(), args.jobs, len(kernels))
            rows, paths = run_parallel(
                kernels, out, stem, meta, console=console, estimator=estimator, in_flight=n, failed=failed,
                notes=notes, **opts,
            )  # fmt: skip
    finally:
        executor.close()
    for k, v in summary_lines(summarize(rows)):
        console.print(f"  {k}: [bold]{v}[/]")
    console.print("wrote " + ", ".join(str(p) for p in paths.values()))
    return ExitCode.OK


def start_recipes(paths: Sequence[Path]) -> dict[str, tuple[tuple[str, ...], ...]]:
    """Each kernel's best recipe in earlier bench results (`--start-from`), by kernel stem: the rows that were
    correct and changed something; several files give a kernel each of their distinct recipes."""
    out: dict[str, list[tuple[str, ...]]] = {}
    for p in paths:
        try:
            rows = json.loads(p.read_text())["rows"]
            found = [(str(r["kernel"]), tuple(r.get("recipe") or ()), bool(r.get("correct"))) for r in rows]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UsageError(
                f"{p}: not bench results ({type(e).__name__}: {e})",
                hint="--start-from takes the .json a `pallasopt bench` run wrote",
            ) from None
        for kernel, recipe, correct in found:
            if correct and recipe and recipe not in out.setdefault(kernel, []):
                out[kernel].append(recipe)
    return {k: tuple(v) for k, v in out.items() if v}


def run_suite(
    kernels: Sequence[Path],
    out: Path,
    stem: str,
    meta: dict[str, Any],
    *,
    console: Console,
    estimator: Estimator | None,
    failed: Sequence[Row] = (),
    notes: Mapping[str, dict[str, Any]] | None = None,
    **opts: Any,
) -> tuple[list[Row], dict[str, Path]]:
    """Bench `kernels` one by one (a line per kernel, a rich status while it runs), rewriting the results after
    each so an interrupted suite leaves what it finished. `opts` go to `optimize()`. `failed`: rows of kernels
    that could not even be loaded (listed first); `notes`: a suite's own record per kernel stem (Row.suite)."""
    notes = notes or {}
    rows: list[Row] = [replace(r, suite=notes.get(r.kernel)) for r in failed]
    paths: dict[str, Path] = {}
    start = time.perf_counter()
    try:
        for i, path in enumerate(kernels, 1):
            head = f"[{i}/{len(kernels)}] {path.stem}"
            with console.status(f"{head}: baseline...") as status:
                row = bench_kernel(path, estimator=estimator, progress=_StatusLine(status, head), **opts)
            row = replace(row, suite=notes.get(path.stem))
            rows.append(row)
            console.print(_row_line(i, len(kernels), row))
            meta["wall_s"] = time.perf_counter() - start
            paths = write_results(out, stem, rows, meta, plot=False)
    finally:
        meta["wall_s"] = time.perf_counter() - start
        if rows:
            paths = write_results(out, stem, rows, meta)
    return rows, paths


def _command_line(args: argparse.Namespace) -> str:
    """The command as parsed (canonical option order), for the results' header."""
    words = ["pallasopt bench"] + ["--quick"] * args.quick + [f"--target {args.target}"] * bool(args.target)
    for name in ("jaxbench", "generated", "maxkernel", "kernels_from"):
        if getattr(args, name, None):
            words.append(f"--{name.replace('_', '-')} {getattr(args, name)}")
    words += ["--all-generated"] * bool(getattr(args, "all_generated", False))
    for name in ("beam", "depth", "budget_seconds"):
        if getattr(args, name) is not None:
            words.append(f"--{name.replace('_', '-')} {getattr(args, name)}")
    words += [f"--kernels '{args.kernels}'"] * bool(args.kernels) + [f"--jobs {args.jobs}"]
    words += [f"--executor {args.executor}"] * (getattr(args, "executor", "local") != "local")
    words += [f"--start-from {p}" for p in getattr(args, "start_from", [])]
    words += [f"--out {args.out}"] + [f"--db {args.db}"] * bool(args.db) + ["--no-compile"] * args.no_compile
    return " ".join(words)


class _StatusLine:
    """Turns the search's progress events into the one-line rich status of the kernel being benched."""

    def __init__(self, status: Any, head: str) -> None:
        self.status, self.head = status, head

    def __call__(self, kind: str, info: dict[str, Any]) -> None:
        what = {
            "baseline": "searching",
            "expanded": f"depth {info.get('depth')}: ranking {info.get('children')} candidates",
            "depth": f"depth {info.get('depth')} done",
            "estimate": f"compiler estimate of {info.get('fn')}",
        }.get(kind)
        if what is not None:
            self.status.update(f"{self.head}: {what}")


def _row_line(i: int, n: int, r: Row) -> str:
    head = f"[{i}/{n}] {r.kernel:<36}"
    if r.error:
        return f"{head} [red]ERROR[/] {r.error[:160]}"
    verdict = "[green]correct[/]" if r.correct else "[red]NOT verified[/]"
    xla = f"vs XLA {fmt_ratio(r.vs_xla)}" if r.xla else ""
    ht = f"HT/best {fmt_ratio(r.frac_hand_tuned)}" if r.hand_tuned else ""
    cache = " (from db)" if r.from_cache else ""
    return (
        f"{head} {verdict} {fmt_ratio(r.speedup):>7} {fmt_time(r.baseline_s, r.tier)} -> {fmt_time(r.best_s, r.tier)}  {xla}  "
        f"{ht}  {r.wall_s:.0f} s{cache}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m pallasopt.bench ...`: the bench command on its own (same options as `pallasopt bench`)."""
    parser = argparse.ArgumentParser(prog="pallasopt bench")
    _add_bench(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=140)
    try:
        return int(args.handler(args, console))
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # same one-line user errors as the CLI
        from ..errors import PallasoptError

        if isinstance(e, PallasoptError):
            Console(stderr=True).print(f"pallasopt: error: {e}", markup=False)
            return int(e.exit_code)
        raise
