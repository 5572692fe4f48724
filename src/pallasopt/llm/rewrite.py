"""The self-debugging rewrite loop: ask, validate, trace in a child process, check with the oracle; retry on error.

Each attempt that fails at any stage (format, validation, trace, correctness) is fed back into the next request.
The loop stops at the first verified module, after `max_attempts`, when the reply is the kernel unchanged (the
model says the strategy does not help), or early when the same error comes back twice (compared after
normalization: numbers, paths and spacing do not count).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import KernelError
from ..ir.kernel_ir import KernelIR, source_digest
from .client import LLMError
from .isolated import ir_from_source_isolated
from .prompt import SYSTEM, AttemptRecord, build_prompt
from .session import LLMSession
from .strategies import Strategy
from .validate import ReplyFormatError, extract_module, validate


@dataclass(frozen=True)
class RewriteOutcome:
    """The verified IR (or None), every failed attempt, and why the loop stopped."""

    ir: KernelIR | None
    attempts: tuple[AttemptRecord, ...]
    stop: str  # "verified" | "unchanged" | "repeated error" | "attempts exhausted" | "request failed"

    def reason(self) -> str:
        """One line for a declined pass."""
        if self.ir is not None:
            return "verified"
        last = self.attempts[-1] if self.attempts else None
        detail = f": {last.stage} failed: {_one_line(last.error)[:300]}" if last else ""
        return f"{self.stop} after {len(self.attempts)} attempt(s){detail}"


_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
_PATH = re.compile(r"(?:[A-Za-z]:)?[\w./\\-]*\.py(?::\d+)?")


def normalize_error(message: str) -> str:
    """An error message with numbers, file paths and spacing erased, for 'the same error again' checks."""
    text = _PATH.sub("<path>", message.lower())
    text = re.sub(r"0x[0-9a-f]+", "#", text)
    text = _NUMBER.sub("#", text)
    return " ".join(text.split())


def rewrite(ir: KernelIR, strategy: Strategy, session: LLMSession, applied: str) -> RewriteOutcome:
    """Run the loop for `ir`; `applied` is the pass spec recorded in the new IR's recipe."""
    attempts: list[AttemptRecord] = []
    stop = "attempts exhausted"
    for n in range(1, session.max_attempts + 1):
        prompt = build_prompt(
            ir,
            strategy,
            session.chip,
            attempt=n,
            max_attempts=session.max_attempts,
            previous=attempts,
            tried=session.tried(ir.digest),
            notes=session.notes(ir) if session.notes is not None else None,
        )
        try:
            reply = session.complete(SYSTEM, prompt)
        except LLMError as e:
            attempts.append(AttemptRecord("request", str(e)))
            stop = "request failed"
            break
        record, new_ir = _evaluate(ir, reply.text, session, applied)
        if new_ir is not None:
            return RewriteOutcome(new_ir, tuple(attempts), "verified")
        assert record is not None
        attempts.append(record)
        if record.stage == "unchanged":
            stop = "unchanged"
            break
        if len(attempts) >= 2 and normalize_error(attempts[-1].error) == normalize_error(attempts[-2].error):
            stop = "repeated error"
            break
    outcome = RewriteOutcome(None, tuple(attempts), stop)
    session.note_tried(ir.digest, f"{strategy.name}: {outcome.reason()}")
    return outcome


def _evaluate(
    ir: KernelIR, text: str, session: LLMSession, applied: str
) -> tuple[AttemptRecord | None, KernelIR | None]:
    """One reply through format, validation, isolated trace and the oracle: (failure, None) or (None, new IR)."""
    try:
        code = extract_module(text)
    except ReplyFormatError as e:
        return AttemptRecord("format", str(e)), None
    if source_digest(code) == ir.digest:
        return AttemptRecord("unchanged", "the reply is the kernel unchanged", code), None
    reasons = validate(ir.source, code, ir.path)
    if reasons:
        return AttemptRecord("validation", "; ".join(reasons), code), None
    try:
        new_ir = ir_from_source_isolated(code, ir.path, (*ir.recipe, applied), dims=ir.dims)
    except KernelError as e:
        return AttemptRecord("trace", _one_line(e.message), code), None
    verdict = session.checker(code, ir.path)
    if not verdict.ok:
        return AttemptRecord("correctness", f"{verdict.status}: {_one_line(verdict.message)}", code), None
    return None, new_ir


def _one_line(text: str) -> str:
    return " ".join(text.split())
