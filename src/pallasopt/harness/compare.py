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
from collections.abc import Iterator, Mapping
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


# Rows compared at once: each output is read in slices of about this many elements, so the ~20 float64 passes a
# comparison makes stay in cache: a (8192, 8192) f32 output took 5.9 s per compare unsliced, 1.3 s in slices of 2^13
# (2.1 s at 2^15, 3.1 s at 2^18; 2026-12-03, this 2-core machine, beside another job).
COMPARE_CHUNK_ELEMS = 1 << 13


@dataclass
class _Tally:
    """What a comparison has seen so far, over the slices of rows read."""

    nonfinite: int = 0
    bad: int = 0
    max_abs: float = 0.0  # NaN counted as inf
    worst_finite: float = -math.inf
    ref_nonfinite: bool = False
    ref_nan: bool = False
    row_err: float = -1.0
    row: int = -1
    any_kept: bool = False

    def add(self, o: np.ndarray, r: np.ndarray, first_row: int, atol: float, rtol: float, floor: float) -> None:
        finite_ref = np.isfinite(r)
        self.ref_nonfinite |= not bool(finite_ref.all())
        self.ref_nan |= bool(np.isnan(r).any())
        self.nonfinite += int(np.sum((~np.isfinite(o) & finite_ref) | np.isnan(o)))
        diff = np.abs(o - r)
        diff = np.where(np.isnan(diff), np.inf, diff)
        self.bad += int(np.sum(diff > atol + rtol * np.abs(r)))
        if diff.size:
            self.max_abs = max(self.max_abs, float(diff.max()))
            finite = diff[np.isfinite(diff)]
            if finite.size:
                self.worst_finite = max(self.worst_finite, float(finite.max()))
        ref_norm = np.linalg.norm(r, axis=1)
        err_norm = np.linalg.norm(o - r, axis=1)
        keep = ref_norm > floor
        self.any_kept |= bool(keep.any())
        rel = np.where(keep, err_norm / np.where(keep, ref_norm, 1.0), 0.0)
        if rel.size:
            k = int(np.argmax(rel))
            if float(rel[k]) > self.row_err:  # the first row with the largest error, as one argmax over all rows
                self.row_err, self.row = float(rel[k]), first_row + k


def _slices(rows: np.ndarray) -> Iterator[tuple[int, slice]]:
    """(first row, rows) of each slice of about COMPARE_CHUNK_ELEMS elements (at least one row) of a 2-D array."""
    step = max(1, COMPARE_CHUNK_ELEMS // max(rows.shape[1], 1))
    for i in range(0, rows.shape[0], step):
        yield i, slice(i, i + step)


def _finite_absmax(r_rows: np.ndarray) -> float | None:
    """The largest finite |ref| (None when there is none), read slice by slice."""
    best: float | None = None
    for _, rows in _slices(r_rows):
        r = np.abs(r_rows[rows].astype(np.float64))
        r = r[np.isfinite(r)]
        if r.size:
            best = float(r.max()) if best is None else max(best, float(r.max()))
    return best


def compare(index: int, out: Any, ref: Any, tol: Mapping[str, float] | None) -> tuple[OutputReport, str]:
    """Compare one output leaf with its reference; returns the report and '' or the reason it fails.

    Every figure is taken in float64, over slices of rows (`COMPARE_CHUNK_ELEMS`)."""
    o_np, r_np = np.asarray(out), np.asarray(ref)
    if o_np.shape != r_np.shape or o_np.dtype != r_np.dtype:
        rep = OutputReport(index, tuple(o_np.shape), str(o_np.dtype), math.inf, math.inf, o_np.size, 0)
        return rep, (
            f"output {index}: kernel gives {o_np.dtype}{list(o_np.shape)}, reference {r_np.dtype}{list(r_np.shape)}"
        )
    dtype = str(o_np.dtype)
    rtol, atol_rel = tolerance_for(dtype, tol)
    o_rows, r_rows = _rows(o_np), _rows(r_np)
    absmax = _finite_absmax(r_rows)
    scale = absmax if absmax is not None else 1.0
    scale = min(scale, 1.0) if scale > 0 else 1.0  # atol shrinks with small outputs, never grows past the given
    atol = atol_rel * scale
    width = max(o_rows.shape[-1], 1)
    t = _Tally()
    for i, rows in _slices(o_rows):
        t.add(o_rows[rows].astype(np.float64), r_rows[rows].astype(np.float64), i, atol, rtol, atol * math.sqrt(width))
    max_abs = t.max_abs
    max_rel = max_abs / max(absmax if absmax is not None else 1.0, 1e-30) if math.isfinite(max_abs) else math.inf
    ok_rows = t.nonfinite == 0 and not t.ref_nonfinite and o_np.size > 0 and t.any_kept
    row_err, row = (t.row_err, t.row) if ok_rows else (0.0, -1)
    rep = OutputReport(index, tuple(o_np.shape), dtype, max_abs, max_rel, t.bad, t.nonfinite, rtol, atol, row_err)
    tol_text = f"rtol={rtol:g} atol={atol_rel:g}x{scale:.3g}"
    if t.ref_nan:
        return rep, f"output {index}: the reference itself produced NaN; fix make_inputs or the reference"
    if t.nonfinite:
        return rep, f"output {index}: {t.nonfinite} NaN/inf elements (unwritten output or overflow)"
    if t.bad:
        worst = t.worst_finite if t.worst_finite > -math.inf else math.inf
        return rep, f"output {index}: {t.bad}/{o_np.size} elements outside {tol_text} (max abs err {worst:.3g})"
    if row_err > rtol:
        return rep, (
            f"output {index}: row {row} (last axis) has relative L2 error {row_err:.3g} > rtol={rtol:g} although "
            "each element is within tolerance: a systematic error (small terms dropped or rounded away)"
        )
    return rep, ""
