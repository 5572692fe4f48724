"""The `pallasopt` command. The only module that reads argv; exit codes are listed in errors.ExitCode."""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from .errors import ExitCode, PallasoptError, UsageError
from .lifeline import install_handlers

Handler = Callable[[argparse.Namespace, Console], int]


def _add_analyze(sub: Any) -> None:
    p = sub.add_parser("analyze", help="print the traced facts (and the cost model's view) of a kernel module")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--target", default=None, help="chip for the roofline model (v4, v5e, v5p, v6e, tpu7x)")
    p.add_argument("--compile", action="store_true", help="also compile for the target with libtpu (extra 'tpu')")
    from .commands import add_load_timeout

    add_load_timeout(p)
    p.set_defaults(handler=cmd_analyze)


def _add_check(sub: Any) -> None:
    p = sub.add_parser("check", help="check the kernel against its reference in interpret mode")
    p.add_argument("file")
    p.add_argument("--json", action="store_true")
    p.add_argument("--seeds", default="101,202", help="comma-separated input seeds (at least two)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before the check is abandoned")
    p.set_defaults(handler=cmd_check)


def _add_passes(sub: Any) -> None:
    p = sub.add_parser("passes", help="list the registered passes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_passes)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pallasopt",
        description="Make Pallas kernels fast, automatically and verifiably.",
        epilog="Exit codes: 0 ok, 1 check failed, 2 usage, 3 bad kernel module, 4 missing dependency, "
        "5 database, 70 internal error.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_analyze, _add_check, _add_passes, *_extra_commands()):
        add(sub)
    return parser


def _extra_commands() -> tuple[Callable[[Any], None], ...]:
    """Commands defined next to the code they drive (apply/run/replay/db/bench)."""
    from . import commands

    return commands.ADDERS


def cmd_analyze(args: argparse.Namespace, console: Console) -> int:
    from .commands import load_guarded
    from .ir.kernel_ir import KernelIR
    from .report.tables import body_line, facts_table

    load_guarded(args.file, args.load_timeout)
    ir = KernelIR.from_file(args.file)
    estimates: list[Any] = []
    compiled: Any = None
    if args.target or args.compile:
        from .analysis import analyze_ir

        estimates, compiled = analyze_ir(ir, args.target or "v5e", compile=args.compile)
    from .ir.library import library_calls

    library = library_calls(ir)  # what the file can tune in a library kernel (its knobs, found by re-tracing)
    if args.json:
        out: dict[str, Any] = {
            "file": args.file,
            "entry": ir.entry,
            "dims": dict(ir.dims),
            "calls": [c.to_dict() for c in ir.calls],
            "library": [
                {"call": c.index, "site": c.site, "line": c.line, "note": c.describe(args.file)} for c in library
            ],
        }
        if estimates:
            out["estimates"] = [e.to_dict() for e in estimates]
        if compiled is not None:
            out["compiler"] = compiled
        print(json.dumps(out, indent=1))
        return ExitCode.OK
    console.print(f"[bold]{args.file}[/]  entry [cyan]{ir.entry}[/]  dims {dict(ir.dims)}")
    for call in ir.calls:
        console.print(facts_table(call))
        console.print("  " + body_line(call))
    for lib in library:
        console.print("  " + escape(lib.describe(args.file)), soft_wrap=True)
    if estimates:
        from .report.text import print_estimates

        print_estimates(console, estimates, compiled)
    return ExitCode.OK


def _parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise UsageError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise UsageError("--seeds needs at least two distinct seeds")
    return seeds


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    from .commands import positive_seconds
    from .harness.check import check
    from .workload import inspect_source, read_file

    seeds = _parse_seeds(args.seeds)
    timeout_s = positive_seconds(args.timeout, "--timeout")
    source = read_file(args.file)
    inspect_source(source, args.file)  # a malformed file is a one-line error, not a failed check
    result = check(source, args.file, seeds=seeds, timeout_s=timeout_s)
    if result.user_error:  # the module itself is broken (make_inputs raises, the entry does not trace): one line
        from .errors import KernelError

        raise KernelError(result.message)
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    elif result.ok:
        console.print(
            f"[green]PASS[/] {args.file}: {len(result.seeds)} seeds at dims {dict(result.dims)} ({result.mode}), "
            f"max rel err {result.max_rel_err:.2e}, tolerance {result.tolerance}, {result.wall_s:.1f} s",
            soft_wrap=True,
        )
    else:
        tol = f" [tolerance {result.tolerance}]" if result.tolerance else ""
        console.print(f"[red]FAIL[/] {args.file}: {result.status}: {result.message}{tol}", soft_wrap=True)
    return ExitCode.OK if result.ok else ExitCode.CHECK_FAILED


def cmd_passes(args: argparse.Namespace, console: Console) -> int:
    from .passes.registry import PASSES, describe

    rows = [describe(p) for p in PASSES]
    if args.json:
        print(json.dumps(rows, indent=1))
        return ExitCode.OK
    if not rows:
        console.print("no passes registered")
    for row in rows:
        params = ", ".join(f"{k}={v}" for k, v in row["params"].items())
        console.print(f"[bold cyan]{row['name']}[/] {{{escape(params)}}}\n    {escape(row['summary'])}")
    return ExitCode.OK


def _trace_on_cpu() -> None:
    """The command's own process only traces, ranks and compiles deviceless; kernels run (and are timed) in child
    processes. Keep JAX here on the CPU so libtpu or CUDA never initializes in it (its warnings were noise, and a
    second process holding a TPU would block the timing child)."""
    import jax

    jax.config.update("jax_platforms", "cpu")


def main(argv: Sequence[str] | None = None) -> int:
    console = Console(stderr=False, highlight=False)
    if not console.is_terminal:
        console = Console(stderr=False, highlight=False, width=140)
    err = Console(stderr=True, highlight=False)
    parser = build_parser()
    args = parser.parse_args(argv)
    install_handlers()  # SIGTERM, Ctrl-C or the command's exit kill its child processes first
    _trace_on_cpu()
    try:
        code = int(args.handler(args, console))
    except PallasoptError as e:
        err.print(f"pallasopt: error: {e}", markup=False, soft_wrap=True)
        code = int(e.exit_code)
    except KeyboardInterrupt:
        err.print("pallasopt: interrupted")
        code = 130
    except Exception:
        err.print(
            "pallasopt: internal error (a bug in pallasopt; please report it with this traceback):", soft_wrap=True
        )
        err.print(traceback.format_exc(), markup=False)
        code = ExitCode.INTERNAL
    return code


def entrypoint() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entrypoint()
