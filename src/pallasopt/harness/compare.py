"""Comparing a kernel's output with the reference's: the tolerance (validated), elementwise and per-row aggregate.

Elementwise, an element passes when |out - ref| <= atol * scale + rtol * |ref|, where `scale` is the largest |ref| of
that output capped at 1: the absolute tolerance shrinks with a small output's magnitude (probabilities of 1e-4 are not
all "zero" under a fixed atol of 1e-3) and never grows past the stated atol. Then an aggregate: the relative L2 error of
every row (the last axis longer than 1; an (M, 1) column is one row) must stay within rtol, so
a systematic drop of small terms (a softmax zeroing every entry below 1e-3) fails even where each element is close.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import KernelError
from ..pyparse import parse_module

# Default tolerance by output dtype (rtol, atol as a fraction of the output's largest |ref|). Differences come from
# accumulation order and transcendental implementations, never from dropped work, so these stay tight.
DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-3, 1e-3),
    "bfloat16": (2e-2, 2e-2),
    "float16": (1e-2, 1e-2),
}
MAX_TOLERANCE = 0.1  # a module's TOLERANCE may not be looser than this (rtol, and atol relative to the output scale)


@dataclass(frozen=True)
class OutputReport:
    index: int
    shape: tuple[int, ...]
    dtype: str
    max_abs_err: float
    max_rel_err: float
    bad: int  # elements outside tolerance
    nan: int  # NaN/inf elements in the kernel's output where the reference is finite
    rtol: float = 0.0
    atol: float = 0.0  # the absolute tolerance used: the given atol times the output's scale
    worst_row_err: float = 0.0  # largest relative L2 error of a row


def _tolerance_line(source: str) -> int | None:
    try:
        tree = parse_module(source)
    except SyntaxError:
        return None
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Name) and t.id == "TOLERANCE" for t in targets):
            return node.lineno
    return None


def validate_tolerance(raw: Any, source: str, path: str) -> dict[str, float] | None:
    """The module's TOLERANCE as {"rtol", "atol"} floats, or None when it has none; a KernelError (exit 3) naming the
    file and TOLERANCE's line when it is malformed, non-finite, negative or looser than MAX_TOLERANCE."""
    if raw is None:
        return None
    line = _tolerance_line(source)

    def bad(why: str) -> KernelError:
        return KernelError(
            f"TOLERANCE {why}",
            path=path,
            line=line,
            hint=f'write TOLERANCE = {{"rtol": r, "atol": a}} with 0 <= r, a <= {MAX_TOLERANCE:g} '
            "(atol is relative to the output's largest magnitude)",
        )

    if not isinstance(raw, Mapping):
        raise bad(f"must be a dict, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in ("rtol", "atol"))
    if unknown:
        raise bad(f"has unknown keys {unknown}")
    out: dict[str, float] = {}
    for key, value in raw.items():
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise bad(f"{key}={value!r} is not a number") from None
        if not math.isfinite(v):
            raise bad(f"{key}={v} is not finite")
        if v < 0:
            raise bad(f"{key}={v:g} is negative")
        if v > MAX_TOLERANCE:
            raise bad(f"{key}={v:g} is looser than the bound {MAX_TOLERANCE:g}")
        out[str(key)] = v
    return out


def tolerance_for(dtype: str, override: Mapping[str, float] | None) -> tuple[float, float]:
    rtol, atol = DEFAULT_TOLERANCE.get(dtype, (0.0, 0.0))
    if override:
        rtol = float(override.get("rtol", rtol))
        atol = float(override.get("atol", atol))
    return rtol, atol


def _rows(a: np.ndarray) -> np.ndarray:
    """`a` as rows along its last axis longer than 1: trailing size-1 axes are not rows (an (M, 1) column of per-row
    statistics is one row of M values, not M rows of one, whose "relative L2 error" would be a bare relative error
    with no absolute tolerance: a mean near zero failed on rounding alone); a scalar is one row."""
    shape = a.shape
    while len(shape) > 1 and shape[-1] == 1:
        shape = shape[:-1]
    return a.reshape(-1, shape[-1]) if shape and a.size else a.reshape(1, -1)


def _worst_row(o: np.ndarray, r: np.ndarray, floor: float) -> tuple[float, int]:
    """The largest relative L2 error over rows (last axis) whose reference norm is above `floor`, and its row."""
    if o.size == 0:
        return 0.0, -1
    orows, rrows = _rows(o), _rows(r)
    ref_norm = np.linalg.norm(rrows, axis=1)
    err_norm = np.linalg.norm(orows - rrows, axis=1)
    keep = ref_norm > floor
    if not keep.any():
        return 0.0, -1
    rel = np.where(keep, err_norm / np.where(keep, ref_norm, 1.0), 0.0)
    k = int(np.argmax(rel))
    return float(rel[k]), k


def compare(index: int, out: Any, ref: Any, tol: Mapping[str, float] | None) -> tuple[OutputReport, str]:
    """Compare one output leaf with its reference; returns the report and '' or the reason it fails."""
    o_np, r_np = np.asarray(out), np.asarray(ref)
    if o_np.shape != r_np.shape or o_np.dtype != r_np.dtype:
        rep = OutputReport(index, tuple(o_np.shape), str(o_np.dtype), math.inf, math.inf, o_np.size, 0)
        return rep, (
            f"output {index}: kernel gives {o_np.dtype}{list(o_np.shape)}, reference {r_np.dtype}{list(r_np.shape)}"
        )
    dtype = str(o_np.dtype)
    o = o_np.astype(np.float64)
    r = r_np.astype(np.float64)
    rtol, atol_rel = tolerance_for(dtype, tol)
    finite_ref = np.isfinite(r)
    scale = float(np.abs(r[finite_ref]).max()) if finite_ref.any() else 1.0
    scale = min(scale, 1.0) if scale > 0 else 1.0  # atol shrinks with small outputs, never grows past the given
    atol = atol_rel * scale
    nonfinite = int(np.sum((~np.isfinite(o) & finite_ref) | np.isnan(o)))
    diff = np.abs(o - r)
    diff = np.where(np.isnan(diff), np.inf, diff)
    bad = int(np.sum(diff > atol + rtol * np.abs(r)))
    finite = np.isfinite(diff)
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = (
        max_abs / max(float(np.abs(r[finite_ref]).max()) if finite_ref.any() else 1.0, 1e-30)
        if math.isfinite(max_abs)
        else math.inf
    )
    ok_rows = nonfinite == 0 and finite_ref.all()
    width = max(_rows(o).shape[-1], 1)
    row_err, row = _worst_row(o, r, atol * math.sqrt(width)) if ok_rows else (0.0, -1)
    rep = OutputReport(index, tuple(o.shape), dtype, max_abs, max_rel, bad, nonfinite, rtol, atol, row_err)
    tol_text = f"rtol={rtol:g} atol={atol_rel:g}x{scale:.3g}"
    if np.isnan(r).any():
        return rep, f"output {index}: the reference itself produced NaN; fix make_inputs or the reference"
    if nonfinite:
        return rep, f"output {index}: {nonfinite} NaN/inf elements (unwritten output or overflow)"
    if bad:
        worst = float(diff[finite].max()) if finite.any() else math.inf
        return rep, f"output {index}: {bad}/{o.size} elements outside {tol_text} (max abs err {worst:.3g})"
    if row_err > rtol:
        return rep, (
            f"output {index}: row {row} (last axis) has relative L2 error {row_err:.3g} > rtol={rtol:g} although "
            "each element is within tolerance: a systematic error (small terms dropped or rounded away)"
        )
    return rep, ""
