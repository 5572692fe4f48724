"""Errors a user can cause, with the exit codes the CLI documents (docs/errors.md).

A `UserError` prints as one line: ``FILE:LINE: what is wrong (what to do)``. Anything else that escapes is our bug.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit codes of the `pallasopt` command."""

    OK = 0
    CHECK_FAILED = 1  # the kernel (or optimized kernel) is not correct
    USAGE = 2  # bad command line: unknown option, pass, target, malformed -p spec
    BAD_KERNEL = 3  # the kernel module cannot be used: syntax, missing entry/reference/make_inputs, trace error
    ENVIRONMENT = 4  # a needed optional piece is missing: libtpu for --compile, ANTHROPIC_API_KEY for --llm
    DATABASE = 5  # the kernel database is corrupted, locked or of a newer schema
    INTERNAL = 70  # a bug in pallasopt (EX_SOFTWARE)


class PallasoptError(Exception):
    """Base of every error pallasopt raises on purpose."""

    exit_code: ExitCode = ExitCode.INTERNAL


class UserError(PallasoptError):
    """A problem in what the user gave us, reported as one line with file, line and fix."""

    exit_code = ExitCode.BAD_KERNEL

    def __init__(
        self, message: str, *, path: str | None = None, line: int | None = None, hint: str | None = None
    ) -> None:
        self.message = one_line(message)
        self.path = path
        self.line = line
        self.hint = one_line(hint) if hint else hint
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.path:
            where = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        tail = f" ({self.hint})" if self.hint else ""
        return f"{where}{self.message}{tail}"


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines too) made one space: a user error prints as one line."""
    return " ".join(text.split())


def short(e: BaseException, limit: int = 300) -> str:
    """An exception's message on one line, cut to `limit` characters."""
    text = one_line(str(e))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class KernelError(UserError):
    """The kernel module is malformed or cannot be traced."""

    exit_code = ExitCode.BAD_KERNEL


class UsageError(UserError):
    """A bad command-line argument, pass spec or target name."""

    exit_code = ExitCode.USAGE


class EnvironmentProblem(UserError):
    """An optional dependency or credential that this request needs is missing."""

    exit_code = ExitCode.ENVIRONMENT


class DatabaseError(UserError):
    """The kernel database cannot be used."""

    exit_code = ExitCode.DATABASE


class PassNotApplicable(PallasoptError):
    """A pass declines to apply here; `reason` says why. A normal outcome, never a bug."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class ProblemChanged(PassNotApplicable):
    """A rewrite that changes what the oracle checks (the reference, the inputs, the tolerance...): a different
    problem, never a kernel rewrite (`Pass.rewrite`). The search records it as a failed candidate."""


def check(cond: object, reason: str) -> None:
    """Decline the current pass with `reason` unless `cond` holds."""
    if not cond:
        raise PassNotApplicable(reason)
