"""The fidelity bench's data layer on a tiny fixture in tokamax's autotuning format (tokamax itself not needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from fidelity_data import config_pairs, load_points, pair_agreement, spearman, split_of, summary  # noqa: E402
from fidelity_modules import Unsupported, module_for  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "tokamax" / "autotuning"


def test_points_are_read_with_their_median_time_and_empty_files_are_noted() -> None:
    points, notes = load_points(FIXTURE)
    assert len(points) == 4  # a problem with no configs contributes nothing
    assert {p.family for p in points} == {"flash_attention", "ragged_dot"}
    fa = sorted(p.measured_ms for p in points if p.family == "flash_attention")
    assert fa == [1.0, 2.0, 3.0]
    assert notes == ["tpu7x/ragged_dot.json is empty in this tokamax release"]


def test_split_is_by_problem_and_deterministic() -> None:
    points, _ = load_points(FIXTURE)
    by_key: dict[str, set[str]] = {}
    for p in points:
        by_key.setdefault(p.key, set()).add(p.split)
    assert all(len(s) == 1 for s in by_key.values())  # configs of one problem share a half
    assert split_of("tpu7x", "op", "k") == split_of("tpu7x", "op", "k")
    halves = {split_of("d", "o", str(i)) for i in range(40)}
    assert halves == {"train", "validation"}


def test_committed_split_matches_the_rule() -> None:
    import json

    table = json.loads((ROOT / "bench" / "fidelity_split.json").read_text())
    assert len(table) > 100
    # Every committed entry's half is what split_of gives for its key; the key itself is stored as a hash, so
    # re-derive only the counts: both halves hold a large share.
    counts = {h: sum(1 for v in table.values() if v == h) for h in ("train", "validation")}
    assert min(counts.values()) > 0.35 * len(table)


def test_metrics() -> None:
    s = summary([1.1, 0.8, 2.0], [1.0, 1.0, 2.0])
    assert s["median_abs_err"] == pytest.approx(0.1) and s["p90_abs_err"] == pytest.approx(0.18)
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    # Pairs within 15% of each other are not counted; the other two are ordered right once.
    assert pair_agreement([[(1.0, 1.0), (2.0, 1.1), (1.5, 3.0)]]) == (1, 2)


def test_modules_are_written_for_supported_points_only() -> None:
    points, _ = load_points(FIXTURE)
    fa = next(p for p in points if p.family == "flash_attention")
    src = module_for(fa)
    compile(src, "<fa>", "exec")
    assert "block_q=" in src and "def make_inputs(key, B=2" in src
    rd = next(p for p in points if p.family == "ragged_dot")
    with pytest.raises(Unsupported):  # the fixture's problem has no dimension numbers: not the forward layout
        module_for(rd)


def test_config_pairs_per_tier() -> None:
    rows = [  # one problem "p" with three configs, one "q" with two; the compiler has no time for a2
        {"key": "p", "config": "a1", "measured_ms": 1.0, "model_ms": 1.0, "compiler_ms": 3.0},
        {"key": "p", "config": "a2", "measured_ms": 2.0, "model_ms": 2.5, "compiler_ms": None},
        {"key": "p", "config": "a3", "measured_ms": 2.1, "model_ms": 1.9, "compiler_ms": 2.0},
        {"key": "q", "config": "b1", "measured_ms": 5.0, "model_ms": 4.0, "compiler_ms": 4.0},
        {"key": "q", "config": "b2", "measured_ms": 10.0, "model_ms": 4.0, "compiler_ms": 9.0},
    ]
    m = config_pairs(rows, "model_ms")
    # p: (a1, a2) and (a1, a3) are > 15% apart and ordered right; (a2, a3) is within 15%: not scored.
    # q: the model ties b1 and b2 -- a tie orders nothing, so it is wrong.
    assert (m["agree"], m["pairs"], m["problems"]) == (2, 3, 2)
    assert m["wrong"] == [("q", "b1", "b2")]
    c = config_pairs(rows, "compiler_ms")
    # p without a2: (a1, a3) ordered wrong (3.0 > 2.0); q ordered right.
    assert (c["agree"], c["pairs"]) == (1, 2) and c["wrong"] == [("p", "a1", "a3")]
    assert pair_agreement([[(1.0, 1.0), (1.0, 2.0)]]) == (0, 1)  # a predicted tie is not an ordering


def test_tutorial_matmul_points_pair_up_and_follow_the_split_rule() -> None:
    import json

    from fidelity_tokamax import with_params

    points = json.loads((ROOT / "bench" / "fidelity_tutorials.json").read_text())["points"]
    mm = [t for t in points if t["family"] == "dense_matmul"]
    by_problem: dict[str, list[dict]] = {}
    for t in mm:
        by_problem.setdefault(t["problem"], []).append(t)
        assert t["split"] == split_of("v5e", "tutorial_matmul", t["problem"])
    assert len(by_problem) == 9 and all(len(g) == 2 for g in by_problem.values())
    src = (ROOT / mm[0]["module"]).read_text()
    out = with_params(src, mm[0]["params"])
    assert f"BM = {mm[0]['params']['BM']}\n" in out and "TRANSPOSE_RHS = False" in out
    compile(out, "<tutorial>", "exec")
    with pytest.raises(ValueError):
        with_params(src, {"NOT_THERE": 1})
