"""Kernels written in styles the bench suite does not use (tests/kernels/styles): loading, facts and passes."""

from __future__ import annotations

import pytest
from conftest import TEST_KERNELS

from pallasopt.cost_model.hardware import get_chip
from pallasopt.errors import PassNotApplicable
from pallasopt.harness.check import check_many
from pallasopt.ir.kernel_ir import KernelIR
from pallasopt.passes.accumulate import AccumulateInScratchPass
from pallasopt.passes.registry import parse_pipeline
from pallasopt.workload import inspect_source

STYLES = TEST_KERNELS / "styles"
V5E = get_chip("v5e")


def load(name: str) -> KernelIR:
    return KernelIR.from_file(STYLES / f"{name}.py")


def apply(ir: KernelIR, spec: str) -> KernelIR:
    (p,) = parse_pipeline(spec)
    return p.apply(ir)


@pytest.mark.parametrize("path", sorted(STYLES.glob("*.py")), ids=lambda p: p.stem)
def test_style_kernels_load_and_trace(path) -> None:
    ir = KernelIR.from_file(path)
    assert ir.calls and all(c.grid for c in ir.calls)


def test_entry_reaching_pallas_call_through_a_class_method() -> None:
    # `softmax` builds a RowSoftmax whose __call__ calls pl.pallas_call: the class is a helper, never the entry.
    path = STYLES / "class_softmax.py"
    assert inspect_source(path.read_text(), str(path)).entry == "softmax"


def test_where_reset_of_scratch_state_makes_the_axis_sequential() -> None:
    # `carry = jnp.where(program_id(1) == 0, 0, carry_ref[...])` carries state along axis 1 without any pl.when:
    # "parallel" there would split the carry across megacore TensorCores.
    ir = load("carried_cumsum")
    assert ir.calls[0].body.conditional_axes == (1,)
    assert apply(ir, "dimension-semantics").calls[0].dimension_semantics == ("parallel", "arbitrary")
    # A where on an input read (ragged-edge masking) is not state: only the pl.when axis of the reduction counts.
    assert load("ragged_rowsum").calls[0].body.conditional_axes == (1,)


def test_shared_module_compiler_params_are_edited_at_the_call_site() -> None:
    ir = load("factory_gelu")
    assert ir.calls[0].dimension_semantics == ("parallel", "arbitrary")
    definition = 'PARAMS = pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))'
    sem = apply(ir, "dimension-semantics")
    assert sem.calls[0].dimension_semantics == ("parallel", "parallel")
    assert definition in sem.source and "PARAMS.replace(" in sem.source
    # grid-order must carry the semantics along with the axes (it used to leave a shared constant unpermuted).
    new = apply(ir, "grid-order{call=0,order=1:0}")
    assert new.calls[0].grid == (ir.calls[0].grid[1], ir.calls[0].grid[0])
    assert new.calls[0].dimension_semantics == ("arbitrary", "parallel")
    assert definition in new.source
    (result,) = check_many([new.source], new.path)
    assert result.ok, result.message


def test_accumulate_in_scratch_skips_outputs_that_are_only_written() -> None:
    # The output block is written once from an existing f32 scratch: a second accumulator would only add a copy.
    path = STYLES / "squeezed_bmm.py"
    source = path.read_text().replace("def _bmm_kernel(*refs):", "def _bmm_kernel(x_ref, y_ref, o_ref, acc_ref):")
    source = source.replace("    x_ref, y_ref, o_ref, acc_ref = refs\n", "")
    ir = KernelIR.from_source(source, str(path))
    assert AccumulateInScratchPass.choices(ir, V5E) == ()
    with pytest.raises(PassNotApplicable, match="only writes"):
        AccumulateInScratchPass(call=0, output=0).apply(ir)
    # A kernel that accumulates in its output ref is still offered the rewrite.
    assert AccumulateInScratchPass.choices(load("jit_static_matmul"), V5E) == (AccumulateInScratchPass(0, 0),)
