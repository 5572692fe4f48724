"""The prompts of the LLM rewrite pass: the rules (system prompt) and one request per attempt.

A request carries the strategy, the current kernel source, the traced facts and the roofline analysis of each
pallas_call, the compiler's verdict when the caller has one, what was already tried on this kernel and how it
failed, and (on a retry) the previous reply's code with the error it hit. It asks for the full module in one
```python block. The text is deterministic for a given kernel and history, so replies can be cached by digest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..cost_model.hardware import Chip
from ..cost_model.roofline import estimate_call, explain
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from .strategies import Strategy

MAX_PREVIOUS_CODE_CHARS = 20_000
MAX_ERROR_CHARS = 1_500

SYSTEM = """\
You are an expert in JAX Pallas kernels for TPU (jax 0.10.2: pl.pallas_call, pl.BlockSpec, pl.ds, pl.when, \
pl.program_id, pl.num_programs, pltpu.VMEM scratch, pltpu.CompilerParams(dimension_semantics=..., \
vmem_limit_bytes=...), pl.Buffered). You rewrite one kernel module to make it faster on the target TPU while \
computing exactly the same result.

Rules (a reply that breaks one is rejected without being run):
- Reply with the FULL module, ready to save as a file, in exactly one ```python code block. Text outside the \
block is ignored.
- Keep `reference`, `make_inputs`, `hand_tuned`, `TOLERANCE`, `CHECK_DIMS` and `ENTRY` byte-identical to the \
original (copy them verbatim; do not add the ones that are absent). Keep the entry's name and arguments.
- The entry must still compute its result through pl.pallas_call. Never call or import `reference` or \
`hand_tuned`, never import the module itself.
- Do not set `interpret=` and do not use interpret-mode switches: the tool decides how the kernel runs.
- No file or network access, no eval/exec, no `global` state, no caches of results between calls; only new \
imports from jax, numpy, math, functools, itertools, operator, typing, dataclasses, collections.
- Block shapes must respect the TPU rule: the last two block dims are multiples of (8, 128) or the full array \
dims. Keep grid extents integral for the default problem size and for CHECK_DIMS.
- The result is checked against `reference` in interpret mode at CHECK_DIMS on random inputs, then timed at the \
default dims of make_inputs.
"""


@dataclass(frozen=True)
class AttemptRecord:
    """One failed attempt: the stage it failed at, the error, and the code of the reply (if it had code)."""

    stage: str  # "format" | "validation" | "trace" | "correctness" | "unchanged" | "request"
    error: str
    code: str = ""


def describe_call(call: CallFacts) -> str:
    """The traced facts of one pallas_call as a few lines of plain text."""
    lines = [
        f"pallas_call #{call.index}: grid {call.grid} ({call.steps} steps), "
        f"dimension_semantics {call.dimension_semantics or 'default'}, "
        f"vmem_limit_bytes {call.vmem_limit_bytes or 'default'}"
    ]
    for o in call.operands:
        block = "x".join("-" if b is None else str(b) for b in o.block_shape)
        buffers = f", Buffered({o.buffer_count})" if o.buffer_count else ""
        lines.append(
            f"  {o.name}: {o.dtype}{list(o.shape)} block ({block}) in {o.memory_space}{buffers}; "
            f"block index {_index_map_text(o.index_map.affine, len(call.grid))}"
        )
    for s in call.scratch:
        lines.append(f"  scratch: {s.dtype}{list(s.shape)} in {s.memory_space}")
    b = call.body
    dots = ", ".join(f"{d.m}x{d.k} @ {d.k}x{d.n} ({d.lhs_dtype}->{d.out_dtype}, x{d.count})" for d in b.dots)
    lines.append(
        f"  body per step: matmuls [{dots or 'none'}]; {b.vpu_elems} VPU element-ops; "
        f"{b.transcendental_elems} transcendental; loads {b.load_bytes} B, stores {b.store_bytes} B"
    )
    lines.append(f"  primitives: {', '.join(b.primitives)}")
    revisited = call.revisited_axes()
    if revisited:
        lines.append(f"  reduction (revisited) grid axes: {revisited}")
    return "\n".join(lines)


def _index_map_text(affine: tuple[tuple[int, ...], ...] | None, n_grid: int) -> str:
    if affine is None:
        return "non-affine"
    names = [f"g{i}" for i in range(n_grid)]
    parts = []
    for row in affine:
        terms = [f"{c}*{n}" if c != 1 else n for c, n in zip(row[:-1], names, strict=False) if c]
        if row[-1] or not terms:
            terms.append(str(row[-1]))
        parts.append(" + ".join(terms))
    return f"({', '.join(parts)})"


def build_prompt(
    ir: KernelIR,
    strategy: Strategy,
    chip: Chip,
    *,
    attempt: int,
    max_attempts: int,
    previous: Sequence[AttemptRecord] = (),
    tried: Sequence[str] = (),
    notes: str | None = None,
) -> str:
    """The request for one attempt (1-based) at rewriting `ir` with `strategy` for `chip`."""
    parts = [
        f"Strategy: {strategy.name}",
        f"Attempt {attempt} of {max_attempts}",
        f"Target: TPU {chip.name}",
        "",
        "## What to do",
        strategy.what,
        "",
        "## When it helps",
        strategy.when,
        "",
        f"## The kernel module ({Path(ir.path).name}, entry `{ir.entry}`, default dims {dict(ir.dims)})",
        "```python",
        ir.source.rstrip("\n"),
        "```",
        "",
        "## Traced facts (at the default dims)",
        *(describe_call(c) for c in ir.calls),
        "",
        "## Roofline analysis",
        *(f"call {c.index}: {explain(estimate_call(c, chip), chip)}" for c in ir.calls),
    ]
    if notes:
        parts += ["", "## Compiler verdict", notes.strip()]
    if tried:
        parts += ["", "## Already tried on this kernel (do not repeat these)", *(f"- {t}" for t in tried)]
    if previous:
        parts += ["", "## Your previous attempts at this request failed"]
        for i, rec in enumerate(previous, 1):
            parts.append(f"- attempt {i}: {rec.stage} failed: {_clip(rec.error, MAX_ERROR_CHARS)}")
        last = previous[-1]
        if last.code:
            parts += [
                "",
                "The code of the last attempt:",
                "```python",
                _clip(last.code.rstrip("\n"), MAX_PREVIOUS_CODE_CHARS),
                "```",
                "Fix the error above; keep what was right.",
            ]
    parts += [
        "",
        f"Rewrite the module following the strategy `{strategy.name}`. If the strategy cannot help this kernel, "
        "say why in one sentence and reply with the module unchanged. Reply with the full module in one "
        "```python block.",
    ]
    return "\n".join(parts) + "\n"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 20] + " ... [truncated]"
