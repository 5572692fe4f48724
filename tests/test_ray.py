"""The Ray executor on a local, loopback-only Ray cluster started once for this module (2 CPUs): the same search
as the local executor (same evaluations in the DB, same result), a worker killed mid-task (retried, or recorded as
failed), the driver killed mid-run and resumed (no finished evaluation lost). The compile and check child processes
are the cheap fakes of ray_jobs.py; the tiers, jobs, executors and DB are the real ones."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray_jobs
from conftest import ROOT

from pallasopt.config import RAY_LOCAL_ENV
from pallasopt.executors import Job, Needs
from pallasopt.executors.local import LocalExecutor

MATMUL = ROOT / "examples" / "matmul.py"
TESTS = ROOT / "tests"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    log = tmp_path_factory.mktemp("jobs") / "jobs.log"
    saved = dict(os.environ)
    os.environ.update(RAY_LOCAL_ENV)  # before Ray is imported: every Ray process binds 127.0.0.1
    os.environ["PALLASOPT_TEST_JOB_LOG"] = str(log)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    import ray

    ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    from pallasopt.executors.ray_cluster import RayExecutor

    ex = RayExecutor(None)  # joins the module's cluster (already initialized): close() leaves it running
    try:
        yield ex, ctx.address_info["address"], log
    finally:
        ray.shutdown()
        os.environ.clear()
        os.environ.update(saved)


def _evaluations(db: Path) -> dict[tuple[str, str, str], tuple[int, dict]]:
    """(candidate source digest, tier, key) -> (ok, result without wall times) for every evaluation."""
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT c.source, e.tier, e.key, e.ok, e.result_json FROM evaluations e JOIN candidates c ON c.id=e.candidate_id"
    ).fetchall()
    con.close()
    out = {}
    for source, tier, key, ok, result in rows:
        r = json.loads(result)
        for d in (r, r.get("data") or {}, (r.get("data") or {}).get("report") or {}):
            d.pop("wall_s", None)
            d.pop("compile_s", None)
        out[(ray_jobs.sha(source), tier, key)] = (ok, r)
    return out


def _kernel(tmp_path: Path) -> str:
    k = tmp_path / "matmul.py"
    k.write_text(MATMUL.read_text())
    return str(k)


LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}  # /proc/net hex


def _descendants() -> set[int]:
    parents = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def _not_loopback() -> list[str]:
    """Every inet socket of this process's descendants (the Ray processes) bound or connected off loopback; a
    listener on all interfaces (0.0.0.0, ::) counts as off loopback."""
    inodes = set()
    for pid in _descendants():
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                link = os.readlink(fd)
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            pass
    bad, seen = [], 0
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[9] not in inodes:
                continue
            seen += 1
            local, remote = f[1].split(":")[0], f[2].split(":")[0]
            if local not in LOOPBACK or not (remote in LOOPBACK or set(remote) == {"0"}):
                bad.append(f"{table} {f[1]} -> {f[2]}")
    assert seen > 0, "found no socket of the Ray processes: the check would be empty"
    return bad


def test_ray_processes_use_loopback_only(cluster) -> None:
    from pallasopt.cost_model.hardware import get_chip
    from pallasopt.search.tiers import Tiers

    ex, _, _ = cluster
    assert ex.slots() == 2 and ex.unavailable(Needs(cpus=1)) is None
    assert _not_loopback() == []
    why = Tiers(get_chip("v5e"), executor=ex).unavailable("hardware")  # no host of this cluster has a v5e
    assert why is not None and "TPU, v5e" in why
    opts = ex.options(Job("time", ray_jobs.noop, {}, 1.0, ray_jobs.lost, Needs(cpus=1, resources={"TPU": 1})))
    assert opts["resources"] == {"TPU": 1} and opts["max_retries"] == 2 and opts["retry_exceptions"] is False


def test_search_on_ray_matches_local(cluster, tmp_path, monkeypatch) -> None:
    ex, _, log = cluster
    ray_jobs.patch_tiers(monkeypatch)
    local = ray_jobs.search(_kernel(tmp_path), str(tmp_path / "local.db"), LocalExecutor())
    local_pids = {pid for _, _, pid in ray_jobs.logged(log)}
    log.write_text("")
    remote = ray_jobs.search(_kernel(tmp_path), str(tmp_path / "ray.db"), ex)
    ray_pids = {pid for _, _, pid in ray_jobs.logged(log)}
    assert local_pids == {str(os.getpid())} and str(os.getpid()) not in ray_pids  # the jobs ran on Ray workers
    assert remote.recipe == local.recipe and remote.speedup == local.speedup and remote.correct == local.correct
    assert remote.candidates_evaluated == local.candidates_evaluated
    a, b = _evaluations(tmp_path / "local.db"), _evaluations(tmp_path / "ray.db")
    assert a == b and {t for _, t, _ in a} >= {"model", "compiler", "check"}


def test_killed_worker_is_retried_or_recorded_failed(cluster, tmp_path) -> None:
    from pallasopt.executors.ray_cluster import RayExecutor

    ex, _, _ = cluster
    for retries, marker in ((1, tmp_path / "retried"), (0, tmp_path / "failed")):
        job = Job("sleep", ray_jobs.sleepy, {"marker": str(marker)}, 30.0, ray_jobs.lost, Needs(cpus=1))
        fut = (ex if retries else RayExecutor(None, retries=0)).submit(job)
        deadline = time.time() + 30
        while not marker.exists() and time.time() < deadline:
            time.sleep(0.05)
        os.kill(int(marker.read_text().split()[0]), signal.SIGKILL)
        got = fut.result(timeout=60)
        if retries:
            assert got["ok"] and got["attempt"] == 1  # Ray ran it again on a fresh worker
        else:
            assert got["lost"] and "died (1 attempts)" in got["message"]  # recorded as failed, not lost


def _finished(db: Path) -> int:
    """Evaluations past the model tier in `db` so far: 0 until the driver has created it and its tables (a loaded
    machine let this poll land between the file's creation and the schema's: "no such table")."""
    try:
        return len([k for k in _evaluations(db) if k[1] != "model"]) if db.exists() else 0
    except sqlite3.OperationalError:
        return 0


def test_driver_killed_mid_run_loses_no_finished_evaluation(cluster, tmp_path, monkeypatch) -> None:
    ex, address, log = cluster
    kernel, db = _kernel(tmp_path), tmp_path / "k.db"
    pause = log.with_name("sleep")
    pause.write_text("0.4")  # each fake job takes 0.4 s: the driver is killed with jobs in flight
    try:
        cmd = [sys.executable, str(TESTS / "ray_jobs.py"), kernel, str(db), address]
        driver = subprocess.Popen(cmd, start_new_session=True, stderr=subprocess.DEVNULL)
        deadline = time.time() + 90
        while time.time() < deadline and driver.poll() is None:
            time.sleep(0.2)
            if _finished(db) >= 3:
                break
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
        assert driver.returncode == -signal.SIGKILL, "the driver ended before it could be killed"
        time.sleep(1.0)  # the killed job's workers are stopped by Ray; let any last line reach the log
        before = {k for k in _evaluations(db) if k[1] != "model"}
        assert len(before) >= 3
    finally:
        pause.unlink()
    log.write_text("")
    ray_jobs.patch_tiers(monkeypatch)
    result = ray_jobs.search(kernel, str(db), ex, resume=True)
    redone = {(sha, tier) for tier, sha, _ in ray_jobs.logged(log)}
    after = _evaluations(db)
    assert before <= set(after)  # nothing finished was lost
    assert not redone & {(sha, tier) for sha, tier, _ in before}  # and nothing finished was run again
    (tmp_path / "ref").mkdir()
    reference = ray_jobs.search(_kernel(tmp_path / "ref"), str(tmp_path / "ref" / "k.db"), LocalExecutor())
    assert result.recipe == reference.recipe and set(after) == set(_evaluations(tmp_path / "ref" / "k.db"))
