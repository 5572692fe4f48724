"""`pallasopt port`: Triton kernels (our fixtures in tests/fixtures/triton/) translated by rules, and declined."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from pallasopt.errors import UserError
from pallasopt.port import port_source
from pallasopt.port.affine import Affine, IndexEnv, affine

FIX = Path(__file__).parent / "fixtures" / "triton"


def _port(name: str, launcher: str | None = None, ref: str | None = None):
    src = FIX / f"{name}.py"
    ref_path = FIX / f"{ref or name + '_ref'}.py"
    ref_text = (
        ref_path.read_text()
        if ref_path.exists()
        else "def reference(x):\n    pass\n\n\ndef make_inputs(key):\n    pass\n"
    )
    return port_source(str(src), src.read_text(), str(ref_path), ref_text, launcher)


def test_affine_forms_of_blocked_offsets():
    env = IndexEnv()
    form = affine(
        cst.parse_expression("pid * BLOCK + tl.arange(0, BLOCK)"), IndexEnv({"pid": Affine((("pid0", "1"),))})
    )
    assert form == Affine((("pid0", "BLOCK"), ("ar:BLOCK", "1")))
    assert affine(cst.parse_expression("tl.program_id(0).to(tl.int64) * stride"), env) == Affine((("pid0", "stride"),))
    env.data.add("idx")
    assert affine(cst.parse_expression("idx * 4"), env) is None  # loaded data: no affine form


def test_flat_kernel_with_lambda_grid():
    res = _port("vector_add")
    assert [k.status for k in res.kernels] == ["rules"] and res.kernels[0].mode == "flat"
    src = res.source
    assert "ADD_KERNEL_BLOCK_SIZE = 128" in src  # the launch's block size, hoisted to a tunable constant
    assert "_launch_add_kernel(grid, x, y, out, n, BLOCK_SIZE=ADD_KERNEL_BLOCK_SIZE)" in src
    assert "jnp.where(x > y, x, y)" in src and "_ld(y_ptr_ref, _KIND_y_ptr, mask, 0.0)" in src
    assert "torch" not in src and "tl.load" not in src and "triton.cdiv" not in src
    compile(src, "out.py", "exec")


def test_row_kernel_constructs():
    res = _port("row_norm")
    assert res.kernels[0].mode == "rows"
    src = res.source
    assert '_KIND_X_ptr = "row"' in src and '_KIND_W_ptr = "bcast"' in src and '_KIND_S_ptr = "rowscalar"' in src
    assert "jax.lax.rsqrt(" in src and '_red("max", jnp.where(mask, jnp.abs(x), 0.0))' in src
    assert "def _scale(x, w):" in src and "_MODE = _constexpr(1)" in src
    assert "BLOCK = _next_power_of_2(n_cols)" in src and "x = x.reshape(-1, shape[-1])" in src
    assert "y, s = _launch__norm_kernel((n_rows,), y, _stride(y, 0), x, _stride(x, 0), w, s" in src


@pytest.mark.parametrize(
    ("launcher", "line", "why"),
    [
        ("atomic", 11, "tl.atomic_add: atomics have no Pallas TPU equivalent"),
        ("asm", 18, "tl.inline_asm_elementwise: inline PTX/assembly cannot run on a TPU"),
        ("gather", 26, "the address of 'x_ptr' depends on loaded data"),
        ("row_sums", 34, "a loop inside the kernel"),
    ],
)
def test_declines_name_the_line(launcher, line, why):
    with pytest.raises(UserError) as e:
        _port("declines", launcher)
    assert e.value.line == line and e.value.path.endswith("declines.py")
    assert why in str(e.value) and "\n" not in str(e.value)


def test_launcher_choice_is_explicit():
    with pytest.raises(UserError, match=r"several launchers: atomic \(line 40\), asm"):
        _port("declines")
    with pytest.raises(UserError, match="--launcher nope: no such top-level function"):
        _port("vector_add", "nope")


def test_reference_must_define_the_oracle(tmp_path):
    src = FIX / "vector_add.py"
    with pytest.raises(UserError, match="no `make_inputs` function"):
        port_source(str(src), src.read_text(), "ref.py", "def reference(x, y):\n    return x\n")


def test_ported_modules_pass_the_oracle():
    """Both families, checked in interpret mode on fresh seeds against our references (one child process each)."""
    from pallasopt.harness.check import check_many

    for name in ("vector_add", "row_norm"):
        res = _port(name)
        (result,) = check_many([res.source], f"{name}_ported.py", timeout_s=600)
        assert result.ok, result.message


def test_cli_port_writes_and_refuses_to_overwrite(tmp_path, capsys):
    from pallasopt.cli import main

    out = tmp_path / "out.py"
    args = ["port", str(FIX / "vector_add.py"), "--reference", str(FIX / "vector_add_ref.py"), "-o", str(out)]
    assert main(args) == 0
    assert "ported add_kernel by rules (flat kernel)" in capsys.readouterr().out
    assert main(args) == 2
    assert "exists" in capsys.readouterr().err
    bad = ["port", str(FIX / "declines.py"), "--launcher", "atomic", "--reference", str(FIX / "vector_add_ref.py")]
    assert main([*bad, "-o", str(tmp_path / "x.py")]) == 3
    err = capsys.readouterr().err.strip()
    assert err.startswith("pallasopt: error: ") and "declines.py:11: " in err and len(err.splitlines()) == 1
