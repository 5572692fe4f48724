import importlib.util
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, "src")
spec = importlib.util.spec_from_file_location("tri", "bench/kernels/llm_triangle_multiplication.py")
T = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T)
spec2 = importlib.util.spec_from_file_location("trip", ".hw/tri_pick.py")
P = importlib.util.module_from_spec(spec2)
spec2.loader.exec_module(P)
args = T.make_inputs(jax.random.key(0))


def bench(name, f, *a, n=10):
    f = jax.jit(f)
    out = jax.block_until_ready(f(*a))
    t0 = time.perf_counter()
    for _ in range(n):
        out = f(*a)
    jax.block_until_ready(out)
    print(f"{name}: {(time.perf_counter() - t0) / n * 1e3:.3f} ms", flush=True)
    return out


z, mask, ln_in, w_ab, b_ab, w_g, b_g, ln_out, w_o, b_o = args
a, b, gate = bench("project", T._project, z, mask, ln_in, w_ab, b_ab, w_g, b_g)
bench("transpose a,b to (c,N,N)", lambda a, b: (jnp.transpose(a, (2, 0, 1)), jnp.transpose(b, (2, 0, 1))), a, b)
acm, bcm = jnp.transpose(a, (2, 0, 1)), jnp.transpose(b, (2, 0, 1))
xcm = bench("pallas einsum (pick)", P._triangle_einsum, acm, bcm)
bench("xla einsum cm", lambda a, b: jnp.einsum("cik,cjk->cij", a, b, preferred_element_type=jnp.float32), acm, bcm)
bench("xla einsum natural", lambda a, b: jnp.einsum("ikc,jkc->ijc", a, b, preferred_element_type=jnp.float32), a, b)
x = bench("transpose x to (N,N,c)", lambda x: jnp.transpose(x, (1, 2, 0)), xcm)
bench("finish", lambda x, g: T._finish(x, g, ln_out, w_o, b_o, z.dtype), x, gate)
bench(
    "finish from cm (transpose inside)",
    lambda x, g: T._finish(jnp.transpose(x, (1, 2, 0)), g, ln_out, w_o, b_o, z.dtype),
    xcm,
    gate,
)
bench("entry pick", P.triangle_multiplication_outgoing, *args)
bench("reference", T.reference, *args)
bench(
    "entry pick minus kernel (xla einsum cm)",
    lambda *ar: T._finish(
        jnp.transpose(
            jnp.einsum(
                "cik,cjk->cij",
                *(jnp.transpose(t, (2, 0, 1)) for t in T._project(*ar[:7])[:2]),
                preferred_element_type=jnp.float32,
            ),
            (1, 2, 0),
        ),
        T._project(*ar[:7])[2],
        ln_out,
        w_o,
        b_o,
        z.dtype,
    ),
    *args,
)
