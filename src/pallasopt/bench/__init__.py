"""`pallasopt bench`: optimize every kernel of a suite (bench/kernels) and summarize what the optimizer achieved.

Per kernel: `optimize(...)` (no output file; one kernel database per suite, so an interrupted bench resumes), plus
the compiler's estimate of the module's XLA `reference` and, where the module defines one, of its `hand_tuned`
kernel. Writes `<out>/<target>-<date>[-quick].json`, a Markdown table (`.md`) and a bar plot (`.png`) after every
kernel. Each time carries its tier: "model" (roofline), "compiler" (libtpu's static schedule with an HBM floor, no
TPU) or "hardware" (measured on the target chip). Ratios are only formed between times of the same tier.

Modules: `rows` (Row, Estimate, summary math), `estimate` (CompilerEstimator), `render` (Markdown, plot, result
files), `runner` (the suite runner and the command).
"""

from __future__ import annotations

from .estimate import ESTIMATE_VERSION, CompilerEstimator, Estimator, loop_trips
from .render import TIER_TAG, plot_speedups, render_markdown, summary_lines, write_results
from .rows import FAST_P, Estimate, Row, effective_speedup, fast_p, geomean, summarize
from .runner import (
    ADD_BENCH,
    QUICK_KERNELS,
    QUICK_SEARCH,
    SUITE_SEARCH,
    Progress,
    bench_kernel,
    cmd_bench,
    find_kernels,
    machine,
    main,
    run_suite,
)

__all__ = [
    "ADD_BENCH",
    "ESTIMATE_VERSION",
    "FAST_P",
    "QUICK_KERNELS",
    "QUICK_SEARCH",
    "SUITE_SEARCH",
    "TIER_TAG",
    "CompilerEstimator",
    "Estimate",
    "Estimator",
    "Progress",
    "Row",
    "bench_kernel",
    "cmd_bench",
    "effective_speedup",
    "fast_p",
    "find_kernels",
    "geomean",
    "loop_trips",
    "machine",
    "main",
    "plot_speedups",
    "render_markdown",
    "run_suite",
    "summarize",
    "summary_lines",
    "write_results",
]
