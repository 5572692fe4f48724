"""Import and trace a kernel module in a guarded child before pallasopt's own process touches it.

`analyze`, `apply` and `run` trace the module in-process (the passes need the live module). Before they do,
`preflight_file` imports the file and traces its entry once at the default dims in a child process (`lifeline`:
its own session, a guard between it and us, a memory cap, a deadline). A module that hangs, ends the process
(`os._exit`), kills its parent or crashes the interpreter does so there, and the command stops with one line and
exit 3 (docs/errors.md). Only a module that imported and traced cleanly there is loaded here.

Not covered: a module that behaves differently on a later import (it reads a clock, a counter file, random state)
can still do harm in pallasopt's process after passing the pre-flight.

Child side: ``python -m pallasopt.harness.preflight`` writes what it is doing to ``events`` (``stage import``,
``stage trace``, and the user line of any ``os._exit``/``os.kill`` call, seen through a wrapper and an audit hook)
and, if it runs out of time, its Python stack to ``stack`` (faulthandler), beside its reply.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from typing import Any, TextIO

from ..errors import KernelError, UserError, short
from ..lifeline import SIGNALED, describe_exit, guard_killed, signame
from .subproc import limit_memory, run_child, write_reply

DEFAULT_LOAD_TIMEOUT_S = 120.0
PARENT_SLACK_S = 15.0  # the child dumps its stack and exits at the timeout; we kill it this much later
_FRAME = re.compile(r'^\s*File "(.*)", line (\d+)')


def preflight_file(path: str, timeout_s: float = DEFAULT_LOAD_TIMEOUT_S) -> list[dict[str, Any]]:
    """Read, inspect, import and trace `path` in a guarded child; its traced facts (`CallFacts.to_dict()` form).

    Raises `KernelError` (exit 3) for a bad module: a static problem (found here, without running it), an import
    or trace error, a hang past `timeout_s`, an `os._exit`, a kill of its parent, a crash.
    """
    from ..workload import inspect_source, read_file

    source = read_file(path)
    spec = inspect_source(source, path)
    return preflight_source(source, path, spec.entry, timeout_s)


def preflight_source(source: str, path: str, entry: str, timeout_s: float) -> list[dict[str, Any]]:
    request = {"source": source, "path": path, "timeout_s": timeout_s}
    with tempfile.TemporaryDirectory(prefix="pallasopt-load-") as tmp:
        child = run_child(__name__, request, timeout_s=timeout_s + PARENT_SLACK_S, scratch=tmp)
        events = _read(os.path.join(tmp, "events")).splitlines()
        stack = _read(os.path.join(tmp, "stack"))
    reply = child.reply
    if reply is not None:
        if reply.get("ok"):
            return list(reply.get("calls") or [])
        if reply.get("user_error"):
            raise KernelError(str(reply.get("message")))  # already `FILE:LINE: what (fix)`
        raise RuntimeError(f"loading {path} in a child process failed: {reply.get('message')}")
    raise failure(path, entry, timeout_s, child.status, child.returncode, events, stack, child.message)


def failure(
    path: str,
    entry: str,
    timeout_s: float,
    status: str,
    returncode: int | None,
    events: list[str],
    stack: str,
    message: str,
) -> Exception:
    """The one-line error for a child that gave no reply (pure: every input is plain data)."""
    stage, last = _stage_and_call(events)
    if stage is None:
        return RuntimeError(f"the child process that loads {path} failed before importing it: {message}")
    what = "importing the module" if stage == "import" else f"tracing the entry {entry!r}"
    if status == "timeout" or stack.strip():
        return KernelError(
            f"{what} did not finish in {timeout_s:g} s",
            path=path,
            line=stack_line(stack, path),
            hint="look for blocking work at import or in the entry (sleep, input(), a socket, a long computation); "
            "--load-timeout gives it longer",
        )
    line = int(last[1]) if last and last[1].isdigit() else None
    if guard_killed(returncode):
        return KernelError(
            f"{what} killed its parent process ({signame(-(returncode or 0))})",
            path=path,
            line=line if last and last[0] == "kill" else None,
            hint="the module must not signal other processes; pallasopt ran it in a separate, guarded process",
        )
    if returncode is not None and returncode > SIGNALED:
        return KernelError(
            f"{what} crashed the process ({describe_exit(returncode)})",
            path=path,
            hint=f"run `python {path}` on its own to see the crash",
        )
    code = last[2] if last and last[0] == "exit" and len(last) > 2 else str(returncode)
    return KernelError(
        f"{what} ended the process (os._exit({code})) before it finished",
        path=path,
        line=line if last and last[0] == "exit" else None,
        hint="the file must import on its own without ending the process "
        "(guard scripts with `if __name__ == '__main__':`)",
    )


def stack_line(stack: str, path: str) -> int | None:
    """The innermost line of `path` in a faulthandler dump (most recent call first)."""
    for text in stack.splitlines():
        m = _FRAME.match(text)
        if m and m.group(1) == path:
            return int(m.group(2))
    return None


def _stage_and_call(events: list[str]) -> tuple[str | None, list[str] | None]:
    """The stage the child was in when it last called `os._exit`/`os.kill` (that call), else its last stage.

    The call is what ended the child; it may have run on a little (a killed parent's signal is not instant)."""
    stage: str | None = None
    at_call: tuple[str | None, list[str] | None] = (None, None)
    for e in events:
        parts = e.split()
        if parts[:1] == ["stage"] and len(parts) > 1:
            stage = parts[1]
        elif parts[:1] in (["exit"], ["kill"]):
            at_call = (stage, parts)
    return at_call if at_call[1] is not None else (stage, None)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------------------ child side


def load_and_trace(request: Mapping[str, Any], events: TextIO) -> dict[str, Any]:
    """Import the module and trace its entry at the default dims, as `KernelIR.from_source` would in-process."""
    from ..ir.trace import trace_calls
    from ..workload import load_source

    path = str(request["path"])
    try:
        events.write("stage import\n")
        workload = load_source(str(request["source"]), path)
        events.write("stage trace\n")
        calls = trace_calls(workload)  # its errors, SystemExit included, are KernelErrors
        return {"ok": True, "calls": [c.to_dict() for c in calls]}
    except UserError as e:
        return {"ok": False, "user_error": int(e.exit_code), "message": str(e)}
    except Exception as e:
        return {"ok": False, "message": f"{type(e).__name__}: {short(e)}"}


def watch(events: TextIO, path: str) -> None:
    """Note the user line of any `os._exit`, `os.kill` or `os.killpg` call in `events` before it happens."""

    def user_frame_line() -> int:
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename == path:
                return frame.f_lineno
            frame = frame.f_back  # type: ignore[assignment]
        return 0

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in ("os.kill", "os.killpg"):
            events.write(f"kill {user_frame_line()} {args[0]} {args[1]}\n")

    real_exit = os._exit

    def noted_exit(code: int) -> None:
        events.write(f"exit {user_frame_line()} {code}\n")
        real_exit(code)

    sys.addaudithook(hook)
    os._exit = noted_exit  # type: ignore[assignment]


def main() -> None:
    request = json.loads(sys.stdin.read())
    limit_memory()
    folder = os.path.dirname(str(request["reply_path"]))
    events = open(os.path.join(folder, "events"), "a", buffering=1, encoding="utf-8")  # noqa: SIM115
    stack = open(os.path.join(folder, "stack"), "w", encoding="utf-8")  # noqa: SIM115
    faulthandler.dump_traceback_later(float(request["timeout_s"]), exit=True, file=stack)
    watch(events, str(request["path"]))
    reply = load_and_trace(request, events)
    faulthandler.cancel_dump_traceback_later()
    write_reply(request, reply)


if __name__ == "__main__":
    main()
