from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TEST_KERNELS = ROOT / "tests" / "kernels"

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")


def bench_script(name: str) -> Any:
    """`bench/NAME.py` loaded as module `NAME` (registered in sys.modules: bench scripts import each other)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def example_irs():
    from pallasopt.ir.kernel_ir import KernelIR

    return {p.stem: KernelIR.from_file(p) for p in EXAMPLES}
