"""Durability: kill -9 a real `pallasopt run` repeatedly and check the kernel DB loses no committed evaluation.

    python bench/kill_test.py [--kernel examples/softmax.py] [--kills 4] [--after 12] [--executor ray [--ray-address A]]

Each round starts `pallasopt run` on the same DB, SIGKILLs it `--after` seconds in, then opens the DB: it must pass
`PRAGMA quick_check`, and every evaluation seen after an earlier round must still be there (counts never go down,
ids are kept). A final uninterrupted run must finish, and its evaluations are a superset of all earlier ones.

With `--executor ray` each run's evaluations are Ray tasks: on the cluster at `--ray-address`, else on a local
loopback-only Ray instance this script starts once (2 CPUs) and keeps across the kills, so only the driver dies.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def evaluation_ids(db: Path) -> set[tuple[int, str, str]]:
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA quick_check").fetchone()[0] == "ok"
        return {tuple(r) for r in con.execute("SELECT candidate_id, tier, key FROM evaluations")}  # type: ignore[misc]
    finally:
        con.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernel", default="examples/softmax.py")
    ap.add_argument("--kills", type=int, default=4)
    ap.add_argument("--after", type=float, default=12.0)
    ap.add_argument("--executor", choices=("local", "ray"), default="local")
    ap.add_argument("--ray-address", default=None, help="with --executor ray: a running cluster (else a local one)")
    args = ap.parse_args()
    executor: list[str] = []
    if args.executor == "ray":
        address = args.ray_address or _local_cluster()
        executor = ["--executor", "ray", "--ray-address", address]
    tmp = Path(tempfile.mkdtemp(prefix="pallasopt-kill-"))
    kernel = tmp / Path(args.kernel).name
    kernel.write_text(Path(args.kernel).read_text())
    db = tmp / "k.db"
    cmd = [sys.executable, "-m", "pallasopt.cli", "run", str(kernel), "--beam", "4", "--depth", "3", "--no-compile",
           "--db", str(db), "--json", "--resume", *executor]
    seen: set[tuple[int, str, str]] = set()
    lost_total = 0
    for i in range(args.kills):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(args.after + i)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        now = evaluation_ids(db) if db.exists() else set()
        lost = seen - now
        lost_total += len(lost)
        print(f"kill {i + 1}: {len(now)} evaluations in the DB, {len(lost)} lost, quick_check ok", flush=True)
        seen |= now
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    final = evaluation_ids(db)
    lost_total += len(seen - final)
    print(f"final run: exit {done.returncode}, {len(final)} evaluations, {time.perf_counter() - start:.1f} s")
    print(f"runs killed: {args.kills}; evaluations lost: {lost_total}")
    return 0 if lost_total == 0 and done.returncode == 0 else 1


def _local_cluster() -> str:
    """Start a loopback-only Ray instance owned by this script (it lives until the script exits)."""
    from pallasopt.config import RAY_LOCAL_ENV

    os.environ.update(RAY_LOCAL_ENV)
    import ray

    ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    return str(ctx.address_info["address"])


if __name__ == "__main__":
    raise SystemExit(main())
