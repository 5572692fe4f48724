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
