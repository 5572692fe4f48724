"""Child side of a warm evaluation worker (`harness/warm.py`): serve many requests, one at a time, in one process.

Run as ``python -m pallasopt.harness.warm_serve`` under a `lifeline` guard. Protocol (one JSON document a line):
the first line on stdin is the hello, ``{"handler": "package.module:function", "idle_s": N, "limit_memory": bool}``;
then each line is a request and each reply is one line on stdout (nothing else is written there: fd 1 is pointed
at stderr, so what JAX, libtpu or the user's module prints goes to stderr). A request's ``deadline_s`` (taken out
before the handler sees it) arms ``alarm()``: past it the process dies by SIGALRM even if the parent is hung;
between requests the alarm is the idle limit. The handler answers a dict and never raises (a raise becomes a
``stage: worker`` reply, as in the fresh child).

After each request the modules the user's code added to `sys.modules` (files outside the Python installation and
pallasopt) and the entries it added to `sys.path` are dropped, so the next candidate imports its siblings afresh.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any


def _protected_roots() -> tuple[str, ...]:
    import pallasopt

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.abspath(pallasopt.__file__))}
    return tuple(os.path.abspath(r) + os.sep for r in roots)


def _forget_user_modules(before: set[str], path_before: list[str], roots: tuple[str, ...]) -> None:
    for name in set(sys.modules) - before:
        file = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(file, str) and not os.path.abspath(file).startswith(roots):
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
    roots = _protected_roots()
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
        _forget_user_modules(before, path_before, roots)
        out.write(json.dumps(reply) + "\n")
        out.flush()
        signal.alarm(idle_s)


if __name__ == "__main__":
    main()
