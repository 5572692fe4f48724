"""Which suite a task file or folder belongs to, which kernel goes with it, and loading it as a SuiteWorkload."""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import KernelError, UsageError
from ..workload import read_file
from ._common import SuiteWorkload, parse_source, top_names
from .jaxbench import jaxbench_from_source
from .kernel_source import find_task_drift, fix_task_api
from .kernelbench import kernelbench_from_source
from .maxkernel import maxkernel_from_source

FORMATS = ("auto", "jaxbench", "kernelbench", "maxkernel")
KERNEL_FILES = ("optimized.py", "pallas.py", "kernel.py")  # a task folder's own Pallas implementation


@dataclass(frozen=True)
class Task:
    """A suite task: its format, the file holding its reference and inputs, and the kernel file shipped beside it."""

    fmt: str  # jaxbench | kernelbench | maxkernel
    path: Path  # the reference file (baseline.py, reference.py, or the KernelBench module)
    shipped_kernel: Path | None  # optimized.py / pallas.py / a sibling defining `computation`


def format_of_source(source: str, path: str) -> str | None:
    """The suite format a module's top-level names say it is (None: none of them)."""
    names = top_names(parse_source(source, path))
    if "Model" in names and "get_inputs" in names and "get_init_inputs" in names:
        return "kernelbench"
    if "create_inputs" in names and "workload" in names:
        return "jaxbench"
    if "get_inputs" in names and "computation" in names:
        return "maxkernel"
    return None


def kernel_kind(source: str, path: str) -> str:
    """How a kernel module is called: ``model`` (Model.forward), ``workload`` or ``computation``."""
    names = top_names(parse_source(source, path))
    if isinstance(names.get("Model"), ast.ClassDef):
        return "model"
    for kind in ("workload", "computation"):
        if kind in names:
            return kind
    raise KernelError(
        "the kernel file defines none of `class Model`, `workload`, `computation`",
        path=path,
        line=1,
        hint="a KernelBench kernel defines Model (with forward), a JAXBench one workload, a MaxKernel one computation",
    )


def locate(task: str | Path, fmt: str = "auto") -> Task:
    """Find the task's reference file and shipped kernel; detect the format unless given."""
    p = Path(task)
    if not p.exists():
        raise UsageError("no such file or folder", path=str(p), hint="pass a task file or folder")
    if p.is_dir():
        found_ref = next(
            ((p / n, g) for n, g in (("baseline.py", "jaxbench"), ("reference.py", "maxkernel")) if (p / n).is_file()),
            None,
        )
        if found_ref is None:
            raise UsageError(
                "no baseline.py (JAXBench) or reference.py (MaxKernel) in this folder",
                path=str(p),
                hint="pass a task file, or a JAXBench benchmark folder or MaxKernel task folder",
            )
        ref, guess = found_ref
    else:
        ref, guess = p, None
    found = format_of_source(read_file(ref), str(ref))
    detected = found or guess
    if fmt == "auto":
        if detected is None:
            raise KernelError(
                "not a task file of a known suite",
                path=str(ref),
                line=1,
                hint="JAXBench defines CONFIG/create_inputs/workload, KernelBench Model/get_inputs/get_init_inputs, "
                "MaxKernel get_inputs/computation; or pass --format",
            )
        fmt = detected
    elif detected is not None and detected != fmt:
        raise UsageError(f"--format {fmt}, but the file looks like a {detected} task", path=str(ref))
    return Task(fmt, ref, _shipped_kernel(ref, fmt))


def _shipped_kernel(ref: Path, fmt: str) -> Path | None:
    if ref.name not in ("baseline.py", "reference.py"):
        return None
    for name in KERNEL_FILES:
        if (ref.parent / name).is_file():
            return ref.parent / name
    if fmt == "maxkernel":
        others = [f for f in sorted(ref.parent.glob("*.py")) if f != ref and format_of_kernel_safe(f) == "computation"]
        return others[0] if len(others) == 1 else None
    return None


def format_of_kernel_safe(path: Path) -> str | None:
    try:
        return kernel_kind(read_file(path), str(path))
    except KernelError:
        return None


def load_task(
    task: Task, *, case: int = 0, dtype: str | None = None, survey: bool = True, fix: bool = False
) -> SuiteWorkload:
    """The task as reference + inputs (`dtype`: what the suite's harness passes to its builder). `fix`: jax.numpy
    keywords removed since the task was written renamed first (`kernel_source.fix_task_api`, said in its notes)."""
    source, path = read_file(task.path), str(task.path)
    if fix:
        source, done = fix_task_api(source)
        sw = _load_source(task, source, path, case=case, dtype=dtype, survey=survey)
        notes = tuple(f"fixed in the task by --fix-api: {d.describe()}" for d in done)
        return replace(sw, notes=(*notes, *sw.notes))
    sw = _load_source(task, source, path, case=case, dtype=dtype, survey=survey)
    drift = find_task_drift(source)
    if drift:
        hint = f"the task passes {drift[0].describe()}: `pallasopt import --fix-api` renames it"
        return replace(sw, notes=(*sw.notes, hint))
    return sw


def _load_source(task: Task, source: str, path: str, *, case: int, dtype: str | None, survey: bool) -> SuiteWorkload:
    name = task.path.parent.name if task.path.name in ("baseline.py", "reference.py") else task.path.stem
    if task.fmt == "jaxbench":
        return jaxbench_from_source(source, path, dtype=dtype or "bfloat16", survey=survey)
    if task.fmt == "maxkernel":
        return maxkernel_from_source(source, path, name=name, dtype=dtype, case=case, survey=survey)
    if task.fmt == "kernelbench":
        return kernelbench_from_source(source, path, name=name, survey=survey)
    raise UsageError(f"unknown format {task.fmt!r} (known: {', '.join(FORMATS)})")
