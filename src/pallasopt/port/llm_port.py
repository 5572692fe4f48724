"""The LLM path for kernels the rules decline (`pallasopt port --llm`).

Same pieces as the LLM passes (src/pallasopt/llm/): the session's client and reply cache (the kernel database),
`extract_module` and `validate` on the reply, and the session's checker (the oracle, in a child process with
limits) before anything is written. The prompt carries the Triton source, the reference module and the rule
translator's partial output (or, when the rules ported nothing, a skeleton holding the reference), with each decline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..llm.session import LLMSession
from ..llm.validate import ReplyFormatError, extract_module, validate

SYSTEM = """\
You port Triton GPU kernels to JAX Pallas TPU kernels (jax 0.10.2: pl.pallas_call, pl.BlockSpec, pl.program_id, \
pltpu.VMEM scratch, pltpu.CompilerParams(dimension_semantics=...)). You receive the Triton source with its launcher, \
the reference module (`reference`, `make_inputs`), and a partial module from a rule-based translator with the \
constructs it declined. Reply with the FULL kernel module in exactly one ```python block:
- keep everything after the line `# ---- reference:` byte-identical (reference, make_inputs, STATIC_ARGS, OUTPUTS, \
CHECK_DIMS, TOLERANCE), keep ENTRY and the entry's name and arguments;
- the entry computes its result through pl.pallas_call; never call `reference`; never set `interpret=`;
- no torch, no triton imports; only jax, numpy, math, functools, itertools, operator, typing, dataclasses;
- block shapes respect the TPU rule: the last two block dims are multiples of (8, 128) or the full array dims;
- atomics become a reduction over an "arbitrary" grid axis or a second pass; GPU-only details (warps, PTX, \
cache modifiers) are dropped.
"""


@dataclass(frozen=True)
class LLMPort:
    source: str | None  # the checked module, or None when every attempt failed
    attempts: tuple[str, ...]  # one line per attempt: "ok" or why it was rejected


def skeleton(ref_path: str, ref_text: str, launcher: str) -> str:
    """A module with the reference and a placeholder entry, when the rules ported nothing."""
    return (
        f'"""Placeholder: the rules declined every kernel of launcher {launcher}."""\n\n'
        "from jax.experimental import pallas as pl\n\n\n"
        'ENTRY = "ported"\n\n\ndef ported(*args):\n    raise NotImplementedError("to be ported")\n'
        "    return pl.pallas_call(None)(*args)  # where the port goes\n\n\n"
        f"# ---- reference: {ref_path} (verbatim) ----\n{ref_text}"
    )


def prompt(triton_path: str, triton_text: str, partial: str, declines: Sequence[str], error: str | None) -> str:
    parts = [
        f"Triton source ({triton_path}):\n```python\n{triton_text}```",
        "What the rule translator declined:\n" + "\n".join(f"- {d}" for d in declines),
        f"The rule translator's partial module (complete it; keep its reference part verbatim):\n```python\n{partial}```",
    ]
    if error:
        parts.append(f"Your previous reply was rejected: {error}\nSend a corrected full module.")
    return "\n\n".join(parts) + "\n"


def llm_port(
    session: LLMSession, triton_path: str, triton_text: str, partial: str, declines: Sequence[str], out_path: str
) -> LLMPort:
    """Ask the session's model for the module, validate and check each reply; up to `session.max_attempts`."""
    attempts: list[str] = []
    error: str | None = None
    for _ in range(max(1, session.max_attempts)):
        reply = session.complete(SYSTEM, prompt(triton_path, triton_text, partial, declines, error))
        try:
            candidate = extract_module(reply.text)
        except ReplyFormatError as e:
            error = str(e)
            attempts.append(f"rejected: {error}")
            continue
        reasons = validate(partial, candidate, out_path)
        if reasons:
            error = "; ".join(reasons)
            attempts.append(f"rejected: {error}")
            continue
        verdict = session.checker(candidate, out_path)
        if verdict.ok:
            attempts.append("ok")
            return LLMPort(candidate, tuple(attempts))
        error = f"the oracle says {verdict.status}: {verdict.message}"
        attempts.append(f"rejected: {error}")
    return LLMPort(None, tuple(attempts))
