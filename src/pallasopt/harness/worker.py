"""Evaluation child process: `python -m pallasopt.harness.worker` reads one JSON request on stdin.

Requests: {"op": "check", "source", "path", "seeds", "dims"} and {"op": "facts", "source", "path", "dims"}.
The reply goes to `reply_path`; a kernel fault becomes an error reply, never a crash of the parent.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

from .subproc import limit_memory, write_reply


def handle(request: dict[str, Any]) -> dict[str, Any]:
    from ..errors import UserError

    if request["op"] == "check_many":
        return {"ok": True, "results": [handle({**request, "op": "check", "source": s}) for s in request["sources"]]}
    from ..workload import load_source

    try:
        workload = load_source(request["source"], request["path"])
        if request["op"] == "check":
            from .oracle import run_check

            seeds = tuple(int(s) for s in request.get("seeds", (1, 2)))
            return run_check(workload, seeds, request.get("dims"))
        if request["op"] == "time":
            from .timing import run_timing

            return run_timing(workload, int(request.get("repeats", 30)))
        if request["op"] == "facts":
            from ..ir.trace import trace_calls

            calls = trace_calls(workload, request.get("dims"))
            return {"ok": True, "calls": [c.to_dict() for c in calls]}
        return {"ok": False, "status": "error", "message": f"unknown op {request['op']!r}"}
    except UserError as e:
        return {"ok": False, "status": "error", "message": str(e), "user_error": int(e.exit_code)}
    except (Exception, SystemExit) as e:
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{f.filename}:{f.lineno}" for f in reversed(tb) if f.filename == request.get("path")), "")
        text = " ".join(str(e).split())[:600]
        return {
            "ok": False,
            "status": "error",
            "message": f"{type(e).__name__}: {text}" + (f" at {where}" if where else ""),
        }


def main() -> None:
    request = json.loads(sys.stdin.read())
    limit_memory()
    write_reply(request, handle(request))


if __name__ == "__main__":
    main()
