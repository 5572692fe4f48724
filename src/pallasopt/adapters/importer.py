"""`pallasopt import`: a suite task (and a Pallas kernel for it) as a kernel module pallasopt can check and optimize."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jax

from ..errors import ExitCode, KernelError, UsageError, UserError
from ..workload import exec_module, read_file
from ._common import SuiteWorkload, parse_source, top_names
from .emit import ENTRY_NAME, to_kernel_module, to_kernel_module_template
from .kernel_source import KernelCode, drift_error, extract_code, find_drift, find_ref_slices, fix_api
from .tasks import FORMATS, Task, kernel_kind, load_task, locate


@dataclass(frozen=True)
class Imported:
    """What `import_task` wrote (or would write): the module text and what the user should be told."""

    text: str
    stub: bool  # no kernel was found: the entry is a stub to fill
    kernel: str | None  # the kernel file used
    fixed: tuple[str, ...]  # API drift rewritten (--fix-api)
    check_dims: dict[str, int] | None
    notes: tuple[str, ...]


def read_kernel(path: Path, *, fix: bool) -> tuple[KernelCode, tuple[str, ...]]:
    """The kernel's code (cut out of an LLM reply if need be), its API drift fixed when asked, else refused."""
    kernel = extract_code(read_file(path), str(path))
    fixed: tuple[str, ...] = ()
    if fix:
        code, done = fix_api(kernel.code)
        kernel = KernelCode(code, kernel.path, kernel.extracted, kernel.first_line, kernel.cut_off, kernel.last_line)
        fixed = tuple(d.describe(kernel.first_line) for d in done)
    drift = find_drift(kernel.code)
    if drift:
        raise drift_error(drift[0], kernel.path, kernel.first_line)
    return kernel, fixed


def import_task(
    task: Task,
    *,
    kernel_path: Path | None = None,
    case: int = 0,
    dtype: str | None = None,
    fix: bool = False,
    out_path: Path | None = None,
    derive_dims: bool = True,
) -> Imported:
    """The kernel module for `task` with `kernel_path` (default: the kernel the task ships), or a stub without one.

    `out_path` labels the module while its check dims are derived (the module is traced there, never written)."""
    kpath = kernel_path or task.shipped_kernel
    if kpath is None:
        sw = load_task(task, case=case, dtype=dtype)
        return Imported(to_kernel_module_template(sw), True, None, (), None, sw.notes)
    kernel, fixed = read_kernel(kpath, fix=fix)
    try:
        kind = kernel_kind(kernel.code, kernel.path)
    except KernelError as e:
        raise _cut_off(kernel, e) from None
    sw = load_task(task, case=case, dtype=dtype, fix=fix)
    text = to_kernel_module(sw, kernel, kind, fixed=fixed)
    dims = None
    if derive_dims:
        from .check_dims import full_size_note, import_check_dims

        label = str(out_path or Path(kpath).with_suffix(".pallasopt.py"))
        try:
            dims = import_check_dims(text, label)
        except KernelError as e:
            e = _captured(_in_kernel_file(kernel, text, label, e))
            e = _not_the_module(kernel, label, _cut_off(kernel, e))
            raise _input_mismatch(kernel, sw) or _ref_slices(kernel, e, fix) from None
        note = full_size_note(text, label, dims)
        sw = replace(sw, notes=(*sw.notes, note)) if note else sw
        text = to_kernel_module(sw, kernel, kind, fixed=fixed, check_dims=dims)
    return Imported(text, False, str(kpath), fixed, dims, (*kernel.notes(), *sw.notes))


def _shapes(structs: Any) -> list[str]:
    return [f"{a.dtype}{list(a.shape)}" for a in jax.tree.leaves(structs) if hasattr(a, "shape")]


def _in_kernel_file(kernel: KernelCode, text: str, label: str, e: KernelError) -> KernelError:
    """`e` (raised on the module being built, `label`, which is never written when the import fails) with its lines
    in the kernel's code named as lines of the kernel's own file: a kernel closing over a jnp scalar was reported
    at `out.py:47` (the generated entry) and `out.py:38` (its kernel), a file the user does not have (session 35,
    JAXBench gemini3 `31_ELU`). Where the error's own line is the generated harness, the first kernel line its
    message names is the place."""
    code = kernel.code.rstrip("\n")
    start = text.find(code)
    if start < 0:
        return e
    offset, n = text.count("\n", 0, start), kernel.last_line - kernel.first_line + 1  # not helpers --fix-api added

    def in_kernel(line: int) -> int | None:
        k = line - offset
        return kernel.first_line + k - 1 if 1 <= k <= n else None

    named: list[int] = []

    def rename(m: re.Match[str]) -> str:
        line = in_kernel(int(m[1]))
        if line is None:
            return m[0]
        named.append(line)
        return f"{kernel.path}:{line}"

    message = re.sub(rf"{re.escape(label)}:(\d+)", rename, e.message)
    own = in_kernel(e.line) if e.path == label and e.line else None
    line = own or (named[0] if e.path == label and named else None)
    if line is None and message == e.message:
        return e
    return KernelError(message, path=kernel.path if line else e.path, line=line or e.line, hint=e.hint)


def _captured(e: KernelError) -> KernelError:
    """`e` with what to do where Pallas says the kernel "captures constants" (it closes over a concrete jax array:
    JAXBench gemini3 `31_ELU`'s `alpha = jnp.asarray(self.alpha, dtype=x.dtype)`)."""
    if "captures constants" not in e.message:
        return e
    hint = (
        "the kernel closes over a jax array (a scalar made with jnp.asarray / jnp.array, or a model attribute): "
        "use a Python number there, or pass it to pallas_call as an input (`pallasopt import --fix-api` makes a "
        "`name = jnp.asarray(...)` the kernel closes over a Python number where its value is concrete)"
    )
    return KernelError(e.message, path=e.path, line=e.line, hint=hint)


def _ref_slices(kernel: KernelCode, e: KernelError, fixed: bool) -> KernelError:
    """`e` with a hint where the kernel slices refs at run-time offsets and `--fix-api` was not given (the usual
    reason such a kernel does not trace)."""
    found = () if fixed else find_ref_slices(kernel.code)
    if not found:
        return e
    where = found[0].line + kernel.first_line - 1
    return KernelError(
        e.message,
        path=e.path,
        line=e.line,
        hint=f"the kernel slices refs at run-time offsets (line {where}: {found[0].name}), which Pallas does not "
        f"trace: `pallasopt import --fix-api` rewrites them as {found[0].replacement}",
    )


def _not_the_module(kernel: KernelCode, label: str, e: KernelError) -> KernelError:
    """`e` placed in the kernel's file where it still names the module being built (`label`), which a failed import
    never writes: at the line the reply was cut off after when it was, else the file alone (JAXBench gemini3
    `46_Average_Pooling_3D`: "out.py:182: entry 'pallasopt_entry' reaches no pl.pallas_call", the harness's line)."""
    if e.path != label:
        return e
    return KernelError(e.message, path=kernel.path, line=kernel.last_line if kernel.cut_off else None, hint=e.hint)


def _cut_off(kernel: KernelCode, e: KernelError) -> KernelError:
    """`e`, saying where the reply was cut off when it was (the likely cause of a kernel that does not run)."""
    if not kernel.cut_off:
        return e
    return KernelError(
        f"{e.message}; the LLM reply was cut off after line {kernel.last_line} of {kernel.path} (its ```python block "
        "is never closed), so the kernel may be incomplete",
        path=e.path,
        line=e.line,
        hint="generate the kernel again, or complete the module by hand",
    )


def _input_mismatch(kernel: KernelCode, sw: SuiteWorkload) -> KernelError | None:
    """When a kernel file ships its own `create_inputs` (JAXBench's optimized.py does) and it builds other shapes
    than the task's builder, that is why the kernel fails on the task's inputs: say so instead of the trace error."""
    if "create_inputs" not in top_names(parse_source(kernel.code, kernel.path)):
        return None
    try:
        own = jax.eval_shape(lambda: exec_module(kernel.code, kernel.path).create_inputs())
        theirs = jax.eval_shape(lambda: sw.full_args(*sw.make_inputs(jax.random.key(0))) if sw.full_args else ())
    except Exception:
        return None
    a, b = _shapes(own), _shapes(theirs)
    if a == b:
        return None
    return KernelError(
        f"the kernel file's own create_inputs builds ({', '.join(a)}), the task's builds ({', '.join(b)})",
        path=kernel.path,
        hint="the kernel was written for other inputs: pair it with its own task, or adapt it to these",
    )


DESCRIPTION = (
    "Write a kernel module (entry = a Pallas kernel, reference and inputs = a suite task) that pallasopt can check "
    "and optimize. TASK: a JAXBench workload file or benchmark folder, a KernelBench-style module (JAXBench's "
    "jaxkernelbench/level1|2), or a MaxKernel task folder."
)


def add_import_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `pallasopt import` (the CLI's subcommand and `import_main` share them)."""
    p.add_argument("task", nargs="?", metavar="TASK", help="the task file or folder (the format is detected)")
    p.add_argument(
        "--kernel",
        metavar="KERNEL.py",
        help="a Pallas implementation of the task (plain module or "
        "an LLM reply with ``` fences); default: the task folder's optimized.py / pallas.py",
    )
    p.add_argument("--format", choices=FORMATS, default="auto", help="the task's suite format (default: detect)")
    p.add_argument("--case", default="0", help="MaxKernel: which get_inputs case (N, or 'all': one module each)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.py", help="the kernel module to write")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--dtype", default=None, help="input dtype passed to the suite's builder (JAXBench: bfloat16)")
    p.add_argument(
        "--fix-api",
        action="store_true",
        help="rewrite Pallas names removed since the kernel was "
        "written (pltpu.repeat, TPUCompilerParams, ...) instead of refusing the kernel",
    )
    p.add_argument("--jaxbench", metavar="FILE", help=argparse.SUPPRESS)  # older spelling of TASK --format jaxbench
    p.add_argument("--maxkernel", metavar="DIR", help=argparse.SUPPRESS)  # older spelling, --format maxkernel


def _cases(spec: str, task: Task, dtype: str | None) -> list[int]:
    if spec != "all":
        try:
            n = int(spec)
        except ValueError:
            raise UsageError(f"--case {spec!r} is not a number or 'all'") from None
        if n < 0:
            raise UsageError(f"--case {n} is negative")
        return [n]
    if task.fmt != "maxkernel":
        return [0]
    from .maxkernel import case_count

    return list(range(case_count(read_file(task.path), str(task.path), dtype)))


def import_main(argv: Sequence[str] | None = None) -> int:
    """``pallasopt import TASK [--kernel K] [--format F] [--case N|all] -o OUT.py``; returns the exit code."""
    parser = argparse.ArgumentParser(prog="pallasopt import", description=DESCRIPTION)
    add_import_arguments(parser)
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as e:
        return int(e.code) if isinstance(e.code, int) else int(ExitCode.USAGE)
    return run_import(args)


def run_import(args: argparse.Namespace) -> int:
    """`pallasopt import` with parsed arguments; returns the exit code."""
    try:
        given = [x for x in (args.task, args.jaxbench, args.maxkernel) if x]
        if len(given) != 1:
            raise UsageError("give one TASK (a task file or folder)")
        fmt = "jaxbench" if args.jaxbench else "maxkernel" if args.maxkernel else args.format
        task = locate(given[0], fmt)
        out = Path(args.output)
        if not out.parent.is_dir():
            raise UsageError("no such folder", path=str(out.parent), hint="create it first")
        cases = _cases(args.case, task, args.dtype)
        outs = [out] if len(cases) == 1 else [out.with_name(f"{out.stem}_case{c}{out.suffix}") for c in cases]
        for o in outs:
            if o.exists() and not args.force:
                raise UsageError("already exists", path=str(o), hint="pass --force to overwrite it")
        kernel = Path(args.kernel) if args.kernel else None
        if kernel is not None and not kernel.is_file():
            raise UsageError("no such kernel file", path=str(kernel))
        for c, o in zip(cases, outs, strict=True):
            imported = import_task(task, kernel_path=kernel, case=c, dtype=args.dtype, fix=args.fix_api, out_path=o)
            with o.open("w" if args.force else "x", encoding="utf-8") as f:
                f.write(imported.text)
            _tell(o, task, imported)
    except FileExistsError as e:
        print(f"pallasopt: error: {e.filename}: already exists (pass --force to overwrite it)", file=sys.stderr)
        return int(ExitCode.USAGE)
    except UserError as e:
        print(f"pallasopt: error: {e}", file=sys.stderr)
        return int(e.exit_code)
    return int(ExitCode.OK)


def _tell(out: Path, task: Task, imported: Imported) -> None:
    if imported.stub:
        line = next(i for i, s in enumerate(imported.text.splitlines(), 1) if s.startswith("def pallas_"))
        print(
            f"wrote {out}: a STUB ({task.fmt} task {task.path}; no kernel given and the task ships none): write the "
            f"Pallas kernel at {out}:{line} or pass --kernel KERNEL.py, then `pallasopt check {out}`"
        )
    else:
        dims = f"; CHECK_DIMS {imported.check_dims}" if imported.check_dims else ""
        print(f"wrote {out}: entry {ENTRY_NAME} = {imported.kernel} on the {task.fmt} task {task.path}{dims}")
        print(f"next: pallasopt check {out} && pallasopt run {out} --target v6e")
    for f in imported.fixed:
        print(f"fixed by --fix-api: {f}")
    for note in imported.notes:
        print(f"note: {note}")


__all__ = ["Imported", "KernelError", "import_main", "import_task", "read_kernel"]
