"""`pallasopt port` 2-D tile rules: `offs[:, None] * stride` addresses, the tl.dot K loop, program-id swizzles,
autotune configs (our fixtures in tests/fixtures/triton/, written in the Triton tutorials' style)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pallasopt.errors import UserError
from pallasopt.port import port_source
from pallasopt.port.autotune import autotune_configs, tpu_config
from pallasopt.port.source import read_triton
from pallasopt.port.tile_index import Axis

FIX = Path(__file__).parent / "fixtures" / "triton"
STUB_REF = "def reference(x):\n    return x * 2.0\n\n\ndef make_inputs(key, M=32, N=256):\n    import jax\n\n    return (jax.random.normal(key, (M, N)),)\n"


def _port(launcher: str, ref: str | None, fixture: str = "matmul"):
    src = FIX / f"{fixture}.py"
    ref_text = (FIX / f"{ref}.py").read_text() if ref else STUB_REF
    return port_source(str(src), src.read_text(), f"{ref}.py", ref_text, launcher)


def test_k_loop_becomes_an_arbitrary_axis_with_a_vmem_accumulator():
    res = _port("matmul", "matmul_ref")
    assert [(k.status, k.mode) for k in res.kernels] == [("rules", "tiles")]
    src = res.source
    # the grouped swizzle is dropped from the body: the tile indexes are the first two grid axes
    assert "    pid_m = _g0 = pl.program_id(0)\n    pid_n = _g1 = pl.program_id(1)\n    _g2 = pl.program_id(2)\n" in src
    assert "group_id" not in src.split("def _k_mm_kernel")[1].split("def _tiles_mm_kernel")[0]
    # ... and kept, as Python, for the trace-time permutation check
    assert (
        "    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)\n    pid_m = first_pid_m + (pid % group_size_m)"
        in src
    )
    # f32 scratch: initialised at k == 0 from the Triton init value, written back every step, stored at the last k
    assert "@pl.when(_g2 == 0)\n    def _init_acc():\n        _acc_acc[...] = jnp.broadcast_to(acc, " in src
    assert "    acc += jnp.dot(a, b, preferred_element_type=jnp.float32)\n    _acc_acc[...] = acc\n" in src
    assert "@pl.when(_g2 == _NK - 1)\n    def _finish():\n        acc = _acc_acc[...]\n        if FUSE_RELU:" in src
    assert "_st(c_ptr_out, None, 'tile', _tcast(acc, c_ptr_dtype), None)" in src  # c_ptr.dtype.element_ty
    # the K mask is computed as written over the block's own iotas and the K step
    assert (
        "k_left = K - k * BLOCK_K" in src and "(jax.lax.broadcasted_iota(jnp.int32, (1, BLOCK_K), 1)) < k_left" in src
    )
    # block specs: A is (tile m, K step), B (K step, tile n), C (tile m, tile n); bounds M, N cover C
    assert '("a_ptr", a_ptr, (BLOCK_M, 0, stride_am), (BLOCK_K, 2, stride_ak))' in src
    assert '("b_ptr", b_ptr, (BLOCK_K, 2, stride_bk), (BLOCK_N, 1, stride_bn))' in src
    assert "len(range(0, _cdiv(K, BLOCK_K))), [((BLOCK_M, BLOCK_N), jnp.float32)], [(0, M), (1, N)])" in src
    assert "tl." not in src.split("# ---- reference")[0].split('"""', 2)[2] and "torch" not in src
    compile(src, "out.py", "exec")


def test_2d_tiles_without_a_loop_use_a_2d_grid():
    src = _port("axpy2d", "axpy2d_ref").source
    assert "_g2" not in src and "_acc_" not in src
    assert '("out_ptr", out_ptr, (BLOCK_M, 0, stride_om), (BLOCK_N, 1, 1))' in src
    assert 'x = _ld(x_ptr_ref, "tile", mask, 0.0)' in src and "alpha * x + y" in src
    assert "None, [], [(0, M), (1, N)])" in src  # no K steps, no scratch, both store bounds


def test_block_pointers_and_advance():
    src = _port("bp_matmul", "bp_matmul_ref").source
    # range(0, K, BLOCK_K): k is the K step times the step; tl.advance(bp, (0, BLOCK_K)) indexes A's columns by it
    assert "    k = _g2 * (BLOCK_K)\n" in src and "len(range(0, K, BLOCK_K))" in src
    assert '("a_ptr", a_ptr, (BLOCK_M, 0, stride_am), (BLOCK_K, 2, stride_ak))' in src
    # boundary_check=(0, 1) with padding_option="zero": a mask of both axes against the block pointer's shape
    want = (
        '_ld(a_ptr_ref, "tile", (pid_m * (BLOCK_M) + jax.lax.broadcasted_iota(jnp.int32, (BLOCK_M, 1), 0) < (M)) & '
        "(_g2 * (BLOCK_K) + jax.lax.broadcasted_iota(jnp.int32, (1, BLOCK_K), 1) < (K)), 0)"
    )
    assert want in src
    assert "[((BLOCK_M, BLOCK_N), jnp.float32)], [(0, M), (1, N)])" in src  # the store's boundary_check: bounds


@pytest.mark.parametrize(
    ("launcher", "line", "why"),
    [
        ("store_in_loop", 17, "'c_ptr' is stored inside the K loop (only after it)"),
        ("skip_advance", 34, "the pointer advance '2 * BLOCK_K' of 'a_ptrs' is not BLOCK * stride"),
        ("row_sum", 46, "tl.sum in a 2-D tile kernel is not in the rule subset"),
        ("keep_old", 57, "the store mask of 'out_ptr' is not a bound on its own tile offsets"),
        ("bp_skip", 117, "tl.advance by (0, 2 * BLOCK_K) is not one block along one untiled axis"),
    ],
)
def test_tile_declines_name_the_line(launcher, line, why):
    with pytest.raises(UserError) as e:
        _port(launcher, None, "tile_declines")
    assert e.value.line == line and e.value.path.endswith("tile_declines.py")
    assert why in str(e.value) and "\n" not in str(e.value)


def test_program_to_tile_map_must_be_a_permutation():
    """pid -> (pid % 2, pid // 4) over 8 programs misses tiles: the launch refuses at trace time (fails `check`)."""
    import jax

    ns: dict = {}
    exec(compile(_port("half_grid", None, "tile_declines").source, "half_grid.py", "exec"), ns)
    with pytest.raises(ValueError, match=r"launch grid \(8,\) is not a permutation of the 4 x 2 tile grid"):
        jax.eval_shape(ns["ported"], jax.ShapeDtypeStruct((32, 256), "float32"))


def test_autotune_takes_the_first_config_that_tiles_on_a_tpu():
    text = (
        "import triton\nimport triton.language as tl\n\n\ndef configs():\n    return [\n"
        "        triton.Config({'BM': 64, 'BK': 32}, num_warps=4),\n        triton.Config({'BM': 64, 'BK': 128}),\n    ]\n\n\n"
        "@triton.autotune(configs=configs(), key=['M'])\n@triton.jit\ndef k(a_ptr, BM: tl.constexpr, BK: tl.constexpr):\n"
        "    pass\n"
    )
    tf = read_triton("k.py", text)
    configs = autotune_configs(tf, tf.jit["k"])
    assert configs == [{"BM": "64", "BK": "32"}, {"BM": "64", "BK": "128"}]
    layout = {"a_ptr": (Axis("BM", "t:pid_m", "s"), Axis("BK", "iter", "1"))}
    assert tpu_config(configs, layout) == (
        configs[1],
        "config #2 of 2, the first whose blocks meet the TPU's (8, 128) tiling",
    )
    wide = {"a_ptr": (Axis("BM", "t:pid_m", "s"), Axis("BM", "iter", "1"))}  # 64 lanes: no config fits
    assert tpu_config(configs, wide)[1].startswith("config #1 of 2 (none meets")


def test_tile_ports_pass_the_oracle():
    """Matmul (grouped swizzle, K loop with partial K, fused ReLU), a 2-D axpy and a block-pointer matmul, in
    interpret mode on fresh seeds (one child process)."""
    from pallasopt.harness.check import check_many

    sources = [_port(n, f"{n}_ref").source for n in ("matmul", "axpy2d", "bp_matmul")]
    results = check_many(sources, "tiles_ported.py", timeout_s=600)
    assert [r.ok for r in results] == [True, True, True], [r.message for r in results]
