import importlib.util
import os
import time

import jax
import jax.numpy as jnp

spec = importlib.util.spec_from_file_location("tri", "bench/kernels/llm_triangle_multiplication.py")
T = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T)
spec2 = importlib.util.spec_from_file_location("trip", ".hw/tri_pick.py")
P = importlib.util.module_from_spec(spec2)
spec2.loader.exec_module(P)
args = T.make_inputs(jax.random.key(0))
B = jax.lax.optimization_barrier


def bench(name, f, *a, n=10):
    f = jax.jit(f)
    out = jax.block_until_ready(f(*a))
    t0 = time.perf_counter()
    for _ in range(n):
        out = f(*a)
    jax.block_until_ready(out)
    print(f"{name}: {(time.perf_counter() - t0) / n * 1e3:.3f} ms", flush=True)
    open(os.environ["OUT"] + "/" + name.replace(" ", "_") + ".hlo.txt", "w").write(f.lower(*a).compile().as_text())


def e2(z, mask, ln_in, w_ab, b_ab, w_g, b_g, ln_out, w_o, b_o):
    a, b, gate = B(T._project(z, mask, ln_in, w_ab, b_ab, w_g, b_g))
    x_cm = P._triangle_einsum(jnp.transpose(a, (2, 0, 1)), jnp.transpose(b, (2, 0, 1)))
    return T._finish(jnp.transpose(x_cm, (1, 2, 0)), gate, ln_out, w_o, b_o, z.dtype)


def e3(z, mask, ln_in, w_ab, b_ab, w_g, b_g, ln_out, w_o, b_o):
    a, b, gate = B(T._project(z, mask, ln_in, w_ab, b_ab, w_g, b_g))
    acm, bcm = B((jnp.transpose(a, (2, 0, 1)), jnp.transpose(b, (2, 0, 1))))
    x_cm = B(P._triangle_einsum(acm, bcm))
    return T._finish(jnp.transpose(x_cm, (1, 2, 0)), gate, ln_out, w_o, b_o, z.dtype)


bench("entry pick", P.triangle_multiplication_outgoing, *args)
bench("e2 barrier after project", e2, *args)
bench("e3 barriers everywhere", e3, *args)
bench("reference", T.reference, *args)
