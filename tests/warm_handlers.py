"""A cheap handler for the warm-worker tests (imported in the worker: tests/ is put on its PYTHONPATH)."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any


def handle(request: dict[str, Any]) -> dict[str, Any]:
    op = request["op"]
    if op == "sleep":
        time.sleep(float(request["s"]))
    elif op == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    elif op == "exit":
        sys.exit(3)
    elif op == "oom":
        _ = bytearray(64 * 2**30)
    elif op == "import":  # a user module added to sys.modules must not survive the request
        folder = request["folder"]
        sys.path.insert(0, folder)
        import warm_user_helper  # type: ignore[import-not-found]  # noqa: F401
    elif op == "import_lib":  # a module from a folder on the worker's PYTHONPATH (a TPU host's JAX lives there)
        import warm_pythonpath_lib  # type: ignore[import-not-found]  # noqa: F401
    print("noise on stdout goes to stderr")
    return {"ok": True, "pid": os.getpid(), "modules": sorted(m for m in sys.modules if m.startswith("warm_user"))}
