"""skip-masked-blocks: the mask bound algebra against brute force, before/after sources, declines, and the rewritten
kernels checked numerically in interpret mode."""

from __future__ import annotations

import functools
import itertools

import libcst as cst
import pytest
from conftest import ROOT, TEST_KERNELS

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.ir.mask_bounds import Reader, bound_on_axis, needed_text, static_value
from pallasopt.ir.matchers import is_call_to as _is_call
from pallasopt.passes.registry import parse_pipeline
from pallasopt.passes.skip_masked_blocks import SkipMaskedBlocksPass

BENCH = ROOT / "bench" / "kernels"


def apply(ir: KernelIR, spec: str) -> KernelIR:
    (p,) = parse_pipeline(spec)
    return p.apply(ir)


def added(before: str, after: str) -> list[str]:
    import difflib

    return [ln[2:].strip() for ln in difflib.ndiff(before.splitlines(), after.splitlines()) if ln.startswith("+ ")]


def _mask(src: str):
    """Parse `rows = ...; cols = ...; cond` (the last line is the condition) with the pass's reader."""
    *assigns, cond = src.strip().splitlines()
    env = {}
    for line in assigns:
        name, value = line.split(" = ", 1)
        env[name.strip()] = cst.parse_expression(value)
    return Reader(env, _is_call).mask(cst.parse_expression(cond))


def _sign(ns: dict[str, int], text: str) -> int:
    return 1 if static_value(text, ns) > 0 else -1


ROWS = "rows = pl.program_id(0) * BQ + OFF + lax.broadcasted_iota(jnp.int32, s.shape, 0)"
COLS = "cols = pl.program_id(1) * BK + lax.broadcasted_iota(jnp.int32, s.shape, 1)"
CONDS = {
    "causal": "cols <= rows",
    "strict": "rows > cols",
    "window": "(cols <= rows) & (rows - cols < W)",
    "diag": "rows == cols",
}
ALLOWED = {
    "causal": lambda r, c, w: c <= r,
    "strict": lambda r, c, w: r > c,
    "window": lambda r, c, w: c <= r and r - c < w,
    "diag": lambda r, c, w: r == c,
}


@pytest.mark.parametrize("kind", sorted(CONDS))
def test_needed_condition_never_skips_an_unmasked_block(kind: str) -> None:
    """Brute force over small blocks: a block the condition calls masked holds no allowed element; for one
    comparison the condition is exact; the index-map bounds keep exactly the needed blocks of each row."""
    mask = _mask(f"{ROWS}\n{COLS}\n{CONDS[kind]}")
    assert mask is not None
    text = needed_text(mask, lambda a: "ij"[a])
    exact = len(mask.constraints()) == 1
    for bq, bk, off, w in itertools.product((2, 4), (2, 3), (0, 5), (3, 6)):
        ns = {"BQ": bq, "BK": bk, "OFF": off, "W": w}
        bounds = [bound_on_axis(c, 1, functools.partial(_sign, ns), lambda a: "ij"[a]) for c in mask.constraints()]
        assert all(b is not None for b in bounds)
        for i, j in itertools.product(range(4), range(6)):
            env = {**ns, "i": i, "j": j}
            needed = bool(eval(text.replace("&", " and ").replace("|", " or "), {}, env))
            cells = itertools.product(range(i * bq + off, i * bq + off + bq), range(j * bk, j * bk + bk))
            has = any(ALLOWED[kind](r, c, w) for r, c in cells)
            assert needed or not has, (kind, ns, i, j, text)
            if exact:
                assert needed == has, (kind, ns, i, j, text)
            in_range = all(
                (j >= eval(t, {}, env)) if side == "lo" else (j <= eval(t, {}, env))
                for side, t in (b for b in bounds if b is not None)
            )
            assert in_range == needed, (kind, ns, i, j, bounds)


def test_reader_declines_what_it_cannot_bound() -> None:
    assert _mask(f"{ROWS}\n{COLS}\ncols != rows") is None
    assert _mask(f"{ROWS}\n{COLS}\n2 * cols <= rows") is None  # a scaled iota skips integers
    assert _mask("x = y\nx <= 3") is None  # no index built from program ids and iotas


def test_flash_attention_before_after() -> None:
    ir = KernelIR.from_file(BENCH / "llm_flash_attention.py")
    new = apply(ir, "skip-masked-blocks")
    got = added(ir.source, new.source)
    assert "@pl.when(qi * BLOCK_Q - ki * BLOCK_K + BLOCK_Q - 1 >= 0)" in got
    assert "def _unmasked_block():" in got
    assert "s = jnp.where(cols <= rows, s, NEG_INF)" in got  # partially masked blocks keep the mask
    clamp = "jnp.maximum(jnp.minimum(j, (i * BLOCK_Q + BLOCK_Q - 1) // BLOCK_K), 0)"
    assert any(clamp in line for line in got), got
    assert "@pl.when(ki == 0)" not in got  # the init and store steps stay outside the skip
    assert new.recipe == ("skip-masked-blocks{call=0,clamp=true}",)
    # the traced kv index map repeats the diagonal block on the steps above it (no new DMA there)
    kv = new.calls[0].inputs[1].index_map
    assert kv.block_index((0, 0, 1, 5))[2] == 1 and kv.block_index((0, 0, 3, 2))[2] == 2


def test_sliding_window_gets_both_bounds_and_stays_correct() -> None:
    path = TEST_KERNELS / "sliding_window_attention.py"
    ir = KernelIR.from_file(path)
    choices = [p.spec() for p in SkipMaskedBlocksPass.choices(ir, get_chip("v5e"))]
    assert choices == ["skip-masked-blocks{call=0,clamp=true}", "skip-masked-blocks{call=0,clamp=false}"]
    new = apply(ir, "skip-masked-blocks")
    got = "\n".join(added(ir.source, new.source))
    assert "(qi * BLOCK_Q - ki * BLOCK_K + BLOCK_Q - 1 >= 0) & (" in got
    assert "jnp.maximum(j, -(" in got and "jnp.minimum(" in got and "pl.num_programs(2) - 1" in got
    kv = new.calls[0].inputs[1].index_map  # S=512, blocks of 128, window 192: row block 3 needs key blocks 1..3
    assert [kv.block_index((0, 3, j))[1] for j in range(4)] == [1, 1, 2, 3]
    (r,) = check_many([new.source], str(path))
    assert r.ok, r.message


def test_offset_bound_with_partial_reaches_the_index_maps() -> None:
    path = TEST_KERNELS / "causal_offset_attention.py"
    ir = KernelIR.from_file(path)
    new = apply(ir, "skip-masked-blocks")
    got = added(ir.source, new.source)
    assert "pid0 = pl.program_id(0)" in got and "pid1 = pl.program_id(1)" in got
    assert "@pl.when(pid0 * TQ - pid1 * TK + q_offset + TQ - 1 >= 0)" in got
    assert "q_pos = q_offset + pid0 * TQ + lax.broadcasted_iota(jnp.int32, s.shape, 0)" in got
    # `q_offset=sk - sq` is bound by functools.partial in the function that writes the index maps
    clamp = "lambda i, j: (jnp.maximum(jnp.minimum(j, (i * TQ + (sk - sq) + TQ - 1) // TK), 0), 0)"
    assert sum(clamp in line for line in got) == 2, got
    kv = new.calls[0].inputs[1].index_map  # Sq=256, Sk=512: query block 0 sits at keys 256..383
    assert [kv.block_index((0, j))[0] for j in range(4)] == [0, 1, 2, 2]
    (r,) = check_many([new.source], str(path))
    assert r.ok, r.message


def test_mask_reading_a_ref_cannot_clamp() -> None:
    ce = KernelIR.from_file(BENCH / "llm_linear_cross_entropy.py")
    with pytest.raises(PassNotApplicable, match="index maps cannot see"):
        apply(ce, "skip-masked-blocks")


def test_declines(example_irs) -> None:
    with pytest.raises(PassNotApplicable, match="reduction"):
        apply(example_irs["softmax"], "skip-masked-blocks")
    sparse = KernelIR.from_file(BENCH / "llm_block_sparse_attention.py")  # masks through a helper function
    with pytest.raises(PassNotApplicable, match=r"no jnp\.where"):
        apply(sparse, "skip-masked-blocks")
    rows = KernelIR.from_file(BENCH / "fused_33_causal_softmax_scores.py")  # a whole row per step: nothing to skip
    with pytest.raises(PassNotApplicable, match="reduction"):
        apply(rows, "skip-masked-blocks")


def test_cost_model_sees_the_skip() -> None:
    """The roofline model charges no MXU time and no fetch on skipped steps. S=512 in blocks of 128 with a window of
    192 needs key blocks {0}, {0,1}, {0,1,2}, {1,2,3} per query block: 9 of 16 steps compute, and the clamped kv
    block is transferred 8 times per head instead of 16 (a row's first block repeats the previous row's last where
    they agree)."""
    from pallasopt.cost_model.roofline import block_fetches, estimate_call

    ir = KernelIR.from_file(TEST_KERNELS / "sliding_window_attention.py")
    new = apply(ir, "skip-masked-blocks")
    before, after = ir.calls[0], new.calls[0]
    assert [block_fetches(o, before.grid)[0] for o in before.inputs] == [8, 32, 32]
    assert [block_fetches(o, after.grid)[0] for o in after.inputs] == [8, 16, 16]
    chip = get_chip("v5e")
    e0, e1 = estimate_call(before, chip), estimate_call(after, chip)
    assert [t.fetches for t in e1.traffic] == [8, 16, 16, 8]
    assert e1.mxu_s / e0.mxu_s == pytest.approx(9 / 16)
