"""The result compiles for the target at the module's default dims (`optimize._target_gate`, `Tiers.target_compile`):
the compiler tier compiles at reduced dims and a model-ranked search not at all, so a candidate whose buffers grow
with the dims can rank first and overflow VMEM at the real size (llm_ragged_paged_attention's best of 2026-12-05 did,
on a v5e). The gate tries the verified candidates in rank order and keeps the input kernel when none compiles."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_search import MATMUL, FakeTiers

from pallasopt.cost_model.compiler import libtpu_available
from pallasopt.cost_model.hardware import get_chip
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.optimize import GATE_TRIES, optimize
from pallasopt.search.tiers import TierResult, Tiers

STASH = Path(__file__).parent / "kernels" / "gate" / "row_stash.py"


class Gated(FakeTiers):
    """FakeTiers whose full-size compile refuses the tiles in `too_big` (their row block) and counts its calls."""

    def __init__(self, too_big: frozenset[int]) -> None:
        super().__init__()
        self.too_big = too_big
        self.gated: list[int] = []

    def target_compile(self, ir: KernelIR) -> TierResult:
        bm = self.bm(ir)
        self.gated.append(bm)
        if bm in self.too_big:
            return TierResult("compiler", False, None, "vmem_oom: fake 97.6 MiB > 96 MiB", {"error_kind": "vmem_oom"})
        return TierResult("compiler", True, None, "compiles at the default dims")


def _run(folder: Path, tiers: FakeTiers):
    folder.mkdir(parents=True, exist_ok=True)
    kernel = folder / "matmul.py"
    kernel.write_text(MATMUL.read_text())
    return optimize(kernel, beam=3, depth=2, db_path=folder / "k.db", evaluator=tiers, jobs=1, write_output=False)


def _bm_of(result) -> int:
    return FakeTiers.bm(KernelIR.from_source(result.source, str(MATMUL)))


def test_a_best_that_does_not_compile_at_the_default_dims_gives_way_to_the_next(tmp_path: Path) -> None:
    free = _run(tmp_path / "a", Gated(frozenset()))
    assert free.recipe and not free.notes
    tiers = Gated(frozenset({_bm_of(free)}))
    out = _run(tmp_path / "b", tiers)
    assert out.correct and out.recipe != free.recipe and _bm_of(out) != _bm_of(free)
    assert tiers.gated[0] == _bm_of(free)  # the search's best first, then the next verified one
    assert any("does not compile for v5e at the default dims (vmem_oom" in n for n in out.notes)
    assert out.speedup is not None and free.speedup is not None and out.speedup <= free.speedup


def test_when_no_candidate_tried_compiles_the_input_kernel_is_kept(tmp_path: Path) -> None:
    every = frozenset({8, 16, 32, 64, 128, 256, 512, 1024, 2048})
    tiers = Gated(every)
    out = _run(tmp_path, tiers)
    assert out.recipe == () and out.speedup == pytest.approx(1.0)
    assert 1 < len(tiers.gated) <= GATE_TRIES and len(set(tiers.gated)) == len(tiers.gated)  # each verified one once
    assert out.notes[-1] == "no verified candidate tried compiles there: the input kernel is kept"


@pytest.mark.tpu_compiler
@pytest.mark.skipif(not libtpu_available(), reason="needs libtpu (extra 'tpu')")
def test_the_real_gate_catches_a_scratch_that_only_overflows_at_the_default_dims() -> None:
    tiers = Tiers(get_chip("v5e"))
    ir = KernelIR.from_file(STASH)
    r = tiers.target_compile(ir)
    assert r is not None and not r.ok and r.data["error_kind"] == "vmem_oom"
    small_source = STASH.read_text().replace("N=32768", "N=4096")  # 4 MiB of scratch: fits
    small = tiers.target_compile(KernelIR.from_source(small_source, str(STASH)))
    assert small is not None and small.ok
