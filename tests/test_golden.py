"""Golden recipes: for each example, every choice each pass offers and the lines it changes.

A refactor that changes what a pass does shows up here as a diff. Regenerate on purpose with
`PALLASOPT_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`.
"""

from __future__ import annotations

import difflib
import json
import os

import pytest
from conftest import EXAMPLES, ROOT

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.passes.registry import PASSES

GOLDEN = ROOT / "tests" / "golden"


def recipes(ir) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in PASSES:
        for choice in p.choices(ir, get_chip("v5e")):
            try:
                new = choice.apply(ir)
            except PassNotApplicable as e:
                out[choice.spec()] = [f"declined: {e.reason}"]
                continue
            out[choice.spec()] = [
                line.rstrip()
                for line in difflib.unified_diff(ir.source.splitlines(), new.source.splitlines(), lineterm="", n=0)
                if line[:1] in "+-" and not line.startswith(("+++", "---"))
            ]
    return out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_golden_recipes(path, example_irs) -> None:
    got = recipes(example_irs[path.stem])
    golden = GOLDEN / f"{path.stem}.json"
    if os.environ.get("PALLASOPT_UPDATE_GOLDEN"):
        golden.write_text(json.dumps(got, indent=1) + "\n")
    want = json.loads(golden.read_text())
    assert got == want
