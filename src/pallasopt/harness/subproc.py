"""Run one evaluation in a child process with a wall-clock timeout; a hang or a crash becomes a result."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import child_env, read_env
from ..lifeline import child_command, deadline_for, describe_exit, kill_group, spawned

DEFAULT_MEMORY_LIMIT = 12 * 2**30  # bytes of address space the child may map beyond what JAX reserves


@dataclass(frozen=True)
class ChildResult:
    """What a child run gave back: its JSON reply, or why there is none."""

    reply: dict[str, Any] | None
    status: str  # "ok" | "timeout" | "crash"
    message: str
    wall_s: float
    returncode: int | None = None  # the guard's (lifeline.describe_exit); None when it was killed on timeout


def run_child(
    module: str,
    request: Mapping[str, Any],
    *,
    timeout_s: float,
    extra_env: Mapping[str, str] | None = None,
    scratch: str | None = None,
) -> ChildResult:
    """Run `python -m module` with `request` as JSON; the child writes its reply to the file named in the request.

    The child runs under a `lifeline` guard: it dies with this process and by itself `DEADLINE_GRACE_S` after
    `timeout_s`; code in it that kills its parent kills the guard, not us. `scratch`, when given, is the folder for
    the reply (the caller reads other files the child leaves there); else a temporary one.
    """
    python = read_env().python or sys.executable
    with contextlib.ExitStack() as stack:
        tmp = scratch or stack.enter_context(tempfile.TemporaryDirectory(prefix="pallasopt-"))
        reply_path = os.path.join(tmp, "reply.json")
        payload = dict(request, reply_path=reply_path)
        start = time.perf_counter()
        argv = child_command(python, module, deadline_for(timeout_s))
        with spawned(argv, child_env(extra_env), **_PIPES) as proc:
            try:
                _out, err = proc.communicate(json.dumps(payload), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                kill_group(proc)
                proc.communicate()
                wall = time.perf_counter() - start
                return ChildResult(None, "timeout", f"timed out after {timeout_s:.0f} s", wall, None)
        wall = time.perf_counter() - start
        if os.path.exists(reply_path):
            with open(reply_path, encoding="utf-8") as f:
                try:
                    return ChildResult(json.load(f), "ok", "", wall, proc.returncode)
                except json.JSONDecodeError:
                    pass
        code = proc.returncode
        tail = "\n".join((err or "").strip().splitlines()[-5:])
        message = f"evaluation process died ({describe_exit(code)})" + (f": {tail}" if tail else "")
        return ChildResult(None, "crash", message, wall, code)


_PIPES: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}


def write_reply(request: Mapping[str, Any], reply: Mapping[str, Any]) -> None:
    """Child side: write the reply atomically where the parent looks for it."""
    path = str(request["reply_path"])
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(reply, f)
    os.replace(tmp, path)


def limit_memory(limit_bytes: int = DEFAULT_MEMORY_LIMIT) -> None:
    """Child side: cap the data segment so a runaway allocation fails inside the child, not the machine."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes))
    except (ImportError, ValueError, OSError):
        pass
