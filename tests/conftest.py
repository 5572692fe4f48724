from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TEST_KERNELS = ROOT / "tests" / "kernels"

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")


@pytest.fixture(scope="session")
def example_irs():
    from pallasopt.ir.kernel_ir import KernelIR

    return {p.stem: KernelIR.from_file(p) for p in EXAMPLES}
