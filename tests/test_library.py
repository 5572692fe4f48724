"""Library Pallas kernels as entries: an entry that calls JAX's flash attention, megablox gmm or paged attention.

The trace follows the entry into the library; facts come from the library's pallas_call, the call's site is the
user's line; the tile pass tunes the config values written in the user's file and declines a value the library
rejects at trace time. Only tracing here (abstract inputs, production dims are never materialized), except the
one `run` through the command line, marked slow.
"""

from __future__ import annotations

import pytest
from conftest import ROOT

from pallasopt.cli import main
from pallasopt.errors import KernelError, PassNotApplicable
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.ir.knobs import discover_knobs
from pallasopt.ir.library import library_calls, untunable_notes
from pallasopt.passes.registry import parse_pipeline
from pallasopt.workload import inspect_source

EXAMPLES = ROOT / "examples"

HEAD = """\
import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes, flash_attention

"""

TAIL = """

def reference(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v)


def make_inputs(key, B=1, H=2, S=256, D=128):
    kq, kk, kv = jax.random.split(key, 3)
    return tuple(jax.random.normal(k_, (B, H, S, D), jnp.float32) for k_ in (kq, kk, kv))


CHECK_DIMS = {"B": 1, "H": 2, "S": 256, "D": 128}
"""

# The entry's call into the library is on line 7 of each module below.
WITH_BLOCKS = (
    HEAD
    + """
def attention(q, k, v):
    return flash_attention(q, k, v, block_sizes=BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1))
"""
    + TAIL
)

NO_LITERAL = (
    HEAD
    + """
def attention(q, k, v):
    return flash_attention(q, k, v)
"""
    + TAIL
)

NO_PALLAS = (
    HEAD
    + """
def attention(q, k, v):
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-1), v)
"""
    + TAIL
)


def knob_axes(ir: KernelIR) -> dict[str, tuple[int, ...]]:
    return {k.name: k.axes for k in discover_knobs(ir.source, ir.path, ir.calls, ir.digest)}


def test_loader_accepts_an_entry_that_calls_a_library_kernel(tmp_path) -> None:
    path = str(tmp_path / "fa.py")
    assert inspect_source(WITH_BLOCKS, path).entry == "attention"  # no pallas_call in the file: no static refusal
    ir = KernelIR.from_source(WITH_BLOCKS, path)
    (call,) = ir.calls
    assert call.span == (7, 7)  # the user's line that calls into the library
    assert call.library_site is not None and "flash_attention.py" in call.library_site
    assert call.grid == (1, 2, 256 // 128, 256 // 128)


def test_entry_whose_trace_has_no_pallas_call_is_one_line_error(tmp_path) -> None:
    path = str(tmp_path / "plain.py")
    with pytest.raises(KernelError) as e:
        KernelIR.from_source(NO_PALLAS, path)
    text = str(e.value)
    assert text.startswith(f"{path}:6: ") and "\n" not in text  # the entry's line
    assert "reaches no pl.pallas_call when traced" in text and "library kernel" in text


def test_stub_entry_that_calls_only_builtins_is_still_refused_statically(tmp_path) -> None:
    src = HEAD + "\ndef attention(q, k, v):\n    raise NotImplementedError(globals().get('x'))\n" + TAIL
    with pytest.raises(KernelError, match=r"never reaches a pl\.pallas_call|no entry"):
        inspect_source(src, "stub.py")


def test_flash_attention_facts_follow_block_sizes() -> None:
    ir = KernelIR.from_file(EXAMPLES / "lib_flash_attention.py")
    (call,) = ir.calls
    b, h, s = ir.dims["B"], ir.dims["H"], ir.dims["S"]
    assert call.grid == (b, h, s // 128, s // 128)
    q, k, v, o = call.operands
    assert q.block_shape == o.block_shape == (1, 1, 128, ir.dims["D"])
    assert k.block_shape == v.block_shape == (1, 1, 128, ir.dims["D"])
    assert call.dimension_semantics == ("parallel", "parallel", "parallel", "arbitrary")
    assert call.span is not None and "flash_attention.py" in (call.library_site or "")
    assert call.body.mxu_flops > 0 and call.scratch  # the library's kernel body and its m/l/acc scratch
    # The causal kv map (select(on_diag, kv, 0)) depends on axes 2 and 3 but walks axis 3.
    assert k.index_map.depends_on[2] == (2, 3) and k.index_map.walks[2] == 3


def test_megablox_grid_axis_sized_at_run_time() -> None:
    ir = KernelIR.from_file(EXAMPLES / "lib_megablox_gmm.py")
    (call,) = ir.calls
    m, k, n = ir.dims["M"], ir.dims["K"], ir.dims["N"]
    assert call.dynamic_axes == (1,)
    # The active m tiles are materialized from make_inputs: the 64 row tiles, plus one more visit for each of the
    # G - 1 random group boundaries that falls inside a tile (at most 64 + 7).
    assert call.grid[0] == n // 128 and call.grid[2] == k // 128
    assert m // 128 <= call.grid[1] <= m // 128 + ir.dims["G"] - 1
    assert all(o.index_map.data_dependent for o in call.operands)


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("lib_flash_attention", {"block_q": (2,), "block_k_major": (3,)}),
        ("lib_megablox_gmm", {"tiling0": (1,), "tiling1": (2,), "tiling2": (0,)}),
        ("lib_paged_attention", {"pages_per_compute_block": (3,)}),
    ],
)
def test_knobs_found_for_each_examples_config_values(name: str, want: dict[str, tuple[int, ...]]) -> None:
    ir = KernelIR.from_file(EXAMPLES / f"{name}.py")
    assert knob_axes(ir) == want
    (lib,) = library_calls(ir)
    assert lib.line == ir.calls[0].span[0] and "tunable here" in lib.describe(ir.path)  # type: ignore[index]


def test_tile_rewrites_block_sizes_and_retraces_to_the_new_grid() -> None:
    ir = KernelIR.from_file(EXAMPLES / "lib_flash_attention.py")
    (tile,) = parse_pipeline("tile{block_q=512,block_k_major=256}")
    new = tile.apply(ir)
    assert "BlockSizes(block_q=512, block_k_major=256, block_k=128, block_b=1)" in new.source
    s = ir.dims["S"]
    assert new.calls[0].grid == (ir.dims["B"], ir.dims["H"], s // 512, s // 256)
    assert new.calls[0].operands[0].block_shape[2] == 512 and new.calls[0].operands[1].block_shape[2] == 256


def test_tile_declines_a_value_the_library_rejects() -> None:
    ir = KernelIR.from_file(EXAMPLES / "lib_flash_attention.py")
    (tile,) = parse_pipeline("tile{block_k_major=64}")  # below block_k=128: BlockSizes raises at trace time
    with pytest.raises(PassNotApplicable, match=r"does not trace.*block_k=128"):
        tile.apply(ir)


def test_megablox_tiling_rewrite_retraces() -> None:
    ir = KernelIR.from_file(EXAMPLES / "lib_megablox_gmm.py")
    (tile,) = parse_pipeline("tile{tiling0=512,tiling1=256,tiling2=512}")
    new = tile.apply(ir)
    assert "tiling=(512, 256, 512)" in new.source
    m, k, n = ir.dims["M"], ir.dims["K"], ir.dims["N"]
    grid = new.calls[0].grid
    assert (grid[0], grid[2]) == (n // 512, k // 256)
    assert m // 512 <= grid[1] <= m // 512 + ir.dims["G"] - 1  # active row tiles, materialized (run-time extent)


@pytest.mark.parametrize("spec", ["accumulate-in-scratch{call=0,output=0}", "vmem-limit{call=0,mib=64}"])
def test_other_passes_decline_a_library_call(tmp_path, spec: str) -> None:
    """Rewrites of the pallas_call expression cannot reach a library's file: they decline, naming it."""
    ir = KernelIR.from_source(WITH_BLOCKS, str(tmp_path / "fa.py"))
    (p,) = parse_pipeline(spec)
    with pytest.raises(PassNotApplicable, match=r"is in a library .*flash_attention\.py"):
        p.apply(ir)


def test_untunable_library_call_is_reported(tmp_path) -> None:
    path = str(tmp_path / "fixed.py")
    ir = KernelIR.from_source(NO_LITERAL, path)
    notes = untunable_notes(ir)
    assert notes[0].startswith(f"{path}:7: pallas_call #0 is a library kernel") and "analyzed, not tuned" in notes[0]
    assert notes[-1].startswith(f"nothing in {path} is tunable")
    assert untunable_notes(KernelIR.from_source(WITH_BLOCKS, path)) == ()


@pytest.mark.slow
def test_run_says_nothing_is_tunable(tmp_path, capsys) -> None:
    kernel = tmp_path / "fixed.py"
    kernel.write_text(NO_LITERAL)
    code = main(["run", str(kernel), "--target", "v5e", "--beam", "2", "--depth", "1", "--no-compile"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "nothing in" in out and "is tunable" in out and "analyzed, not tuned" in out
