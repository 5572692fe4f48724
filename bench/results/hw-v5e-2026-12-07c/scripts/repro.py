import os
import time

from pallasopt.cost_model.hardware import CHIPS
from pallasopt.executors.jobs import check_job, time_job
from pallasopt.executors.local import LocalExecutor

print({k: v for k, v in os.environ.items() if any(s in k for s in ("JAX", "TPU", "XLA", "LIBTPU", "PJRT"))}, flush=True)

path = "bench/kernels/fused_08_matmul_swish_scale.py"
src = open(path).read()
ex = LocalExecutor()


def chk(tag):
    t0 = time.time()
    r = ex.run(check_job(src, path, (1, 2, 3), timeout_s=300))
    print(tag, r.ok, r.status, (r.message or "")[:300], f"{time.time() - t0:.1f}s", flush=True)


chk("check1")
chk("check2")
t0 = time.time()
r = ex.run(time_job(src, path, CHIPS["v5e"]))
print("time", {k: r.get(k) for k in ("ok", "median_s", "message")}, f"{time.time() - t0:.1f}s", flush=True)
chk("check3")
chk("check4")
ex.close()
