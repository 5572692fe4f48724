"""The correctness oracle: passes correct kernels, catches wrong results, unwritten blocks and DMA races."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES, TEST_KERNELS

from pallasopt.harness.check import check


def run(path):
    return check(path.read_text(), str(path))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_pass(path) -> None:
    r = run(path)
    assert r.ok, r.message
    assert r.status == "pass" and len(r.seeds) >= 2
    assert all(v <= 512 for v in r.dims.values())


def test_wrong_kernel_fails() -> None:
    r = run(TEST_KERNELS / "wrong_result.py")
    assert not r.ok and r.status == "mismatch" and "outside" in r.message


def test_unwritten_output_block_fails() -> None:
    r = run(TEST_KERNELS / "unwritten_block.py")
    assert not r.ok and r.status == "nan"


def test_manual_dma_uses_tpu_interpreter_and_passes() -> None:
    r = run(TEST_KERNELS / "dma_copy_scale.py")
    assert r.ok, r.message
    assert r.mode == "interpret-tpu-races"


def test_dma_race_is_caught() -> None:
    r = run(TEST_KERNELS / "dma_race.py")
    assert not r.ok and r.status == "race" and "race detector" in r.message


def test_hang_is_a_result_not_the_end() -> None:
    src = (
        (TEST_KERNELS / "wrong_result.py")
        .read_text()
        .replace("def reference(x):\n", "def reference(x):\n    import time\n    time.sleep(60)\n")
    )
    r = check(src, "hang.py", timeout_s=8)
    assert not r.ok and r.status == "timeout"


def test_crash_is_a_result() -> None:
    src = (
        (TEST_KERNELS / "wrong_result.py")
        .read_text()
        .replace("def reference(x):\n", "def reference(x):\n    import os\n    os._exit(9)\n")
    )
    r = check(src, "crash.py")
    assert not r.ok and r.status == "crash"


def test_small_dims_are_derived_when_not_given() -> None:
    src = (EXAMPLES[0].parent / "matmul.py").read_text().replace('CHECK_DIMS = {"M": 256, "N": 256, "K": 256}', "")
    r = check(src, "matmul.py")
    assert r.ok, r.message
    assert r.dims == {"M": 256, "N": 256, "K": 256}  # halved until each grid axis has 2 steps of 128


def test_needs_two_seeds() -> None:
    with pytest.raises(ValueError):
        check("", "x.py", seeds=(1,))


def test_a_dot_the_cpu_backend_cannot_run_is_said_so_and_never_passes() -> None:
    # gpt-style channel-major projections (the triangle multiplication's einsum("ijz,zc->cij") in bf16, session 33):
    # jaxlib 0.10.2's CPU dot cannot run them, the TPU can; the oracle must say which, not blame the kernel.
    src = (
        (TEST_KERNELS / "wrong_result.py")
        .read_text()
        .replace(
            "kernel(x_ref, o_ref):\n    o_ref[...] = jnp.where(pl.program_id(0) == 1, x_ref[...] * 2.0, x_ref[...] + 1.0)",
            "kernel(x_ref, o_ref):\n    o_ref[...] = x_ref[...] + 1.0",
        )
        .replace(
            "def reference(x):\n    return x + 1.0\n",
            "def reference(x):\n"
            "    w = jnp.ones((x.shape[1], 8), jnp.bfloat16)\n"
            "    y = jnp.einsum('ijz,zc->cij', x.reshape(2, -1, x.shape[1]).astype(jnp.bfloat16), w,\n"
            "                   preferred_element_type=jnp.float32)\n"
            "    return x + 1.0 + jnp.minimum(jnp.abs(y).max(), 0.0)\n",
        )
    )
    r = check(src, "cm_einsum.py")
    assert not r.ok and "XLA's CPU backend cannot run a bf16 x bf16 -> f32 dot_general" in r.message, r.message
