"""Adapters for JAXBench workload files and MaxKernel task folders: loading, keys, templates, errors, `import`."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from pallasopt.adapters import (
    SuiteWorkload,
    jaxbench_from_source,
    load_jaxbench,
    load_maxkernel,
    to_kernel_module_template,
)
from pallasopt.errors import ExitCode, KernelError
from pallasopt.workload import exec_module, load_source

FIX = Path(__file__).resolve().parent / "fixtures"
JB_RMS = FIX / "jaxbench" / "12p_RMSNorm"
JB_EMBED = FIX / "jaxbench" / "llama3_8b_token_embed.py"
MK_RMS = FIX / "maxkernel" / "12p_RMSNorm"
MK_GMM = FIX / "maxkernel" / "11p_Megablox_GMM"
SMALL = {
    "llama3_70b_rmsnorm": {"batch": 2, "seq_len": 16, "emb_dim": 128},
    "llama3_8b_token_embed": {"batch": 2, "seq_len": 8, "vocab_size": 64, "emb_dim": 32},
    "12p_RMSNorm": {"batch": 2, "seq_len": 16, "emb_dim": 128},
    "11p_Megablox_GMM": {"num_experts": 4, "num_experts_per_tok": 2, "emb_dim": 64, "moe_mlp_dim": 32, "seq_len": 32},
}


@pytest.fixture(scope="module")
def suites() -> dict[str, SuiteWorkload]:
    return {
        "jb_rms": load_jaxbench(JB_RMS),
        "jb_embed": load_jaxbench(JB_EMBED),
        "mk_rms": load_maxkernel(MK_RMS),
        "mk_gmm": load_maxkernel(MK_GMM),
    }


def _rmsnorm(x: Any, scale: Any, eps: float) -> np.ndarray:
    xf = np.asarray(x, np.float32)
    y = xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return np.asarray(jnp.asarray(y, x.dtype) * scale, np.float32)


# ---------------------------------------------------------------- loading


def test_loaders_read_names_dims_and_kernel_files(suites: dict[str, SuiteWorkload]) -> None:
    jb, embed, mk, gmm = suites["jb_rms"], suites["jb_embed"], suites["mk_rms"], suites["mk_gmm"]
    assert (jb.name, jb.suite, jb.arg_names) == ("llama3_70b_rmsnorm", "jaxbench", ("x", "scale"))
    assert jb.dims == {"batch": 8, "seq_len": 4096, "emb_dim": 8192}  # epsilon (a float) and metadata are not dims
    assert jb.hand_tuned is not None and jb.hand_tuned_path == str(JB_RMS / "optimized.py")
    assert embed.dims == {"batch": 1, "seq_len": 2048, "vocab_size": 128256, "emb_dim": 4096}
    assert embed.hand_tuned is None and embed.arg_names == ("token_ids", "embed_table")
    assert (mk.name, mk.suite, mk.arg_names) == ("12p_RMSNorm", "maxkernel", ("x", "scale"))
    assert mk.dims == {"batch": 8, "seq_len": 4096, "emb_dim": 8192}  # literals assigned at the top of get_inputs
    assert mk.hand_tuned_path == str(MK_RMS / "optimized.py")
    assert gmm.dims == {
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "emb_dim": 4096,
        "moe_mlp_dim": 1536,
        "seq_len": 4096,
    }
    assert gmm.arg_names == ("lhs", "rhs", "group_sizes")  # the static arg is not a kernel argument
    assert jb.tolerance == mk.tolerance == {"rtol": 1e-2, "atol": 1e-2}
    assert jb.notes == () and mk.notes == ()
    assert any("input 2" in n and "does not depend on the key" in n for n in gmm.notes)  # jnp.full group sizes


@pytest.mark.parametrize("which", ["jb_rms", "jb_embed", "mk_rms", "mk_gmm"])
def test_default_dims_are_traced_never_built(suites: dict[str, SuiteWorkload], which: str) -> None:
    sw = suites[which]
    structs = jax.eval_shape(lambda: sw.make_inputs(jax.random.key(0)))
    out = jax.eval_shape(sw.reference, *structs)
    assert len(structs) == len(sw.arg_names) and out.ndim >= 2


@pytest.mark.parametrize("which", ["jb_rms", "jb_embed", "mk_rms", "mk_gmm"])
def test_the_key_is_folded_into_the_fixed_seeds(suites: dict[str, SuiteWorkload], which: str) -> None:
    sw = suites[which]
    dims = SMALL[sw.name]
    a1, a2 = sw.make_inputs(jax.random.key(1), **dims), sw.make_inputs(jax.random.key(2), **dims)
    again = sw.make_inputs(jax.random.key(1), **dims)
    floats = [i for i, a in enumerate(a1) if jnp.issubdtype(a.dtype, jnp.floating)]
    assert floats and all(not np.array_equal(a1[i], a2[i]) for i in floats)
    assert all(np.array_equal(x, y) for x, y in zip(a1, again, strict=True))
    raw = sw.make_inputs(jax.random.PRNGKey(1), **dims)  # an old-style raw key works too
    assert [x.shape for x in raw] == [x.shape for x in a1]


def test_jaxbench_reference_on_small_inputs(suites: dict[str, SuiteWorkload]) -> None:
    sw = suites["jb_rms"]
    x, scale = sw.make_inputs(jax.random.key(3), batch=2, seq_len=16, emb_dim=128)
    assert (x.shape, x.dtype, scale.shape) == ((2, 16, 128), jnp.bfloat16, (128,))  # the harness's bfloat16
    out = sw.reference(x, scale)
    np.testing.assert_allclose(np.asarray(out, np.float32), _rmsnorm(x, scale, 1e-5), rtol=2e-2, atol=2e-2)


def test_jaxbench_config_follows_the_dims_that_built_the_inputs(suites: dict[str, SuiteWorkload]) -> None:
    sw = suites["jb_embed"]
    assert sw.params is not None
    ids, table = sw.make_inputs(jax.random.key(0), batch=2, seq_len=8, vocab_size=64, emb_dim=32)
    assert ids.dtype == jnp.int32 and int(ids.max()) < 64 and table.shape == (64, 32)
    assert sw.params(ids, table)["emb_dim"] == 32
    out = sw.reference(ids, table)  # workload reads CONFIG['emb_dim'] at call time: 32 here, not 4096
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(table, np.float32)[ids] * 32**0.5, rtol=1e-2)
    big = jax.eval_shape(lambda: sw.make_inputs(jax.random.key(0)))
    assert sw.params(*big)["emb_dim"] == 4096


def test_maxkernel_static_args_follow_the_dims(suites: dict[str, SuiteWorkload]) -> None:
    sw = suites["mk_gmm"]
    assert sw.params is not None
    lhs, rhs, sizes = sw.make_inputs(jax.random.key(5), **SMALL["11p_Megablox_GMM"])
    assert (lhs.shape, rhs.shape, sizes.tolist()) == ((64, 64), (4, 64, 32), [16, 16, 16, 16])
    assert sw.params(lhs, rhs, sizes) == {"max_expert_size": 16}  # M // G at these dims, not 32768 // 128
    out = sw.reference(lhs, rhs, sizes)
    lf, rf = np.asarray(lhs, np.float32), np.asarray(rhs, np.float32)
    want = np.concatenate([lf[16 * g : 16 * (g + 1)] @ rf[g] for g in range(4)])
    np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=3e-2, atol=3e-2)
    assert suites["mk_rms"].params is not None
    x, s = suites["mk_rms"].make_inputs(jax.random.key(0), **SMALL["12p_RMSNorm"])
    assert suites["mk_rms"].params(x, s) == {"epsilon": 1e-5}


@pytest.mark.parametrize("which", ["jb_rms", "mk_rms"])
def test_the_suites_kernel_file_is_hand_tuned(suites: dict[str, SuiteWorkload], which: str) -> None:
    sw = suites[which]
    assert sw.hand_tuned is not None
    args = sw.make_inputs(jax.random.key(7), **SMALL[sw.name])
    with pltpu.force_tpu_interpret_mode():
        got = jax.block_until_ready(sw.hand_tuned(*args))
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(sw.reference(*args), np.float32), atol=2e-2)


def test_reference_on_inputs_make_inputs_never_built(suites: dict[str, SuiteWorkload]) -> None:
    sw = suites["mk_gmm"]
    odd = (jnp.ones((6, 64), jnp.bfloat16), jnp.ones((3, 64, 32), jnp.bfloat16), jnp.full((3,), 2, jnp.int32))
    with pytest.raises(KernelError, match="did not build"):
        sw.reference(*odd)


# ---------------------------------------------------------------- numpy seeds and what the survey notices


NUMPY_WORKLOAD = """
import jax.numpy as jnp
import numpy as np

CONFIG = {'name': 'np_scale', 'rows': 16, 'cols': 128}


def create_inputs(dtype=jnp.float32):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((CONFIG['rows'], CONFIG['cols'])).astype(np.float32)
    np.random.seed(1)
    w = np.random.randn(CONFIG['cols']).astype(np.float32)
    return jnp.asarray(x, dtype), jnp.asarray(w, dtype)


def workload(x, w):
    return x * w
"""


def _np_state() -> np.ndarray:
    return np.array(cast(tuple[Any, ...], np.random.get_state())[1], copy=True)


def test_numpy_seeds_are_derived_from_the_key(tmp_path: Path) -> None:
    f = tmp_path / "np_scale.py"
    f.write_text(NUMPY_WORKLOAD)
    sw = load_jaxbench(f, dtype=None)
    assert any("numpy" in n for n in sw.notes)
    state = _np_state()
    a1, a2 = sw.make_inputs(jax.random.key(1)), sw.make_inputs(jax.random.key(2))
    assert np.array_equal(_np_state(), state)  # the global numpy state is restored
    assert not np.array_equal(a1[0], a2[0]) and not np.array_equal(a1[1], a2[1])
    assert all(np.array_equal(x, y) for x, y in zip(a1, sw.make_inputs(jax.random.key(1)), strict=True))
    assert [s.shape for s in jax.eval_shape(lambda: sw.make_inputs(jax.random.key(0), rows=8))] == [(8, 128), (128,)]


HARDCODED_WORKLOAD = """
import jax
import jax.numpy as jnp

CONFIG = {'name': 'mm_relu', 'batch_size': 64, 'in_features': 128, 'out_features': 128, 'subtract_value': 2.0}


def create_inputs(dtype=jnp.float32):
    key = jax.random.PRNGKey(0)
    x = jax.random.uniform(key, (64, 128), dtype=dtype)
    weight = jnp.zeros((128, 128), dtype=dtype)
    return x, weight


def workload(x, weight):
    return jax.nn.relu(x @ weight - CONFIG['subtract_value'])
"""


def test_survey_notes_hardcoded_sizes_and_constant_inputs(tmp_path: Path) -> None:
    f = tmp_path / "mm_relu.py"
    f.write_text(HARDCODED_WORKLOAD)
    sw = load_jaxbench(f)
    assert sw.dims == {"batch_size": 64, "in_features": 128, "out_features": 128}
    assert sum("does not change any input's shape" in n for n in sw.notes) == 3
    assert any(n.startswith("input 1 (bfloat16[128, 128]) does not depend on the key") for n in sw.notes)
    template = to_kernel_module_template(sw)
    assert "Notes from the import:" in template and "hardcode its sizes" in template


# ---------------------------------------------------------------- the kernel-module template


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("which", ["jb_rms", "jb_embed", "mk_rms", "mk_gmm"])
def test_template_parses_and_defines_the_format(suites: dict[str, SuiteWorkload], which: str, tmp_path: Path) -> None:
    sw = suites[which]
    src = to_kernel_module_template(sw)
    tree = ast.parse(src)
    funcs = _functions(tree)
    entry = next(
        ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "ENTRY"
    )
    assert {"reference", "make_inputs", entry} <= set(funcs)
    assert ("hand_tuned" in funcs) == (sw.hand_tuned is not None)
    mk = funcs["make_inputs"].args
    assert [a.arg for a in mk.args] == ["key", *sw.dims]
    assert [ast.literal_eval(d) for d in mk.defaults] == list(sw.dims.values())
    assert [a.arg for a in funcs[entry].args.args] == list(sw.arg_names)

    path = str(tmp_path / f"{which}_kernel.py")
    module = exec_module(src, path)  # runs on its own: the suite's file is embedded
    args = module.make_inputs(jax.random.key(11), **SMALL[sw.name])
    mine = sw.make_inputs(jax.random.key(11), **SMALL[sw.name])
    assert all(np.array_equal(x, y) for x, y in zip(args, mine, strict=True))
    np.testing.assert_array_equal(np.asarray(module.reference(*args)), np.asarray(sw.reference(*mine)))
    with pytest.raises(NotImplementedError, match=re.escape(f"{entry} in {path} is a stub")):
        getattr(module, entry)(*args)
    with pytest.raises(KernelError, match=r"never reaches a pl\.pallas_call") as e:
        load_source(src, path)  # pallasopt refuses the unfilled stub with a one-line error at its line
    assert e.value.line == funcs[entry].lineno


FILLED_RMSNORM = '''
def pallas_llama3_70b_rmsnorm(x, scale):
    """RMSNorm over row blocks; epsilon comes from the suite's CONFIG."""
    eps = _SUITE.params(x, scale)["epsilon"]
    B, S, D = x.shape
    rows = x.reshape(B * S, D)

    def kernel(x_ref, s_ref, o_ref):
        xf = x_ref[...].astype(jnp.float32)
        ms = jnp.mean(xf * xf, axis=-1, keepdims=True)
        o_ref[...] = (xf * jax.lax.rsqrt(ms + eps)).astype(o_ref.dtype) * s_ref[...]

    out = pl.pallas_call(
        kernel,
        grid=(B * S // 16,),
        in_specs=[pl.BlockSpec((16, D), lambda i: (i, 0)), pl.BlockSpec((1, D), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((16, D), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct(rows.shape, x.dtype),
    )(rows, scale.reshape(1, D))
    return out.reshape(B, S, D)


'''


def _fill(template: str, entry: str, body: str) -> str:
    start = template.index(f"def {entry}(")
    end = template.index("def reference(")
    return template[:start] + textwrap.dedent(body).lstrip("\n") + template[end:]


@pytest.mark.parametrize("embed", [True, False])
def test_filled_template_is_a_working_kernel_module(
    suites: dict[str, SuiteWorkload], embed: bool, tmp_path: Path
) -> None:
    from pallasopt.ir.trace import trace_calls

    sw = suites["jb_rms"]
    src = _fill(
        to_kernel_module_template(sw, embed=embed, out_dir=tmp_path), "pallas_llama3_70b_rmsnorm", FILLED_RMSNORM
    )
    w = load_source(src, str(tmp_path / "rmsnorm_kernel.py"))
    assert w.spec.entry == "pallas_llama3_70b_rmsnorm" and w.spec.has_hand_tuned
    assert dict(w.dims) == sw.dims and w.tolerance == {"rtol": 1e-2, "atol": 1e-2}
    calls = trace_calls(w, w.dims)  # the default size, traced only: params() finds CONFIG for tracer shapes
    assert len(calls) == 1
    args = w.make_inputs(jax.random.key(4), **SMALL[sw.name])
    with pltpu.force_tpu_interpret_mode():
        got = jax.block_until_ready(w.entry(*args))
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(w.reference(*args), np.float32), atol=2e-2)


def test_linked_template_loads_the_suite_by_relative_path(suites: dict[str, SuiteWorkload], tmp_path: Path) -> None:
    src = to_kernel_module_template(suites["mk_gmm"], embed=False, out_dir=tmp_path)
    assert "_SUITE_SOURCE" not in src and "Path(__file__).resolve().parent /" in src
    module = exec_module(src, str(tmp_path / "gmm_kernel.py"))
    args = module.make_inputs(jax.random.key(0), **SMALL["11p_Megablox_GMM"])
    assert module.reference(*args).shape == (64, 32)


def test_template_embeds_sources_with_any_quotes() -> None:
    src = NUMPY_WORKLOAD.replace("import numpy as np", "import numpy as np\nDOC = '''quotes \\\\ here'''")
    sw = jaxbench_from_source(src, "quoted.py", survey=False)
    tree = ast.parse(to_kernel_module_template(sw))
    embedded = next(
        n.value for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_SUITE_SOURCE"
    )
    assert ast.literal_eval(embedded) == src


# ---------------------------------------------------------------- errors


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(text))
    return p


JB_OK = HARDCODED_WORKLOAD


@pytest.mark.parametrize(
    ("text", "needle", "at"),
    [
        (JB_OK.replace("def workload(", "def baseline("), "no `workload`", None),
        (JB_OK.replace("def create_inputs(", "def make_inputs("), "no `create_inputs`", None),
        (JB_OK.replace("CONFIG = {", "SIZES = {").replace("CONFIG[", "SIZES["), "no `CONFIG`", None),
        (JB_OK.replace("CONFIG = {", "CONFIG = [{").replace(".0}", ".0}]"), "CONFIG is not a dict", ""),
        (JB_OK.replace("def workload(x, weight):", "def workload(x, weight)"), "syntax error", "def workload("),
        (JB_OK.replace("weight = jnp.zeros", "raise ValueError('boom')\n    weight"), "ValueError: boom", "raise"),
        ("def get_inputs():\n    return [], []\n\ndef computation():\n    return 0\n", "looks like a MaxKernel", None),
    ],
)
def test_bad_jaxbench_files_give_one_line_errors(tmp_path: Path, text: str, needle: str, at: str | None) -> None:
    f = _write(tmp_path, "bad.py", text)
    with pytest.raises(KernelError) as e:
        load_jaxbench(f)
    msg = str(e.value)
    assert needle in msg and msg.startswith(str(f)) and "\n" not in msg
    assert e.value.exit_code == ExitCode.BAD_KERNEL
    if at is None:  # a missing name is reported at line 1
        assert e.value.line == 1
    elif at:  # the line that holds the problem
        assert e.value.line == 1 + next(i for i, s in enumerate(text.splitlines()) if s.strip().startswith(at))


MK_OK = (MK_GMM / "reference.py").read_text()


@pytest.mark.parametrize(
    ("files", "needle"),
    [
        ({"task/kernel_task.yaml": "task_id: t\n"}, "no reference.py in the task folder"),
        ({"task/reference.py": MK_OK.replace("def computation(", "def compute(")}, "no `computation`"),
        ({"task/reference.py": MK_OK.replace("def get_inputs(", "def create_inputs(")}, "no `get_inputs`"),
        (
            {"task/reference.py": MK_OK.replace("return dynamic_args, static_args", "return dynamic_args")},
            "not (dynamic_args",
        ),
        ({"task/reference.py": JB_OK}, "looks like a JAXBench workload"),
    ],
)
def test_bad_maxkernel_tasks_give_one_line_errors(tmp_path: Path, files: dict[str, str], needle: str) -> None:
    for name, text in files.items():
        _write(tmp_path, name, text)
    with pytest.raises(KernelError) as e:
        load_maxkernel(tmp_path / "task")
    assert needle in str(e.value) and str(e.value).startswith(str(tmp_path / "task")) and "\n" not in str(e.value)


def test_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(KernelError, match="no such file"):
        load_jaxbench(tmp_path / "nope.py")
    with pytest.raises(KernelError, match="no such file or folder"):
        load_maxkernel(tmp_path / "nope")
    with pytest.raises(KernelError, match=r"no baseline\.py"):
        load_jaxbench(tmp_path)


def test_unknown_dims_are_refused(suites: dict[str, SuiteWorkload]) -> None:
    with pytest.raises(KernelError, match=r"unknown dims \['heads'\]"):
        suites["mk_rms"].make_inputs(jax.random.key(0), heads=4)
