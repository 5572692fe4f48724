"""`pallasopt port KERNEL.py --reference REF.py [--launcher NAME] -o OUT.py [--force] [--run [--run-args ...]]`."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from ..errors import ExitCode
from ..outputs import check_output

DESCRIPTION = (
    "Translate @triton.jit kernels and their launcher (parsed, never imported: no triton or torch needed) into a "
    "pallasopt kernel module; REF.py defines reference(*args) and make_inputs(key, **dims) for the launcher's array "
    "arguments. Kernels outside the rule subset are declined with FILE:LINE and the reason."
)


def add_port(sub: Any) -> None:
    p = sub.add_parser("port", help="port a Triton kernel to a Pallas kernel module", description=DESCRIPTION)
    p.add_argument("file", help="the Triton source: @triton.jit kernels and the launcher")
    p.add_argument("--reference", required=True, help="REF.py: reference(*args) and make_inputs(key, **dims)")
    p.add_argument("--launcher", help="the function that launches the kernel (needed when the file has several)")
    p.add_argument("-o", "--output", required=True, help="the kernel module to write")
    p.add_argument("--force", action="store_true", help="overwrite OUTPUT if it exists")
    p.add_argument("--llm", action="store_true", help="ask the LLM for what the rules decline (ANTHROPIC_API_KEY)")
    p.add_argument("--db", help="kernel database for the LLM reply cache (default .pallasopt/kernels.db beside OUTPUT)")
    p.add_argument("--run", action="store_true", help="then optimize OUTPUT (pallasopt run OUTPUT ...)")
    p.add_argument("--run-args", default="", help='options for that run, e.g. "--target v5e --beam 4 --depth 2"')
    p.set_defaults(handler=cmd_port)


def cmd_port(args: argparse.Namespace, console: Any) -> int:
    from ..workload import read_file
    from .module import port_source

    out = Path(args.output)
    text = read_file(args.file)
    ref = read_file(args.reference)
    check_output(out, args.force, (Path(args.file), Path(args.reference)))
    if args.llm:
        source = _with_llm(args, text, ref)
    else:
        source = _report(port_source(args.file, text, args.reference, ref, args.launcher), args.file)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(source, encoding="utf-8")
    print(f"wrote {out} (check it with: pallasopt check {out})")
    if not args.run:
        return ExitCode.OK
    from ..cli import build_parser

    run_args = build_parser().parse_args(["run", str(out), *shlex.split(args.run_args)])
    return int(run_args.handler(run_args, console))


def _report(result: Any, path: str) -> str:
    for k in result.kernels:
        print(k.line_text(path), file=sys.stderr if k.status == "declined" else sys.stdout)
    for note in result.notes:
        print("note: " + note)
    return str(result.source)


def _with_llm(args: argparse.Namespace, text: str, ref: str) -> str:
    """Rules first; what they decline goes to the LLM (same session, cache, validation and oracle as the passes)."""
    from ..config import read_env
    from ..db.store import KernelDB, default_path
    from ..errors import EnvironmentProblem, UserError
    from ..llm.client import AnthropicClient
    from ..llm.session import llm_session
    from .llm_port import llm_port, skeleton
    from .module import choose_launcher, port_source
    from .source import read_triton

    env = read_env()
    if not env.anthropic_api_key:
        raise EnvironmentProblem("--llm needs ANTHROPIC_API_KEY", hint="export it, or drop --llm")
    try:
        result = port_source(args.file, text, args.reference, ref, args.launcher)
    except UserError as e:
        if "in the rule subset" not in e.message:
            raise
        launcher = choose_launcher(read_triton(args.file, text), args.launcher).name.value
        partial, declines = skeleton(args.reference, ref, launcher), [str(e)]
    else:
        partial = _report(result, args.file)
        declines = [k.line_text(args.file) for k in result.kernels if k.status == "declined"]
        if not declines:
            print("note: the rules ported every kernel; the LLM was not asked")
            return partial
    path = Path(args.db) if args.db else (env.db_path or default_path(Path(args.output)))
    with KernelDB.open(path) as db, llm_session(AnthropicClient(env.anthropic_api_key), db, model=env.llm_model) as s:
        res = llm_port(s, args.file, text, partial, declines, args.output)
        usage = s.usage()
    for i, line in enumerate(res.attempts, 1):
        print(f"LLM attempt {i}: {line}")
    print(f"LLM: {usage.requests} requests, {usage.cache_hits} cached")
    if res.source is None:
        raise UserError(
            f"the LLM's ports failed validation or the oracle {len(res.attempts)} times: {res.attempts[-1]}",
            path=args.file,
            hint="port the declined kernel by hand, or retry with another PALLASOPT_MODEL",
        )
    return res.source
