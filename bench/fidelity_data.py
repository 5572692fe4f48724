"""Published TPU measurements to check the cost tiers against: tokamax's autotuning results and the JAX Pallas TPU
tutorials' tables, read as data, split once into a training and a validation half.

tokamax (the `fidelity` extra) ships `tokamax/data/autotuning/<device>/<op>.json`: problem key (a JSON string of
shapes, dtypes, mask, ...) -> config (a JSON string) -> {"evaluation_times_ms": [5 device times], ...}. We read them
from the installed package (`importlib.resources`), or from a directory in that layout (the tests' fixture).

The split: a point's half is decided by the SHA-256 of `device/op/problem key` (`split_of`), fixed before anything
was fitted; `bench/fidelity_split.json` records it for every point of tokamax 0.0.12 so a change of the rule or of
the data shows in a diff. Fit constants on "train" only, report on "validation" only.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SPLIT_FILE = Path(__file__).resolve().parent / "fidelity_split.json"

# tokamax op file -> op family (the kernels whose timings we reproduce; XLA variants are the "vs XLA" baselines).
FAMILIES = {
    "pallas_mosaic_tpu_flash_attention": "flash_attention",
    "pallas_mosaic_tpu_flash_attention_vjp": "flash_attention_bwd",
    "pallas_mosaic_tpu_ragged_dot": "ragged_dot",
    "pallas_mosaic_tpu_linear_softmax_cross_entropy_loss": "cross_entropy",
    "xla_chunked_dot_product_attention": "xla_attention",
    "ragged_dot": "xla_or_default_ragged_dot",
}


@dataclass(frozen=True)
class Point:
    """One measured (problem, config) of tokamax's autotuning data."""

    device: str  # tokamax's device directory: "tpu7x", "tpu_v5_lite"
    op: str  # the JSON file's stem
    key: str  # the problem key, as tokamax wrote it
    config: str  # the config, as tokamax wrote it ("" when the file records none)
    times_ms: tuple[float, ...]
    problem: dict[str, Any] = field(compare=False, repr=False, default_factory=dict)

    @property
    def measured_ms(self) -> float:
        """The median of the device times (XProf device time, no host dispatch)."""
        return float(np.median(self.times_ms))

    @property
    def family(self) -> str:
        return FAMILIES.get(self.op, self.op)

    @property
    def split(self) -> str:
        return split_of(self.device, self.op, self.key)

    @property
    def config_dict(self) -> dict[str, Any]:
        return json.loads(self.config) if self.config else {}


def split_of(device: str, op: str, key: str) -> str:
    """'train' or 'validation', from the SHA-256 of the problem (every config of one problem lands in one half)."""
    digest = hashlib.sha256(f"{device}/{op}/{key}".encode()).digest()
    return "train" if digest[0] % 2 == 0 else "validation"


def tokamax_root() -> Path:
    """`tokamax/data/autotuning` of the installed package (pip install 'pallasopt[fidelity]')."""
    from importlib.resources import files

    return Path(str(files("tokamax") / "data" / "autotuning"))


def load_points(root: Path | None = None, ops: Iterable[str] | None = None) -> tuple[list[Point], list[str]]:
    """Every measured point under `root` (default: the installed tokamax), and notes on files that hold none."""
    base = tokamax_root() if root is None else root
    wanted = set(ops) if ops is not None else None
    points: list[Point] = []
    notes: list[str] = []
    for path in sorted(base.glob("*/*.json")):
        device, op = path.parent.name, path.stem
        if wanted is not None and op not in wanted:
            continue
        text = path.read_text()
        if not text.strip():
            notes.append(f"{device}/{op}.json is empty in this tokamax release")
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            notes.append(f"{path}:{e.lineno}: not JSON ({e.msg}); skipped")
            continue
        for key, configs in data.items():
            for config, result in (configs or {}).items():
                times = tuple(float(t) for t in (result or {}).get("evaluation_times_ms") or ())
                if times:
                    points.append(Point(device, op, key, config, times, json.loads(key)))
    return points, notes


def split_table(points: Sequence[Point]) -> dict[str, str]:
    """`device/op/sha256(key)[:16]` -> half, the committed record of the split."""
    out = {}
    for p in points:
        h = hashlib.sha256(p.key.encode()).hexdigest()[:16]
        out[f"{p.device}/{p.op}/{h}"] = p.split
    return dict(sorted(out.items()))


# --- metrics ----------------------------------------------------------------------------------------------------


def abs_errors(pred: Sequence[float], meas: Sequence[float]) -> np.ndarray:
    """|pred / measured - 1| per point."""
    p, m = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    return np.abs(p / m - 1.0)


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None with fewer than 3 points."""
    if len(a) < 3:
        return None

    def ranks(x: Sequence[float]) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):  # ties share their mean rank
            idx = np.nonzero(x == v)[0]
            r[idx] = r[idx].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def pair_agreement(
    groups: Sequence[Sequence[tuple[float, float]]], margin: float = 0.15
) -> tuple[int, int]:
    """Over pairs within each group (configs of one problem: (predicted, measured)) whose measured times differ by
    more than `margin`, how many the prediction orders as measured (a predicted tie counts as wrong): (agreeing, pairs)."""
    agree = total = 0
    for g in groups:
        for i in range(len(g)):
            for j in range(i + 1, len(g)):
                (pi, mi), (pj, mj) = g[i], g[j]
                if max(mi, mj) <= (1 + margin) * min(mi, mj):
                    continue
                total += 1
                agree += (pi - pj) * (mi - mj) > 0  # a tie in the prediction orders nothing
    return agree, total


def config_pairs(rows: Sequence[dict[str, Any]], field: str, margin: float = 0.15) -> dict[str, Any]:
    """Config-pair ordering of one tier over result rows: rows of one problem (`key`, else `name`) that have a time in
    `field` (e.g. "model_ms", "compiler_ms") are paired; pairs whose measured times differ by more than `margin` are
    scored. Returns {"agree", "pairs", "problems" (with >= 2 configs timed), "wrong": [(problem, fast config, slow
    config)] for each pair the tier orders against the measurement}. A row without the tier's time drops out, so
    the tiers may score different pair counts (each says its own)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get(field) is not None and r.get("measured_ms"):
            groups.setdefault(str(r.get("key") or r.get("name") or ""), []).append(r)
    wrong: list[tuple[str, str, str]] = []
    agree = total = 0
    for problem, g in sorted(groups.items()):
        a, t = pair_agreement([[(float(r[field]), float(r["measured_ms"])) for r in g]], margin)
        agree, total = agree + a, total + t
        if a < t:
            for i, ri in enumerate(g):
                for rj in g[i + 1 :]:
                    fast, slow = (ri, rj) if ri["measured_ms"] < rj["measured_ms"] else (rj, ri)
                    if slow["measured_ms"] > (1 + margin) * fast["measured_ms"] and fast[field] >= slow[field]:
                        wrong.append((problem, str(fast.get("config", "")), str(slow.get("config", ""))))
    return {
        "agree": agree,
        "pairs": total,
        "problems": sum(1 for g in groups.values() if len(g) >= 2),
        "wrong": wrong,
    }


def summary(pred: Sequence[float], meas: Sequence[float]) -> dict[str, Any]:
    """n, median and p90 |error|, median signed ratio, Spearman."""
    if not pred:
        return {"n": 0}
    err = abs_errors(pred, meas)
    ratio = np.asarray(pred, dtype=float) / np.asarray(meas, dtype=float)
    return {
        "n": len(pred),
        "median_abs_err": float(np.median(err)),
        "p90_abs_err": float(np.percentile(err, 90)),
        "median_ratio": float(np.median(ratio)),
        "spearman": spearman(pred, meas),
    }


def geomean(xs: Sequence[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def write_results(
    out_dir: str | Path, name: str, argv: Sequence[str], script: str | None = None, **fields: Any
) -> Path:
    """Write a results file `<name>-<date>.json` (date, the command that made it, then `fields`) and print its summary.
    `script`: the bench script's file name when it is not `<name>` in snake case."""
    import datetime as dt

    script = script or f"{name.replace('-', '_')}.py"
    result = {"date": dt.date.today().isoformat(), "command": f"python bench/{script} " + " ".join(argv)}
    result.update(fields)
    out = Path(out_dir) / f"{name}-{result['date']}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result.get("summary"), indent=1))
    print(f"wrote {out}")
    return out

