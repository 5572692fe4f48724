"""Kernel modules are loaded as Python imports them, in this process and in every worker (check, compile):
a frozen-dataclass config under `from __future__ import annotations`, and a kernel inside a package that uses
`from .helpers import ...`. Tracebacks keep naming the user's file and line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_compiler import needs_libtpu

from pallasopt.cost_model.compiler import compile_module
from pallasopt.errors import KernelError
from pallasopt.harness.check import check
from pallasopt.workload import load, load_source, package_of

BODY = """
def _kernel(x_ref, o_ref):
    o_ref[...] = {expr}


def {entry}(x):
    b = {block}
    return pl.pallas_call(
        _kernel,
        grid=(x.shape[0] // b,),
        in_specs=[pl.BlockSpec((b, x.shape[1]), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((b, x.shape[1]), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def reference(x):
    return {ref}


def make_inputs(key, M=512, N=256):
    return (jax.random.normal(key, (M, N), jnp.float32),)
"""

HEAD = "import jax\nimport jax.numpy as jnp\nfrom jax.experimental import pallas as pl\n"

DATACLASS = (
    "from __future__ import annotations\n\nimport dataclasses\n\n"
    + HEAD
    + "\n\n@dataclasses.dataclass(frozen=True)\nclass Config:\n    block: int = 128\n    scale: float = 2.0\n\n\n"
    "CFG = Config()\n" + BODY.format(expr="x_ref[...] * CFG.scale", entry="double", block="CFG.block", ref="x * 2.0")
)

PACKAGED = (
    HEAD
    + "\nfrom .helpers import BLOCK, scale\n"
    + BODY.format(expr="scale(x_ref[...])", entry="triple", block="BLOCK", ref="x * 3.0")
)


@pytest.fixture
def dataclass_kernel(tmp_path: Path) -> Path:
    path = tmp_path / "dc_kernel.py"
    path.write_text(DATACLASS)
    return path


@pytest.fixture
def package_kernel(tmp_path: Path) -> Path:
    pkg = tmp_path / "proj" / "tierpkg" / "ops"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("BLOCK = 128\n\n\ndef scale(x):\n    return x * 3.0\n")
    path = pkg / "kern.py"
    path.write_text(PACKAGED)
    yield path
    for name in [m for m in sys.modules if m == "tierpkg" or m.startswith("tierpkg.")]:
        del sys.modules[name]  # another test's tmp_path may hold a package of the same name


def test_package_of(package_kernel: Path, dataclass_kernel: Path) -> None:
    assert package_of(str(package_kernel)) == ("tierpkg.ops", package_kernel.parents[2].resolve())
    assert package_of(str(dataclass_kernel)) is None


def test_dataclass_module_loads_here(dataclass_kernel: Path) -> None:
    w = load(dataclass_kernel)
    cfg = w.module.CFG
    assert (cfg.block, cfg.scale) == (128, 2.0)
    assert sys.modules[w.module.__name__] is w.module  # registered, as `import` would
    with pytest.raises(dataclasses_frozen()):
        cfg.block = 256


def dataclasses_frozen() -> type[Exception]:
    import dataclasses

    return dataclasses.FrozenInstanceError


def test_package_relative_import_loads_here(package_kernel: Path) -> None:
    w = load(package_kernel)
    assert w.module.__package__ == "tierpkg.ops" and w.module.__name__.startswith("tierpkg.ops.")
    assert w.module.BLOCK == 128 and w.module.scale(1.0) == 3.0
    again = load(package_kernel)  # a second load (a candidate rewrite) is a fresh module
    assert again.module is not w.module


def test_traceback_names_the_users_file_and_line(package_kernel: Path) -> None:
    bad = PACKAGED.replace("from .helpers import BLOCK, scale", "from .helpers import BLOCK, nope")
    with pytest.raises(KernelError) as e:
        load_source(bad, str(package_kernel))
    assert e.value.path == str(package_kernel) and e.value.line == 5 and "nope" in e.value.message


@pytest.mark.slow
def test_both_pass_the_check(dataclass_kernel: Path, package_kernel: Path) -> None:
    for path in (dataclass_kernel, package_kernel):
        r = check(path.read_text(), str(path))
        assert r.ok, r.message


@needs_libtpu
def test_both_compile_with_an_estimate(dataclass_kernel: Path, package_kernel: Path) -> None:
    for path, entry in ((dataclass_kernel, "double"), (package_kernel, "triple")):
        r = compile_module(path.read_text(), str(path), entry, {}, "v5e")
        assert r.ok, r.error
        assert r.estimated_cycles and r.estimated_cycles > 0


@needs_libtpu
def test_compile_error_names_the_users_line(dataclass_kernel: Path) -> None:
    bad = DATACLASS.replace("    b = CFG.block\n", "    b = CFG.block // 0\n")
    r = compile_module(bad, str(dataclass_kernel), "double", {}, "v5e")
    line = bad.splitlines().index("    b = CFG.block // 0") + 1
    assert r.error_kind == "trace" and str(r.error).startswith(f"{dataclass_kernel}:{line}: ZeroDivisionError")


FLASH_TAIL = """

ENTRY = "attention"


def attention(q, k, v):
    sizes = BlockSizes(block_q=128, block_k_major=128, block_k=128, block_b=1)
    return flash_attention(q, k, v, causal=False, block_sizes=sizes)


def reference(q, k, v):
    return mha_reference(q, k, v, None, causal=False)


def make_inputs(key, B=1, H=2, S=512, D=128):
    kq, kk, kv = jax.random.split(key, 3)
    shape = (B, H, S, D)
    return tuple(jax.random.normal(k, shape, jnp.float32) for k in (kq, kk, kv))
"""


@needs_libtpu
def test_jax_flash_attention_file_compiles(tmp_path: Path) -> None:
    """JAX's own flash_attention.py (a `@dataclasses.dataclass` BlockSizes under `from __future__ import
    annotations`), read from the installed jax at test time, as a user's kernel module: the compile tier used to
    skip it ("'NoneType' object has no attribute '__dict__'")."""
    import jax.experimental.pallas.ops.tpu.flash_attention as fa

    source = Path(fa.__file__).read_text() + FLASH_TAIL
    assert "from __future__ import annotations" in source and "@dataclasses.dataclass" in source
    path = tmp_path / "my_flash.py"
    path.write_text(source)
    assert load(path).module.BlockSizes(128, 256, 128, 1).block_k_major == 256
    r = compile_module(source, str(path), "attention", {}, "v5e")
    assert r.ok, r.error
    assert r.estimated_cycles and r.vmem_bytes
