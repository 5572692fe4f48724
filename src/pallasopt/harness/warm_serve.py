"""Child side of a warm evaluation worker (`harness/warm.py`): serve many requests, one at a time, in one process.

Run as ``python -m pallasopt.harness.warm_serve`` under a `lifeline` guard. Protocol (one JSON document a line):
the first line on stdin is the hello, ``{"handler": "package.module:function", "idle_s": N, "limit_memory": bool}``;
then each line is a request and each reply is one line on stdout (nothing else is written there: fd 1 is pointed
at stderr, so what JAX, libtpu or the user's module prints goes to stderr). A request's ``deadline_s`` (taken out
before the handler sees it) arms ``alarm()``: past it the process dies by SIGALRM even if the parent is hung;
between requests the alarm is the idle limit. The handler answers a dict and never raises (a raise becomes a
``stage: worker`` reply, as in the fresh child).

After each request the modules the user's code added to `sys.modules` and the entries it added to `sys.path` are
dropped, so the next candidate imports its siblings afresh. A user module is one whose file lies in the request's
kernel folder or in a folder the request put on `sys.path`, and not in the Python installation, pallasopt, or a folder
that was on `sys.path` when the worker started (PYTHONPATH: where a TPU host's JAX and libtpu may live; importing
those a second time in one process aborts libtpu: "absl::log_internal::SetTimeZone() has already been called").
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any


def _folder(path: str) -> str:
    return os.path.join(os.path.abspath(path), "")


def protected_roots(start_path: list[str], cwd: str) -> frozenset[str]:
    """Folders whose modules a worker keeps: the Python installation, pallasopt, and the `sys.path` entries it started
    with (PYTHONPATH), less the working folder (a kernel's siblings may live there)."""
    import pallasopt

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.abspath(pallasopt.__file__))}
    roots |= {p for p in start_path if p and _folder(p) != _folder(cwd)}
    return frozenset(_folder(r) for r in roots)


def user_folders(request: dict[str, Any], path_before: list[str], path_after: list[str]) -> frozenset[str]:
    """Where the request's own modules live: its kernel's folder and the folders it put on `sys.path`."""
    folders = {p for p in path_after if p and p not in path_before}
    kernel = request.get("path")
    if isinstance(kernel, str) and kernel:
        folders.add(os.path.dirname(os.path.abspath(kernel)))
    return frozenset(_folder(f) for f in folders)


def is_user_module(file: str, users: frozenset[str], roots: frozenset[str]) -> bool:
    """A module file under a user folder and under no protected root (other than a user folder itself)."""
    file = os.path.abspath(file)
    return any(file.startswith(u) for u in users) and not any(file.startswith(r) for r in roots - users)


def _forget_user_modules(
    before: set[str], path_before: list[str], users: frozenset[str], roots: frozenset[str]
) -> None:
    for name in set(sys.modules) - before:
        file = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(file, str) and is_user_module(file, users, roots):
            sys.modules.pop(name, None)
    sys.path[:] = path_before


def _resolve(spec: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    module, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(module), name)
    if not callable(fn):
        raise TypeError(f"{spec} is not callable")
    return fn  # type: ignore[no-any-return]


def main() -> None:
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    stdin = sys.stdin
    hello = json.loads(stdin.readline())
    idle_s = max(1, int(hello.get("idle_s", 600)))
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(idle_s)
    if hello.get("limit_memory"):
        from .subproc import limit_memory

        limit_memory()
    handler = _resolve(str(hello["handler"]))
    roots = protected_roots(list(sys.path), os.getcwd())
    out.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    out.flush()
    for line in stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        signal.alarm(max(1, int(request.pop("deadline_s", idle_s))))
        before, path_before = set(sys.modules), list(sys.path)
        try:
            reply = handler(request)
        except BaseException as exc:  # a bug in the handler: still answer, as the fresh child does
            reply = {"ok": False, "stage": "worker", "error": repr(exc), "error_type": type(exc).__name__}
        signal.alarm(0)
        _forget_user_modules(before, path_before, user_folders(request, path_before, list(sys.path)), roots)
        out.write(json.dumps(reply) + "\n")
        out.flush()
        signal.alarm(idle_s)


if __name__ == "__main__":
    main()
