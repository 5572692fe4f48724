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
            "message": cpu_backend_limit(text) or f"{type(e).__name__}: {text}" + (f" at {where}" if where else ""),
        }


def cpu_backend_limit(text: str) -> str:
    """What to say when XLA's CPU backend, not the module, failed ("" otherwise). jaxlib 0.10.2's CPU dot runs a
    bf16 x bf16 -> f32 dot_general only with the canonical contracting dims: `jnp.einsum("ijz,zc->cij", x, w,
    preferred_element_type=jnp.float32)` on bf16 fails there ("Unsupported element type for DotThunk::Execute") and runs
    on a TPU. The module is not shown wrong; it cannot be run on this machine as written."""
    if "Unsupported element type for DotThunk" not in text:
        return ""
    return (
        "XLA's CPU backend cannot run a bf16 x bf16 -> f32 dot_general of this module (jaxlib's CPU dot takes only "
        "the canonical contracting dims in bf16), so it cannot be checked on this machine: write that contraction "
        "as jnp.dot(...) followed by jnp.transpose (which XLA folds into the dot's layout on TPU), or in float32"
    )


def main() -> None:
    request = json.loads(sys.stdin.read())
    limit_memory()
    write_reply(request, handle(request))


if __name__ == "__main__":
    main()
