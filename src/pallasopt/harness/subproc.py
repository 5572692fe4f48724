"""Run one evaluation in a child process with a wall-clock timeout; a hang or a crash becomes a result."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import child_env, read_env

DEFAULT_MEMORY_LIMIT = 12 * 2**30  # bytes of address space the child may map beyond what JAX reserves


@dataclass(frozen=True)
class ChildResult:
    """What a child run gave back: its JSON reply, or why there is none."""

    reply: dict[str, Any] | None
    status: str  # "ok" | "timeout" | "crash"
    message: str
    wall_s: float


def run_child(
    module: str,
    request: Mapping[str, Any],
    *,
    timeout_s: float,
    extra_env: Mapping[str, str] | None = None,
) -> ChildResult:
    """Run `python -m module` with `request` as JSON; the child writes its reply to the file named in the request."""
    python = read_env().python or sys.executable
    with tempfile.TemporaryDirectory(prefix="pallasopt-") as tmp:
        reply_path = os.path.join(tmp, "reply.json")
        payload = dict(request, reply_path=reply_path)
        start = time.perf_counter()
        proc = subprocess.Popen(
            [python, "-m", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(extra_env),
            start_new_session=True,
            text=True,
        )
        try:
            _out, err = proc.communicate(json.dumps(payload), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return ChildResult(None, "timeout", f"timed out after {timeout_s:.0f} s", time.perf_counter() - start)
        wall = time.perf_counter() - start
        if os.path.exists(reply_path):
            with open(reply_path, encoding="utf-8") as f:
                try:
                    return ChildResult(json.load(f), "ok", "", wall)
                except json.JSONDecodeError:
                    pass
        code = proc.returncode
        why = f"killed by signal {-code}" if code < 0 else f"exit code {code}"
        tail = "\n".join((err or "").strip().splitlines()[-5:])
        return ChildResult(None, "crash", f"evaluation process died ({why}): {tail}", wall)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


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
