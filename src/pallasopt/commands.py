"""Subcommands beyond analyze/check/passes: apply, run, replay, db."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from .config import STRATEGY_NAMES, SearchConfig
from .errors import EnvironmentProblem, ExitCode, UsageError
from .outputs import check_output, check_writable, check_writable_folder, write_atomic
from .workload import read_file


def add_load_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--load-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="seconds the module may take to import and trace (in a guarded child, before it is loaded here)",
    )


def positive_seconds(value: float, option: str) -> float:
    """A timeout option's value, or a usage error (exit 2) when it is not a positive number of seconds."""
    if not value > 0 or value == float("inf"):
        raise UsageError(f"{option} must be a positive number of seconds, got {value:g}")
    return value


def load_guarded(path: str, timeout_s: float) -> None:
    """Import and trace the module once in a guarded child (harness/preflight.py) before this process does."""
    from .harness.preflight import preflight_file

    preflight_file(path, positive_seconds(timeout_s, "--load-timeout"))


def _add_apply(sub: Any) -> None:
    p = sub.add_parser("apply", help="run a pass pipeline on a kernel, pass by pass")
    p.add_argument("file")
    p.add_argument(
        "-p", "--passes", required=True, help='pipeline spec, e.g. "tile{call=0,bm=256},dimension-semantics"'
    )
    p.add_argument("--print-after-all", action="store_true", help="print the source after every pass")
    p.add_argument("--print-after", action="append", default=[], metavar="NAME", help="print the source after NAME")
    p.add_argument("--diff", action="store_true", help="print a unified diff after each pass")
    p.add_argument("--time-passes", action="store_true", help="print each pass's wall time")
    p.add_argument("--check", action="store_true", help="run the correctness oracle on the result")
    p.add_argument("-o", "--output", help="write the result here (never the input unless it is named)")
    p.add_argument("--force", action="store_true", help="overwrite OUTPUT if it exists")
    p.add_argument("--llm", action="store_true", help="open an LLM session for llm-rewrite passes")
    p.add_argument("--db", help="kernel database for the LLM reply cache (default beside the kernel)")
    add_load_timeout(p)
    p.set_defaults(handler=cmd_apply)


def add_strategy(p: Any) -> None:
    """`--strategy NAME` (run and bench)."""
    p.add_argument(
        "--strategy",
        choices=STRATEGY_NAMES,
        default="beam",
        help="search strategy: beam (default), evolve (population + mutation/crossover), random, exhaustive "
        "(every recipe up to --depth; for measurement)",
    )


def _add_run(sub: Any) -> None:
    p = sub.add_parser("run", help="optimize a kernel: a search over passes, ranked by the fidelity tiers")
    p.add_argument("file")
    add_strategy(p)
    p.add_argument("--beam", type=int, default=8, help="beam width (evolve: population size)")
    p.add_argument("--depth", type=int, default=4, help="recipe length (evolve: generations; random: rounds)")
    p.add_argument("--target", default="v5e")
    p.add_argument("-o", "--output", help="optimized kernel path (default FILE_STEM.opt.py beside the kernel)")
    p.add_argument("--in-place", action="store_true", help="replace the input kernel with the optimized one")
    p.add_argument("--report", metavar="DIR", help="write a Markdown/HTML report with plots to DIR")
    p.add_argument("--json", action="store_true", help="print one JSON object with the result")
    p.add_argument("--db", help="kernel database path (default .pallasopt/kernels.db beside the kernel)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted search")
    p.add_argument("--fresh", action="store_true", help="search again even if the database has this run")
    p.add_argument(
        "--budget-seconds",
        type=float,
        default=None,
        help="search wall-time budget: no new compile or check starts after it (one running batch may finish)",
    )
    p.add_argument("--max-candidates", type=int, default=None)
    p.add_argument("--passes", default="", help="comma-separated pass names to search over (default: all)")
    p.add_argument("--no-compile", action="store_true", help="skip the deviceless TPU compiler tier")
    p.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="evaluations run in parallel (with --executor ray: up to the cluster's CPUs)",
    )
    add_executor_options(p)
    p.add_argument("--seed", type=int, default=0, help="drives the check seeds and the random choices of evolve/random")
    p.add_argument(
        "--start-from",
        action="append",
        default=[],
        metavar="RECIPE",
        help='start the search from this recipe too, e.g. an earlier run\'s "tile{call=0,bm=512},fuse{producer=0}" '
        "(re-verified like any candidate; kept unless the search finds better); repeatable",
    )
    p.add_argument("--llm", action="store_true", help="add LLM rewrites (needs ANTHROPIC_API_KEY; cached in the DB)")
    p.add_argument("--llm-max-requests", type=int, default=20, help="cap on LLM requests in this run")
    p.add_argument("--force", action="store_true", help="overwrite an existing file named by -o")
    add_load_timeout(p)
    p.set_defaults(handler=cmd_run)


def recipe_specs(text: str) -> tuple[str, ...]:
    """A pipeline string as the recipe's pass specs (a usage error, exit 2, names a bad one)."""
    from .passes.registry import parse_pipeline

    return tuple(p.spec() for p in parse_pipeline(text))


def add_executor_options(p: Any) -> None:
    """--executor / --ray-address (run and bench)."""
    p.add_argument(
        "--executor",
        choices=("local", "ray"),
        default="local",
        help="where compiles, checks and timings run: local child processes, or Ray tasks (extra 'ray')",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        default=None,
        help="with --executor ray: the cluster to join, e.g. ray://head:10001 or head:6379 (default RAY_ADDRESS; "
        "with neither, a local Ray instance is started for the run)",
    )


def check_executor(args: argparse.Namespace) -> None:
    """Before any work: --ray-address without --executor ray, or Ray missing for it, is one line."""
    if args.ray_address and args.executor != "ray":
        raise UsageError("--ray-address needs --executor ray")
    if args.executor == "ray":
        from .executors.ray_cluster import require_ray

        require_ray()


def _add_replay(sub: Any) -> None:
    p = sub.add_parser("replay", help="re-apply a recipe (comma-separated pass specs) to a kernel")
    p.add_argument("file")
    p.add_argument("recipe", help='e.g. "tile{call=0,bm=512},dimension-semantics{call=0}"')
    p.add_argument("-o", "--output")
    p.add_argument("--force", action="store_true")
    p.add_argument("--check", action="store_true")
    add_load_timeout(p)
    p.set_defaults(handler=cmd_apply_recipe)


def _add_db(sub: Any) -> None:
    p = sub.add_parser("db", help="inspect the kernel database")
    p.add_argument("action", choices=("show", "export"))
    p.add_argument("target", help="a kernel file (its default database) or a .db path")
    p.add_argument("--json", action="store_true")
    p.add_argument("-o", "--output", help="export to this file instead of stdout")
    p.set_defaults(handler=cmd_db)


def _add_import(sub: Any) -> None:
    from .adapters.importer import DESCRIPTION, add_import_arguments, run_import

    p = sub.add_parser(
        "import",
        help="a kernel module from a JAXBench/KernelBench/MaxKernel task and a Pallas kernel for it",
        description=DESCRIPTION,
    )
    add_import_arguments(p)
    p.set_defaults(handler=lambda args, console: run_import(args))


def _add_bench(sub: Any) -> None:
    from .bench import ADD_BENCH

    ADD_BENCH(sub)


def _add_port(sub: Any) -> None:
    from .port.command import add_port

    add_port(sub)


ADDERS: tuple[Callable[[Any], None], ...] = (
    _add_apply,
    _add_run,
    _add_replay,
    _add_db,
    _add_import,
    _add_bench,
    _add_port,
)


def _print_source(console: Console, title: str, source: str) -> None:
    console.rule(title)
    console.out(source, highlight=False)


def _write_new(path: Path, text: str, force: bool, inputs: tuple[Path, ...]) -> None:
    check_output(path, force, inputs)
    write_atomic(path, text)


def cmd_apply(args: argparse.Namespace, console: Console) -> int:
    from .ir.kernel_ir import KernelIR
    from .passes.base import spec_name
    from .passes.pipeline import StepRecord, apply_pipeline, unified_diff
    from .passes.registry import parse_pipeline

    passes = parse_pipeline(args.passes)
    read_file(args.file)  # a missing kernel is named before its output is
    if args.output:
        check_output(Path(args.output), args.force, (Path(args.file),))
    load_guarded(args.file, args.load_timeout)
    ir = KernelIR.from_file(args.file)
    after_names = set(args.print_after)

    def callback(rec: StepRecord) -> None:
        status = "applied" if rec.applied else f"declined: {rec.reason}"
        timing = f"  [{rec.seconds * 1e3:.0f} ms]" if args.time_passes else ""
        console.print(f"[bold cyan]{rec.spec}[/] {status}{timing}")
        name = spec_name(rec.spec)
        if rec.applied and args.diff:
            console.out(unified_diff(rec.before.source, rec.after.source, args.file), highlight=False)
        if args.print_after_all or name in after_names:
            _print_source(console, f"after {rec.spec}", rec.after.source)

    with _maybe_llm(args) as _session:
        final, records = apply_pipeline(ir, passes, callback)
    if args.time_passes:
        console.print(f"total {sum(r.seconds for r in records) * 1e3:.0f} ms")
    code = ExitCode.OK
    if args.check:
        from .harness.check import check

        r = check(final.source, args.file)
        console.print(
            ("[green]PASS[/] " if r.ok else "[red]FAIL[/] ") + (r.message or f"max rel err {r.max_rel_err:.2e}")
        )
        code = ExitCode.OK if r.ok else ExitCode.CHECK_FAILED
    if args.output:
        _write_new(Path(args.output), final.source, args.force, (Path(args.file),))
        console.print(f"wrote {args.output}")
    elif not (args.print_after_all or args.diff or after_names):
        _print_source(console, "result", final.source)
    return code


@contextlib.contextmanager
def _maybe_llm(args: argparse.Namespace) -> Iterator[Any]:
    """An LLM session around `apply` when --llm is given (else nothing: llm-rewrite then declines in one line)."""
    if not getattr(args, "llm", False):
        yield None
        return
    from .config import read_env
    from .db.store import KernelDB, default_path
    from .llm.client import AnthropicClient
    from .llm.session import llm_session

    env = read_env()
    if not env.anthropic_api_key:
        raise EnvironmentProblem("--llm needs ANTHROPIC_API_KEY", hint="export it, or drop --llm")
    path = Path(args.db) if args.db else (env.db_path or default_path(Path(args.file)))
    with KernelDB.open(path) as db, llm_session(AnthropicClient(env.anthropic_api_key), db, model=env.llm_model) as s:
        yield s


def cmd_apply_recipe(args: argparse.Namespace, console: Console) -> int:
    ns = argparse.Namespace(
        file=args.file,
        passes=args.recipe,
        print_after_all=False,
        print_after=[],
        diff=False,
        time_passes=False,
        check=args.check,
        output=args.output,
        force=args.force,
        llm=False,
        db=None,
        load_timeout=args.load_timeout,
    )
    return cmd_apply(ns, console)


def check_run_outputs(args: argparse.Namespace) -> None:
    """Refuse an existing -o without --force, and unwritable output or report folders, before any work."""
    from .optimize import default_output

    kernel = Path(args.file)
    if args.in_place:
        check_writable(kernel, "--in-place")
    elif args.output:
        check_output(Path(args.output), args.force, (kernel,))
    else:
        check_writable(default_output(kernel), "-o")  # pallasopt's own FILE_STEM.opt.py: replaced by a new run
    if args.report:
        check_writable_folder(Path(args.report), "--report")
        check_plotting()


def check_plotting() -> None:
    """--report draws its plots with matplotlib (a core dependency): refuse before the search, not after it."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise EnvironmentProblem(
            "--report needs matplotlib, which is not installed", hint="pip install matplotlib, or drop --report"
        )


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    from .optimize import optimize
    from .report.progress import RunDisplay

    names = tuple(n.strip() for n in args.passes.split(",") if n.strip())
    check_executor(args)
    read_file(args.file)  # a missing kernel is named before its outputs are
    check_run_outputs(args)  # before the search: a run must not end with nowhere to write
    starts = tuple(recipe_specs(r) for r in args.start_from)
    load_guarded(args.file, args.load_timeout)
    display = RunDisplay(console, enabled=not args.json)
    with display:
        config = SearchConfig(
            beam=args.beam,
            depth=args.depth,
            target=args.target,
            strategy=args.strategy,
            budget_seconds=args.budget_seconds,
            max_candidates=args.max_candidates,
            seed=args.seed,
            llm=args.llm,
            llm_max_requests=args.llm_max_requests,
            use_compiler=not args.no_compile,
            jobs=args.jobs,
            passes=names,
            start_from=starts,
        )
        result = optimize(
            args.file,
            config,
            output=args.output,
            in_place=args.in_place,
            db_path=args.db,
            resume=args.resume,
            fresh=args.fresh,
            executor=args.executor,
            ray_address=args.ray_address,
            report_dir=args.report,
            progress=display.event,
        )
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
        return ExitCode.OK if result.correct else ExitCode.CHECK_FAILED
    from .report.summary import run_table, summary_lines

    console.print(run_table(result, f"pallasopt run {args.file} --target {result.target}"))
    fc = result.final_check
    for line in summary_lines(result):
        console.print(line)
    console.print(f"recipe: {','.join(result.recipe) or '(none: the baseline is best)'}")
    for note in result.notes:
        console.print("[yellow]note:[/] " + escape(note), soft_wrap=True)
    verdict = "[green]correct[/]" if result.correct else "[red]NOT verified[/]"
    console.print(
        f"correctness: {verdict}, re-checked on fresh seeds {fc.get('data', {}).get('seeds')} at dims "
        f"{fc.get('data', {}).get('dims')} ({fc.get('data', {}).get('mode')}): {fc.get('message')}"
    )
    _print_sizes(console, fc.get("sizes"))
    src = "served from the kernel database" if result.from_cache else f"{result.candidates_evaluated} evaluations"
    console.print(f"{src}; stop: {result.stop_reason}; wall {result.wall_s:.1f} s")
    if result.correct:
        console.print(f"wrote {result.output_path}")
    if result.report_path:
        console.print(f"report: {result.report_path}")
    if result.llm_usage:
        u = result.llm_usage
        console.print(
            f"LLM: {u.get('requests')} requests, {u.get('cache_hits')} cached, tokens in/out "
            f"{u.get('input_tokens')}/{u.get('output_tokens')}, cost ${u.get('cost_usd')}"
        )
    return ExitCode.OK if result.correct else ExitCode.CHECK_FAILED


def _print_sizes(console: Console, sizes: dict[str, Any] | None) -> None:
    """The written module's checks at more than one size (fallback.py): the optimized path and the original's."""
    if not sizes:
        return
    for c in sizes.get("checks", []):
        verdict = "[green]ok[/]" if c.get("ok") else f"[red]FAIL[/] {c.get('message')}"
        console.print(f"  written module at dims {c.get('dims')} ({c.get('path')} path): {verdict}", soft_wrap=True)
    if sizes.get("note"):
        console.print(f"  {sizes['note']}", soft_wrap=True)


def cmd_db(args: argparse.Namespace, console: Console) -> int:
    from .db.store import KernelDB, default_path

    target = Path(args.target)
    path = target if target.suffix == ".db" else default_path(target)
    if not path.exists():
        raise UsageError(f"no kernel database at {path}", hint="run `pallasopt run` first, or pass a .db path")
    with KernelDB.open(path) as db:
        if args.action == "export":
            text = json.dumps(db.export(), indent=1, default=str)
            if args.output:
                write_atomic(Path(args.output), text)
                console.print(f"wrote {args.output}")
            else:
                print(text)
            return ExitCode.OK
        stats = db.stats()
        if args.json:
            print(json.dumps(stats, indent=1, default=str))
            return ExitCode.OK
        console.print(f"[bold]{path}[/]")
        for k, v in stats.items():
            console.print(f"  {k}: {v}")
        for w in db.workloads():
            run = db.last_run(w.id)
            res = run.result if run and run.result else {}
            console.print(
                f"  workload {w.id}: {w.path} target {w.target} dims {w.dims}  last run: "
                f"{run.state if run else '-'} speedup {res.get('speedup', '-')} recipe {','.join(res.get('recipe', []))}"
            )
    return ExitCode.OK
