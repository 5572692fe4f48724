"""stream-chunks: an in-kernel fori_loop over chunks of a whole VMEM block reads its chunks from HBM through a
two-slot DMA ring instead. Before/after sources, every choice re-traced and checked in interpret mode under the race
detector on kernels of three styles (GQA attention from the bench, a sliding-window loop, a logsumexp walking the
lane axis), the combination with skip-masked-chunks, a broken ring caught, declines that name why, and what the
model sees (VMEM falls to two chunks, the K/V re-fetch per query tile is charged)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT, TEST_KERNELS

from pallasopt.cost_model.hardware import get_chip
from pallasopt.cost_model.roofline import estimate_call, vmem_footprint
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.skip_masked_chunks import SkipMaskedChunksPass
from pallasopt.passes.stream_chunks import StreamChunksPass

V5E = get_chip("v5e")
WINDOW = TEST_KERNELS / "loops" / "window_loop_attention.py"
LSE = TEST_KERNELS / "loops" / "chunked_logsumexp.py"
GQA = ROOT / "bench" / "kernels" / "llm_gqa_attention.py"


@pytest.fixture(scope="module")
def window() -> KernelIR:
    return KernelIR.from_file(WINDOW)


@pytest.fixture(scope="module")
def lse() -> KernelIR:
    return KernelIR.from_file(LSE)


def test_choices_one_per_streamable_loop(window, lse) -> None:
    assert [p.spec() for p in StreamChunksPass.choices(window, V5E)] == ["stream-chunks{call=0,loop=0}"]
    assert [p.spec() for p in StreamChunksPass.choices(lse, V5E)] == ["stream-chunks{call=0,loop=0}"]
    assert StreamChunksPass.choices(window, get_chip("h100")) == ()
    # a kernel without a loop over chunks is not offered the pass
    assert StreamChunksPass.choices(KernelIR.from_file(ROOT / "examples" / "matmul.py"), V5E) == ()


@pytest.mark.parametrize("loop", [-1, 1])
def test_a_loop_number_out_of_range_declines(window, loop: int) -> None:
    # -1 indexed the loop list from the end (the last loop, under a spec that names none)
    with pytest.raises(PassNotApplicable, match=f"no loop #{loop}: the kernel has 1 fori_loop"):
        StreamChunksPass(call=0, loop=loop).apply(window)


def test_the_loop_reads_chunks_and_the_blocks_stay_in_hbm(window) -> None:
    new = StreamChunksPass().apply(window)
    src = new.source
    assert "def chunk(j, carry, k_chunk, v_chunk):" in src
    assert "k = k_chunk[:, :]" in src and "v = v_chunk[:, :]" in src
    assert "k_ref[pl.ds(" not in src  # no read of the whole block is left
    assert "_stream_fori_loop(0, seq // CHUNK, chunk, init, (k_ref, v_ref), CHUNK, (0, 0))" in src
    assert "in_specs=_stream_hbm([" in src and "_stream_kernel(functools.partial(_kernel, window=WINDOW)" in src
    (before,), (after,) = window.calls, new.calls
    assert [o.memory_space for o in after.inputs] == ["default", "any", "any"]
    assert after.grid == before.grid and after.body.has_dma
    # the rings are the body's own allocations: two chunks of K and of V, and a (2 refs, 2 slots) semaphore array
    rings = sorted(s.shape for s in after.scoped if s.dtype != "dma_sem")
    assert rings == [(2, 64, 128), (2, 64, 128)]
    assert [s.shape for s in after.scoped if s.dtype == "dma_sem"] == [(2, 2)]


def test_the_lane_axis_streams_too(lse) -> None:
    src = StreamChunksPass().apply(lse).source
    assert "x = x_chunk[:, :].astype(jnp.float32)" in src
    assert "(x_ref,), CHUNK, (1,))" in src  # the chunk walks dim 1; the bias read outside the loop stays a block
    assert "_stream_hbm([pl.BlockSpec((BLOCK_R, n), lambda i: (i, 0)), pl.BlockSpec((BLOCK_R, 1)" in src


def test_every_choice_and_the_skip_after_it_pass_the_oracle(window, lse) -> None:
    gqa = KernelIR.from_file(GQA)
    cases = [(ir, StreamChunksPass()) for ir in (window, lse, gqa)]
    news = [p.apply(ir) for ir, p in cases]
    skipped = SkipMaskedChunksPass().apply(news[0])  # the window's bounds narrow on the streamed loop as well
    assert "_stream_fori_loop(jnp.maximum(0," in skipped.source
    for new, path in zip([*news, skipped], [WINDOW, LSE, GQA, WINDOW], strict=True):
        (r,) = check_many([new.source], str(path))
        assert r.ok, f"{path.name}: {r.message}"
        assert r.mode == "interpret-tpu-races"  # the ring's DMAs run under the race detector


def test_a_body_reading_the_slot_in_flight_fails_the_oracle(lse) -> None:
    """The check can fail: a body handed the slot being prefetched into reads the wrong chunk (and races the DMA)."""
    new = StreamChunksPass().apply(lse)
    wrong = new.source.replace("*[buf.at[slot] for buf in bufs]", "*[buf.at[1 - slot] for buf in bufs]")
    assert wrong != new.source
    (r,) = check_many([wrong], str(LSE))
    assert not r.ok, r.message


def _variant(tmp_path: Path, old: str, new: str, name: str) -> KernelIR:
    src = WINDOW.read_text()
    assert old in src
    path = tmp_path / name
    path.write_text(src.replace(old, new))
    return KernelIR.from_file(path)


def test_refs_that_cannot_stream_stay_and_declines_name_why(tmp_path, window) -> None:
    # one ref disqualified: the other one still streams
    partial = [
        ("    q = q_ref[...]\n", "    q = q_ref[...] + 0 * k_ref[0:1, :]\n"),  # K also read outside the loop
        ("k_ref[pl.ds(j * CHUNK, CHUNK), :]", "k_ref[pl.ds(j * 32, CHUNK), :]"),  # a start that is not j * size
        ("v_ref[pl.ds(j * CHUNK, CHUNK), :]", "v_ref[pl.ds(j * CHUNK, CHUNK), :] * k_ref[0, 0]"),  # a second read
    ]
    for i, (old, new) in enumerate(partial):
        ir = _variant(tmp_path, old, new, f"partial_{i}.py")
        src = StreamChunksPass().apply(ir).source
        assert "(v_ref,), CHUNK, (0,))" in src and "def chunk(j, carry, v_chunk):" in src, src
    declines = [
        (
            "    q = q_ref[...]\n",
            "    q = q_ref[...] + k_ref[0:1, :] + v_ref[0:1, :]\n",
            "is used outside the loop body",
        ),
        ("pl.ds(j * CHUNK, CHUNK), :]", "pl.ds(j * CHUNK + 1, CHUNK), :]", "does not read one `pl.ds"),
        (
            "    return pl.pallas_call(",
            "    s = s * 3 // 4\n    return pl.pallas_call(",
            "does not divide its array dim",
        ),
    ]
    for i, (old, new, why) in enumerate(declines):
        ir = _variant(tmp_path, old, new, f"decline_{i}.py")
        assert StreamChunksPass.choices(ir, V5E) == ()
        with pytest.raises(PassNotApplicable, match=why):
            StreamChunksPass().apply(ir)
    # an unrolled loop streams, unrolled as before; skip-masked-chunks declines it (its bounds would be dynamic)
    unrolled = _variant(tmp_path, "chunk, init)", "chunk, init, unroll=2)", "unrolled.py")
    src = StreamChunksPass().apply(unrolled).source
    assert "(k_ref, v_ref), CHUNK, (0, 0), unroll=2)" in src
    with pytest.raises(PassNotApplicable, match="unrolled"):
        SkipMaskedChunksPass().apply(unrolled)
    once = StreamChunksPass().apply(window)  # the loop now streams: nothing left to move
    assert StreamChunksPass.choices(once, V5E) == ()
    with pytest.raises(PassNotApplicable, match="manual DMA"):
        StreamChunksPass().apply(once)


def test_the_model_sees_two_chunks_of_vmem_and_the_refetch() -> None:
    """At S=32768 the whole K and V blocks (16 MiB each, double-buffered) overflow v5e's scoped VMEM; streamed, the
    kernel holds two 64-row chunks of each. The price the model charges: every query tile fetches the keys again
    (the whole block stayed resident across a head's query tiles)."""
    src = WINDOW.read_text().replace("def make_inputs(key, BH=2, S=256", "def make_inputs(key, BH=2, S=32768")
    long = KernelIR.from_source(src, str(WINDOW))
    new = StreamChunksPass().apply(long)
    (before,), (after,) = long.calls, new.calls
    assert vmem_footprint(before, V5E) > 64 * 2**20 > 2 * 2**20 > vmem_footprint(after, V5E)
    old, now = estimate_call(before, V5E), estimate_call(after, V5E)
    assert not old.fits_vmem and now.fits_vmem
    kv = 2 * 2 * 32768 * 128 * 4  # K and V of both heads, once
    q_tiles = 32768 // 64
    assert sum(t.bytes for t in now.traffic) == pytest.approx(
        sum(t.bytes for t in old.traffic) + (q_tiles - 1) * kv, rel=0.02
    )
