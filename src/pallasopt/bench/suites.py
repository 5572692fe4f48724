"""External suites for `pallasopt bench`: the tasks of a local JAXBench or MaxKernel checkout that have a Pallas
kernel, imported into kernel modules (`pallasopt import`), with the suite's own recorded times where it ships them.

Layouts (read in aryatschand/JAXBench and AI-Hypercomputer/accelerator-agents):
- JAXBench, `--generated MODEL`: `pallas_eval/generated/MODEL/jaxkernelbench_level{1,2}/<task>.py` (the LLM's
  kernel, KernelBench `Model` format) for the task `jaxkernelbench/level{1,2}/<task>.py`, and
  `pallas_eval/generated/MODEL/priority_kernels/<op>.py` (JAXBench workload format) for
  `priority_kernels/<op>/baseline.py`. `pallas_eval/results/eval_MODEL.json` rows (`name`, `level`, `correct`,
  `original_ms`, `generated_ms`) are v6e wall-clock times with host dispatch (pallas_eval/eval_harness.py: mean of 20
  jitted calls timed with perf_counter around block_until_ready). Only the tasks it marks correct are taken unless
  `all_generated`.
- JAXBench without `--generated`: `benchmark/<id>/` folders with an `optimized.py` and `priority_kernels/<op>/`
  folders with a `pallas.py` or `optimized.py` (the suite's own tuned kernels).
- MaxKernel: task folders holding `reference.py` (anywhere below the folder given); the kernel is the one the task
  folder ships, or `<kernels_from>/<task>/{optimized,pallas,kernel}.py` / `<kernels_from>/<task>.py`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters.tasks import KERNEL_FILES, locate
from ..errors import PallasoptError, UsageError, short

SUITE_TIMES_NOTE = "v6e wall clock incl. host dispatch, mean of 20 calls (JAXBench pallas_eval/eval_harness.py)"


@dataclass(frozen=True)
class SuiteTask:
    """One task of an external suite with the kernel to optimize and what the suite recorded about it."""

    name: str
    task: Path
    kernel: Path | None
    recorded: dict[str, Any] = field(default_factory=dict)
    fmt: str = "auto"  # the task's format where the suite's layout says it


@dataclass(frozen=True)
class ImportedTask:
    """A task after `pallasopt import`: the module written, or why there is none."""

    task: SuiteTask
    module: Path | None
    error: str | None = None
    fixed: tuple[str, ...] = ()


def _eval_rows(root: Path, model: str) -> dict[str, dict[str, Any]]:
    path = root / "pallas_eval" / "results" / f"eval_{model}.json"
    if not path.is_file():
        return {}
    doc = json.loads(path.read_text(encoding="utf-8"))
    rows = doc.get("results", []) if isinstance(doc, dict) else doc
    return {r["name"]: r for r in rows if isinstance(r, dict) and "name" in r}


def jaxbench_tasks(root: Path, generated: str | None = None, *, all_generated: bool = False) -> list[SuiteTask]:
    """The JAXBench tasks with a Pallas kernel (see the module docstring)."""
    if not (root / "pallas_eval").is_dir() and not (root / "benchmark").is_dir():
        raise UsageError("not a JAXBench checkout (no pallas_eval/ or benchmark/)", path=str(root))
    if generated is None:
        out = [
            SuiteTask(d.name, d, d / "optimized.py")
            for d in sorted((root / "benchmark").glob("*/"))
            if (d / "optimized.py").is_file()
        ]
        for d in sorted((root / "priority_kernels").glob("*/")):
            kernel = next((d / n for n in KERNEL_FILES if (d / n).is_file()), None)
            if kernel is not None and (d / "baseline.py").is_file():
                out.append(SuiteTask(f"priority_{d.name}", d, kernel, fmt="jaxbench"))
        return out
    gen = root / "pallas_eval" / "generated" / generated
    if not gen.is_dir():
        raise UsageError(f"no generated kernels for model {generated!r}", path=str(gen))
    recorded = _eval_rows(root, generated)
    out = []
    for kernel in sorted(gen.glob("*/*.py")):
        group, name = kernel.parent.name, kernel.stem
        if group.startswith("jaxkernelbench_"):
            task, fmt = root / "jaxkernelbench" / group.removeprefix("jaxkernelbench_") / f"{name}.py", "kernelbench"
        elif group == "priority_kernels":
            task, fmt = root / "priority_kernels" / name, "jaxbench"
        else:
            continue
        rec = recorded.get(name, {})
        if not all_generated and not rec.get("correct"):
            continue
        times: dict[str, Any] = {k: rec[k] for k in ("original_ms", "generated_ms") if k in rec}
        out.append(SuiteTask(name, task, kernel, times, fmt))
    return out


def maxkernel_tasks(root: Path, kernels_from: Path | None = None) -> list[SuiteTask]:
    """The MaxKernel task folders below `root` that have a kernel (shipped, or in `kernels_from`)."""
    if not root.is_dir():
        raise UsageError("no such folder", path=str(root))
    out = []
    for ref in sorted(root.glob("**/reference.py")):
        d = ref.parent
        kernel = None
        if kernels_from is not None:
            options = [kernels_from / d.name / n for n in KERNEL_FILES] + [kernels_from / f"{d.name}.py"]
            kernel = next((k for k in options if k.is_file()), None)
        if kernel is None:
            try:
                kernel = locate(d, "maxkernel").shipped_kernel
            except PallasoptError:
                continue
        if kernel is not None:
            out.append(SuiteTask(d.name, d, kernel, fmt="maxkernel"))
    return out


def import_tasks(tasks: Sequence[SuiteTask], out_dir: Path, *, fix_api: bool = True) -> list[ImportedTask]:
    """`pallasopt import` each task into `out_dir/<name>.py` (rewritten each time); failures are data."""
    from ..adapters.importer import import_task

    out_dir.mkdir(parents=True, exist_ok=True)
    done = []
    for t in tasks:
        module = out_dir / f"{t.name}.py"
        try:
            imported = import_task(locate(t.task, t.fmt), kernel_path=t.kernel, fix=fix_api, out_path=module)
            if imported.stub:
                raise UsageError("no kernel for this task")
            module.write_text(imported.text, encoding="utf-8")
            done.append(ImportedTask(t, module, fixed=imported.fixed))
        except PallasoptError as e:
            done.append(ImportedTask(t, None, f"import: {short(e, 300)}"))
        except Exception as e:  # a bug in the import of one task must not end the bench
            done.append(ImportedTask(t, None, f"import crashed: {type(e).__name__}: {short(e, 300)}"))
    return done
