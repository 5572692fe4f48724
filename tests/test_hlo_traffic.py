"""`cost_model.hlo_traffic`: the HBM traffic of a compiled XLA program, read off its HLO text."""

from __future__ import annotations

from pallasopt.cost_model.hlo_traffic import hbm_traffic_bytes

# The entry computation libtpu 0.0.42.1 compiles for fused_26_l2_normalize's reference on v5e (backend configs cut):
# x (32 MiB bf16) is read by the norm's reduction and prefetched into VMEM (S(1)) at the same time; the last fusion
# reads it from VMEM and writes the output to HBM.
L2_HLO = """HloModule jit_reference

%fused_computation.2 (param_0: bf16[16384,1024]) -> f32[16384] {
  %param_0 = bf16[16384,1024]{1,0} parameter(0)
  ROOT %reduce = f32[16384]{0} reduce(%param_0, %c), dimensions={1}
}

ENTRY %main.3 (x.1: bf16[16384,1024]) -> bf16[16384,1024] {
  %x.1 = bf16[16384,1024]{1,0:T(8,128)(2,1)} parameter(0), sharding={replicated}
  %copy-start = (bf16[16384,1024]{1,0:T(8,128)(2,1)S(1)}, bf16[16384,1024]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%x.1)
  %fusion = f32[16384]{0:T(1024)S(1)} fusion(%x.1), kind=kLoop, calls=%fused_computation.2, backend_config={"a":[]}
  %sqrt_maximum_fusion = f32[16384]{0:T(1024)S(1)} fusion(%fusion), kind=kLoop, calls=%fused_computation.4
  %copy-done = bf16[16384,1024]{1,0:T(8,128)(2,1)S(1)} copy-done(%copy-start)
  ROOT %fusion.1 = bf16[16384,1024]{1,0:T(8,128)(2,1)} fusion(%copy-done, %sqrt_maximum_fusion), kind=kLoop, calls=%f
}
"""

MIB = 1 << 20


def test_vmem_arrays_and_fused_ops_are_not_hbm_traffic() -> None:
    # x read twice from HBM (reduction, prefetch), the output written once; the norms and the VMEM copy are free
    assert hbm_traffic_bytes(L2_HLO) == 3 * 32 * MIB


def test_an_operand_read_twice_by_one_instruction_counts_once_and_tuples_count_their_hbm_parts() -> None:
    hlo = """ENTRY %main (a: f32[256,128], b: f32[128]) -> (f32[256,128], s32[4]) {
  %a = f32[256,128]{1,0} parameter(0)
  %b = f32[128]{0} parameter(1)
  %f = (f32[256,128]{1,0}, s32[4]{0}) fusion(%a, %a, %b), kind=kLoop, calls=%c
  %g = f32[256,128]{1,0} get-tuple-element(%f), index=0
  %h = f32[256,128]{1,0} copy(%g)
  ROOT %t = (f32[256,128]{1,0}, s32[4]{0}) tuple(%h, %b)
}"""
    fusion = 256 * 128 * 4 + 128 * 4 + (256 * 128 * 4 + 16)
    copy = 2 * 256 * 128 * 4
    assert hbm_traffic_bytes(hlo) == fusion + copy


def test_no_entry_computation_is_none() -> None:
    assert hbm_traffic_bytes("HloModule m\n") is None
