"""The chip table: names, lookups, native tiles, and that the numbers agree with each other and with JAX."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pallasopt.cost_model.hardware import CHIPS, Chip, UnknownTarget, get_chip, native_tile

TPUS = ("v4", "v5e", "v5p", "v6e", "tpu7x")
GPUS = ("h100", "h200")
ROOT = Path(__file__).resolve().parents[1]


def test_every_target_is_there() -> None:
    assert set(CHIPS) == {*TPUS, *GPUS}
    assert all(CHIPS[n].name == n for n in CHIPS)
    assert [n for n in CHIPS if CHIPS[n].is_gpu] == list(GPUS)


def test_get_chip_and_unknown_target() -> None:
    assert get_chip("v5e") is CHIPS["v5e"]
    assert get_chip(" V6E ") is CHIPS["v6e"]
    assert get_chip("ironwood") is CHIPS["tpu7x"]
    with pytest.raises(UnknownTarget) as err:
        get_chip("v9z")
    msg = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "\n" not in msg and "'v9z'" in msg
    assert all(name in msg for name in CHIPS)


def test_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        CHIPS["x"] = CHIPS["v5e"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        CHIPS["v5e"].clock_hz = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("dtype", "tile"),
    [
        ("float32", (8, 128)),
        (np.float32, (8, 128)),
        ("bfloat16", (16, 128)),
        ("float16", (16, 128)),
        ("int8", (32, 128)),
        (np.dtype("int8"), (32, 128)),
        ("float8_e4m3fn", (32, 128)),
        ("int4", (64, 128)),
        ("int32", (8, 128)),
    ],
)
def test_native_tile(dtype: object, tile: tuple[int, int]) -> None:
    assert native_tile(dtype) == tile
    assert CHIPS["v5e"].native_tile(dtype) == tile
    assert CHIPS["h100"].native_tile(dtype) == (1, 1)


def test_native_tile_of_a_jax_dtype() -> None:
    jnp = pytest.importorskip("jax.numpy")
    assert native_tile(jnp.bfloat16) == (16, 128)
    assert native_tile(jnp.dtype("float32")) == (8, 128)


def test_v5e_figures() -> None:
    c = get_chip("v5e")
    assert c.device_kind == "TPU v5 lite" and c.topology == "v5e:2x2"
    assert c.clock_hz == 1.5e9 and c.mxu_shape == 128 and c.tensorcores_per_chip == 1 and not c.megacore
    assert c.default_scoped_vmem_bytes == 16 << 20 and c.vmem_bytes == 128 << 20
    assert c.step_overhead_s == pytest.approx(0.35e-6)
    assert c.peak_bf16_flops == 197e12 and c.hbm_bw_bytes_s == pytest.approx(819e9)


@pytest.mark.parametrize("name", TPUS)
def test_tpu_numbers_hang_together(name: str) -> None:
    c = get_chip(name)
    assert not c.is_gpu and c.generation >= 4 and c.topology.startswith(name)
    # The bf16 peak is (MXU-equivalents) x side^2 x 2 flops x clock x cores: 4 MXUs of the chip's size per core.
    per_cycle_per_core = c.peak_bf16_flops / (c.clock_hz * c.tensorcores_per_chip * 2 * c.mxu_shape**2)
    assert per_cycle_per_core == pytest.approx(4, rel=0.02)
    assert c.peak_f32_highest_flops < c.peak_f32_flops < c.peak_bf16_flops
    assert c.peak_int8_ops == 0.0 or c.peak_int8_ops == pytest.approx(2 * c.peak_bf16_flops)
    assert c.default_scoped_vmem_bytes <= c.vmem_bytes
    assert c.vpu_flops == 8 * 128 * 4 * c.clock_hz * c.tensorcores_per_chip
    assert c.eup_ops == 8 * 128 * c.clock_hz * c.tensorcores_per_chip
    assert 0.2e-6 < c.step_overhead_s < 0.6e-6
    assert c.device_peak_bf16_flops * c.devices_per_chip == c.peak_bf16_flops
    assert c.device_peak_flops("bfloat16") == c.device_peak_bf16_flops


@pytest.mark.parametrize("name", GPUS)
def test_gpu_entries(name: str) -> None:
    c = get_chip(name)
    assert c.is_gpu and c.topology == "" and c.mxu_shape == 0
    assert c.vmem_bytes == 228 * 1024 and c.tensorcores_per_chip == 132
    assert c.peak_bf16_flops == 989e12
    assert c.device_peak_flops("float32") == c.peak_f32_flops


def test_device_kinds_are_the_ones_jax_knows() -> None:
    tpu_info = pytest.importorskip("jax._src.pallas.mosaic.tpu_info")
    for name in TPUS:
        version = tpu_info.chip_version_from_device_kind(CHIPS[name].device_kind)
        assert version is not None, name
        info = tpu_info.get_tpu_info_for_chip(version, 1)
        assert info.mxu_column_size == CHIPS[name].mxu_shape
        assert info.vmem_capacity_bytes == CHIPS[name].vmem_bytes
        assert version.num_physical_tensor_cores_per_chip == CHIPS[name].tensorcores_per_chip
        assert version.supports_megacore == CHIPS[name].megacore


_PROBE = """
import json, sys
from jax.experimental import topologies
out = {}
for topo in sys.argv[1:]:
    d = topologies.get_topology_desc(topo, platform="tpu").devices[0]
    out[topo] = [d.device_kind, getattr(d, "num_cores", None)]
print(json.dumps(out))
"""


def test_topologies_compile_deviceless_with_the_named_device_kind() -> None:
    from pallasopt.cost_model.compiler import _child_env, libtpu_available

    if not libtpu_available():
        pytest.skip("libtpu not installed (pip install 'pallasopt[tpu]')")
    topos = [CHIPS[n].topology for n in TPUS]
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, *topos], env=_child_env(None), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in TPUS:
        chip: Chip = CHIPS[name]
        kind, cores = seen[chip.topology]
        assert kind == chip.device_kind
        assert cores == (2 if name == "v5p" else 1)  # v5p's device is a megacore; v4's deviceless ones are not


OVERLAP_FIT = ROOT / "bench/results/hw-v5e-2026-12-06/overlap-fit.json"


def test_delivered_bandwidth_is_the_datasheet_times_the_fitted_efficiency() -> None:
    for chip in CHIPS.values():
        assert 0 < chip.hbm_efficiency <= 1.0
        assert chip.delivered_hbm_bw_bytes_s == pytest.approx(chip.device_hbm_bw_bytes_s * chip.hbm_efficiency)
    # Only the v5e has measured times behind its figures (bench/hw_bandwidth_fit.py's joint fit of eff and p).
    assert [n for n, c in CHIPS.items() if c.hbm_efficiency != 1.0] == ["v5e"]
    assert [n for n, c in CHIPS.items() if c.overlap_p != math.inf] == ["v5e"]
    assert [n for n, c in CHIPS.items() if c.compiler_hbm_efficiency is not None] == ["v5e"]
    v5e = get_chip("v5e")
    model_fit = json.loads((ROOT / "bench/results/hw-v5e-2026-12-05/hbm-efficiency.json").read_text())
    fit = json.loads(OVERLAP_FIT.read_text())["joint"]
    assert (v5e.hbm_efficiency, v5e.compiler_hbm_efficiency, v5e.overlap_p) == (model_fit["eff"], fit["eff"], fit["p"])
    assert v5e.floor_chip.hbm_efficiency == fit["eff"] and v5e.floor_chip.floor_chip == v5e.floor_chip


@pytest.mark.parametrize("p", [math.inf, 2.0, 4.0, 16.0])
def test_the_compiler_time_joins_static_and_floor_never_below_either(p: float) -> None:
    chip = replace(get_chip("v5e"), overlap_p=p)
    for s, f in [(1.0, 0.0), (0.0, 2.0), (1.0, 1.0), (3.0, 1.0), (1.0, 3.0), (0.5, 0.45)]:
        t = chip.compiler_time(s, f)
        assert max(s, f) <= t <= max(s, f) * 2 ** (1 / p) + 1e-12
        assert t == pytest.approx(chip.compiler_time(f, s))
        if min(s, f) == 0 or p == math.inf:
            assert t == max(s, f)
    if p <= 4:  # a floor-bound tie is broken by the static part: more of it costs more (fused_28's tiles)
        assert chip.compiler_time(0.347, 0.469) > chip.compiler_time(0.277, 0.470)
        assert chip.compiler_time(1.0, 1.0) == pytest.approx(2 ** (1 / p))
