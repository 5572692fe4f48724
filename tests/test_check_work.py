"""The oracle's check dims for dims with an odd factor, and the check work a search foresees from them."""

from __future__ import annotations

from pallasopt.harness.check_dims import (
    INTERPRET_S_PER_ELEMENT_STEP,
    check_work,
    derive_check_dims,
    smaller_values,
)
from pallasopt.workload import load_source

# A row-block scaling whose dim F = 14336 = 7 x 2048 (Llama-3-8B's FFN width), blocked by BF columns.
WIDE_FF = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "scale"


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def scale(x, bt=BT, bf=BF):
    t, f = x.shape
    return pl.pallas_call(
        _kernel,
        grid=(t // bt, f // bf),
        in_specs=[pl.BlockSpec((bt, bf), lambda i, j: (i, j))],
        out_specs=pl.BlockSpec((bt, bf), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((t, f), x.dtype),
    )(x)


def reference(x):
    return x * 2.0


def make_inputs(key, tokens=1024, ff=14336):
    return (jax.random.normal(key, (tokens, ff), jnp.float32),)
"""


def _workload(bt: int, bf: int):
    return load_source(WIDE_FF.replace("BT", str(bt)).replace("BF", str(bf)), "wide_ff.py")


def test_smaller_values_halve_then_drop_to_a_power_of_two() -> None:
    assert smaller_values(14336) == (7168, 8192)
    assert smaller_values(7168) == (3584, 4096)
    assert smaller_values(4096) == (2048,)
    assert smaller_values(7) == (4,)
    assert smaller_values(2) == (1,) and smaller_values(1) == ()


def test_an_odd_factor_no_longer_pins_the_check_at_a_big_block_times_seven() -> None:
    # 1024 columns: halving 14336 stops at 7168 (3584 is not a multiple of 1024), 7 steps of a 14336-wide check;
    # the power-of-two step reaches 2048 (the 2 steps every axis keeps).
    dims = derive_check_dims(_workload(128, 1024))
    assert dims["ff"] == 2048, dims
    small = derive_check_dims(_workload(128, 128))
    assert small["ff"] <= 2048 and small["ff"] % 128 == 0, small


def test_check_work_grows_with_the_blocks_and_is_priced_in_seconds() -> None:
    small_blocks, big_blocks = check_work(_workload(128, 128)), check_work(_workload(512, 1024))
    assert 0 < small_blocks < big_blocks
    # both are checks a search can afford, seconds not minutes, at the measured interpret-mode cost
    assert big_blocks * INTERPRET_S_PER_ELEMENT_STEP < 30.0


def test_a_bigger_block_grows_check_dims_from_the_modules_own(monkeypatch) -> None:
    """Where a candidate's blocks no longer fit the module's CHECK_DIMS, the oracle grows CHECK_DIMS until they do,
    never under them: gather-widen{k=8} on the bench's paged attention needs 16 pages per sequence, and gets
    max_len 256 with the author's head size and page size; stepping down from the defaults instead gave D = 16 and
    2-token pages (a check 2.5x the work, and not the shapes the author chose to check). Stepping down never even
    traces a dim under CHECK_DIMS (each such trace builds the page table again: 0.4 s)."""
    from conftest import ROOT

    from pallasopt.harness import check_dims
    from pallasopt.ir.kernel_ir import KernelIR
    from pallasopt.passes.gather_widen import GatherWidenPass

    ir = KernelIR.from_file(ROOT / "bench" / "kernels" / "llm_paged_attention.py")
    new = GatherWidenPass(k=8).apply(ir)
    assert new.workload is not None and ir.workload is not None and ir.workload.check_dims is not None
    traced: list[dict[str, int]] = []
    real = check_dims.trace_calls
    monkeypatch.setattr(check_dims, "trace_calls", lambda w, d=None: traced.append(dict(d or {})) or real(w, d))
    dims = derive_check_dims(new.workload, new.calls)
    assert dims == {**ir.workload.dims, **ir.workload.check_dims, "max_len": 256}, dims
    floor = ir.workload.check_dims
    assert traced and all(d[n] >= v for d in traced for n, v in floor.items()), traced
    assert check_work(new.workload, new.calls) < 4 * check_work(ir.workload, ir.calls)


def test_check_dims_never_go_under_the_modules_own_even_from_the_defaults() -> None:
    """llm_flash_attention tiled (1024, 2048) needs S = 4096, the default, so growing CHECK_DIMS reaches the defaults;
    stepping down from there used to take D to 4, rows too short for the oracle's row rule (a false failure that kept
    the baseline in the 2026-12-02 bench). The floor is CHECK_DIMS either way."""
    from conftest import ROOT

    from pallasopt.ir.kernel_ir import KernelIR
    from pallasopt.passes.registry import parse_pipeline

    ir = KernelIR.from_file(ROOT / "bench" / "kernels" / "llm_flash_attention.py")
    ((tile,),) = [parse_pipeline("tile{call=0,BLOCK_Q=1024,BLOCK_K=2048}")]
    new = tile.apply(ir)
    assert new.workload is not None
    dims = derive_check_dims(new.workload, new.calls)
    assert dims["D"] == 128 and dims["S"] == 4096 and dims["B"] >= 2 and dims["H"] >= 2, dims


# JAXBench's 1_Square_matrix_multiplication_ in gemini3's style: whole-K blocks, (BM, N) x (N, 256) per step.
FULL_K_MATMUL = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "mm"


def _kernel(a_ref, b_ref, c_ref):
    c_ref[...] = jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)


def mm(a, b, bm=BM):
    n = a.shape[0]
    return pl.pallas_call(
        _kernel,
        grid=(n // bm, n // 256),
        in_specs=[pl.BlockSpec((bm, n), lambda i, j: (i, 0)), pl.BlockSpec((n, 256), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bm, 256), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((n, n), jnp.float32),
    )(a, b)


def reference(a, b):
    return a @ b


def make_inputs(key, N=4096):
    ka, kb = jax.random.split(key)
    return jax.random.normal(ka, (N, N), jnp.float32), jax.random.normal(kb, (N, N), jnp.float32)


CHECK_DIMS = {"N": 512}
"""


def test_check_work_counts_the_matmul_flops_a_big_block_check_runs() -> None:
    """A (2048, 4096) block needs the check at N = 4096: 1.4 TFLOP of dots over its five runs, the kernel's and the
    reference's. Element-steps alone foresaw 9 s for it (the bench's check took 28-31 s and was cut at the budget);
    the FLOPs put it at ~28 s, and leave a 256-row block's check (N = 512) at a fraction of a second."""
    from pallasopt.harness.check_dims import INTERPRET_S_PER_FLOP

    def work(bm: int) -> float:
        return check_work(load_source(FULL_K_MATMUL.replace("BM", str(bm)), "mm.py")) * INTERPRET_S_PER_ELEMENT_STEP

    flops = 5 * 2 * 2 * 4096**3  # five runs, kernel and reference, 2 N^3 each
    assert work(2048) >= flops * INTERPRET_S_PER_FLOP > 20.0
    assert work(256) < 1.0


# A kernel on the weights alone (as imported conv tasks have it): the activations the reference reads grow with B,
# the kernel's operands never do.
WEIGHTS_ONLY = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "layer"


def _kernel(w_ref, o_ref):
    o_ref[...] = w_ref[...] * 2.0


def layer(x, w):
    w2 = pl.pallas_call(
        _kernel,
        grid=(2,),
        in_specs=[pl.BlockSpec((32, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((32, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(w.shape, w.dtype),
    )(w)
    return x @ w2


def reference(x, w):
    return x @ (w * 2.0)


def make_inputs(key, B=1 << 20):
    kx, kw = jax.random.split(key)
    return jax.random.normal(kx, (B, 64), jnp.float32), jax.random.normal(kw, (64, 128), jnp.float32)


CHECK_DIMS = {"B": 8}
"""


def test_the_wide_check_dims_do_not_grow_inputs_the_kernel_never_sees() -> None:
    from pallasopt.harness.check_dims import WIDE_MAX_ELEMS, derive_wide_dims, trace_calls

    w = load_source(WEIGHTS_ONLY, "weights_only.py")
    base = trace_calls(w, dict(w.dims))
    small = derive_check_dims(w, base)
    wide = derive_wide_dims(w, small, base)
    assert small == {"B": 8}
    assert 8 <= wide["B"] < 1 << 20 and wide["B"] * 64 <= WIDE_MAX_ELEMS, wide


# `scale` sizes nothing: an operation setting that make_inputs reads (as KernelBench's module-level ints are).
SCALED = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "scaled"


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def scaled(x, s):
    y = pl.pallas_call(
        _kernel,
        grid=(x.shape[0] // 8,),
        in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)
    return y * s


def reference(x, s):
    return x * 2.0 * s


def make_inputs(key, M=64, scale=2):
    return jax.random.normal(key, (M, 128), jnp.float32), jnp.full((1, 128), scale, jnp.float32)


CHECK_DIMS = {"M": 16, "scale": 1}
"""


def test_the_wide_check_dims_never_change_a_dim_that_sizes_nothing() -> None:
    from pallasopt.harness.check_dims import derive_wide_dims, trace_calls

    w = load_source(SCALED, "scaled.py")
    base = trace_calls(w, dict(w.dims))
    small = derive_check_dims(w, base)
    wide = derive_wide_dims(w, small, base)
    assert small == {"M": 16, "scale": 1} and wide["M"] > 16 and wide["scale"] == 1, wide


# JAXBench gemini3 level2 86_Matmul_Divide_GELU's kernel, cut down: whole-K row blocks, and a `fori_loop` over K in a
# hard-coded 512-wide step inside the body (`x_ref.shape[1] // 512` trips).
K_LOOP = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "matmul"


def _kernel(x_ref, w_ref, o_ref):
    bk = 512

    def body(k, acc):
        x = x_ref[:, pl.ds(k * bk, bk)]
        w = w_ref[pl.ds(k * bk, bk), :]
        return acc + jnp.dot(x, w, preferred_element_type=jnp.float32)

    acc = jax.lax.fori_loop(0, x_ref.shape[1] // bk, body, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc


def matmul(x, w):
    m, k = x.shape
    n = w.shape[1]
    return pl.pallas_call(
        _kernel,
        grid=(m // 128, n // 256),
        in_specs=[pl.BlockSpec((128, k), lambda i, j: (i, 0)), pl.BlockSpec((k, 256), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((128, 256), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.float32),
    )(x, w)


def reference(x, w):
    return x @ w


def make_inputs(key, M=1024, K=4096, N=1024):
    kx, kw = jax.random.split(key)
    return jax.random.normal(kx, (M, K), jnp.float32), jax.random.normal(kw, (K, N), jnp.float32)
"""


def test_check_dims_keep_a_loop_in_the_body_running_twice() -> None:
    """Stepping K down to 128 (the grid rule alone allows it: K is no grid axis) left the body's loop with no trip and
    the output all zeros: the oracle failed a kernel that is right at every K its 512-wide step divides. The loop's
    trip count is kept at >= 2, as the grid's steps are, and the kernel passes at the dims derived."""
    from pallasopt.harness.check import check
    from pallasopt.ir.trace import trace_calls

    w = load_source(K_LOOP, "k_loop.py")
    dims = derive_check_dims(w)
    assert dims["K"] == 1024 and dims["M"] < 1024 and dims["N"] < 1024, dims
    (small,) = trace_calls(w, dims)
    assert [d.count for d in small.body.dots] == [2]
    r = check(K_LOOP, "k_loop.py", seeds=(1, 2))
    assert r.ok, r.message


# JAXBench's 100_HingeLoss, in miniature: the inputs are (B, 1024) and (B,) with 1024 fixed outside the named dims,
# and the reference broadcasts one against the other, which lines up only at B = 1024. The kernel ignores t.
FIXED_WIDTH = """
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

ENTRY = "double"


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 2.0


def double(x, t):
    b, n = x.shape
    return pl.pallas_call(
        _kernel,
        grid=(b // 128,),
        in_specs=[pl.BlockSpec((128, n), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((128, n), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((b, n), x.dtype),
    )(x)


def reference(x, t):
    return x * 2.0 + 0.0 * t


def make_inputs(key, B=1024):
    kx, kt = jax.random.split(key)
    return jax.random.normal(kx, (B, 1024), jnp.float32), jax.random.normal(kt, (B,), jnp.float32)
"""


def test_check_dims_keep_the_reference_tracing() -> None:
    """The kernel traces at B = 256, the reference does not (a (256, 1024) by (256,) broadcast): the check failed on
    the task's own error. Dims at which the reference does not trace are not taken (here: none smaller)."""
    w = load_source(FIXED_WIDTH, "fixed_width.py")
    assert derive_check_dims(w) == {"B": 1024}
