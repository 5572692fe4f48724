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
    result = port_source(args.file, text, args.reference, ref, args.launcher)
    for k in result.kernels:
        print(k.line_text(args.file), file=sys.stderr if k.status == "declined" else sys.stdout)
    for note in result.notes:
        print("note: " + note)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(result.source, encoding="utf-8")
    print(f"wrote {out} (check it with: pallasopt check {out})")
    if not args.run:
        return ExitCode.OK
    from ..cli import build_parser

    run_args = build_parser().parse_args(["run", str(out), *shlex.split(args.run_args)])
    return int(run_args.handler(run_args, console))
