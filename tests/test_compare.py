"""harness/compare.py: the per-row aggregate rule on outputs whose last axis has one element."""

from __future__ import annotations

import numpy as np

from pallasopt.harness.compare import compare

TOL = {"rtol": 1e-4, "atol": 1e-4}


def test_a_column_of_row_statistics_is_one_row_not_m_rows_of_one() -> None:
    # fused_14's (M, 1) output of row means: values near zero carry rounding errors far under atol but, one
    # element per "row", a relative error above rtol; the naive kernel itself failed its final re-check on it.
    rng = np.random.default_rng(0)
    ref = rng.normal(0.0, 0.05, (512, 1)).astype(np.float32)
    ref[274, 0] = 2e-5  # a mean that is almost zero
    out = ref + rng.normal(0.0, 1e-8, ref.shape).astype(np.float32)
    out[274, 0] = ref[274, 0] + 7e-9  # 3.5e-4 relative, 7e-9 absolute (atol here is 1e-4 x max|ref| ~ 1.5e-5)
    rep, why = compare(0, out, ref, TOL)
    assert why == "", why
    assert rep.worst_row_err < 1e-4


def test_a_systematic_error_down_a_column_still_fails() -> None:
    # Every element within tolerance, but the whole column biased by 1.2e-4 of its size: the aggregate catches it.
    rng = np.random.default_rng(1)
    ref = rng.uniform(1.0, 2.0, (512, 1)).astype(np.float32)
    out = (ref * (1 + 1.2e-4)).astype(np.float32)  # each within atol + rtol * |ref| (>= 2e-4 here)
    rep, why = compare(0, out, ref, TOL)
    assert "relative L2 error" in why, why
    assert rep.bad == 0


def test_slices_of_rows_give_the_verdict_of_one_pass(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`compare` reads an output in slices of rows (fast on big outputs); the counts, the worst element, the worst
    row and its index must be those of one pass over the whole array."""
    import pallasopt.harness.compare as cmp

    rng = np.random.default_rng(2)
    ref = rng.uniform(1.0, 2.0, (64, 48)).astype(np.float32)
    base = ref + rng.normal(0.0, 1e-7, ref.shape).astype(np.float32)
    biased = base.copy()
    biased[41] *= np.float32(1.0 + 1.5e-4)  # every element within tolerance, the row's L2 error not (a late slice)
    bad = biased.copy()
    bad[7, 5] += np.float32(0.5)  # an element outside tolerance, in an early slice
    nan = bad.copy()
    nan[50, 3] = np.nan
    cases = (base, biased, bad, nan)
    whole = [compare(0, out, ref, TOL) for out in cases]
    monkeypatch.setattr(cmp, "COMPARE_CHUNK_ELEMS", 100)  # two rows per slice
    sliced = [compare(0, out, ref, TOL) for out in cases]
    assert sliced == whole
    assert sliced[0][1] == ""
    assert "row 41" in sliced[1][1] and sliced[1][0].bad == 0
    assert sliced[2][0].bad == 1 and "outside" in sliced[2][1] and sliced[2][0].max_abs_err > 0.49
    assert sliced[3][0].nan == 1 and "NaN" in sliced[3][1]
