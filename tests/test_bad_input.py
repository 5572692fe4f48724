"""Bad input through the command line: each case gives its exit code and one line naming the file, line and fix.

docs/errors.md is the table of these messages. Kernels are tiny (8x128 blocks, CHECK_DIMS of 32 rows); only the
check failures start the oracle's child process, and no case runs a search.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest

from pallasopt.cli import main

GOOD = """\
import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

BM = 8


def _kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0


def add_one(x):
    m, n = x.shape
    spec = pl.BlockSpec((BM, 128), lambda i: (i, 0))
    return pl.pallas_call(
        _kernel,
        grid=(m // BM,),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)


def reference(x):
    return x + 1.0


def make_inputs(key, M=2048, N=128):
    return (jax.random.normal(key, (M, N), jnp.float32),)


CHECK_DIMS = {"M": 32}
"""
# Line numbers in GOOD that the messages point at.
ENTRY_LINE, REFERENCE_LINE, MAKE_INPUTS_LINE = 12, 24, 28

CALL = """    return pl.pallas_call(
        _kernel,
        grid=(m // BM,),
        in_specs=[spec],
        out_specs=spec,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
    )(x)"""


def variant(old: str, new: str, text: str = GOOD) -> str:
    assert old in text, old
    return text.replace(old, new)


KERNELS = {
    "good": GOOD,
    "syntax": variant("def reference(x):", "def reference(x:"),
    "no_entry": variant(CALL, "    return x + 1.0"),
    "two_entries": GOOD
    + "\n\ndef add_two(x):\n    return pl.pallas_call(_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)\n",
    "bad_entry_name": 'ENTRY = "add_three"\n' + GOOD,
    "no_reference": variant("def reference(x):", "def oracle(x):"),
    "no_make_inputs": variant("def make_inputs(", "def inputs("),
    "make_inputs_fails": variant(
        "    return (jax.random.normal(key, (M, N), jnp.float32),)",
        "    x = jax.random.normal(key, (M, N), jnp.float32)\n    return (x @ x,)",
    ),
    "dim_without_default": variant("M=2048, N=128", "M, N=128"),
    "import_fails": variant("BM = 8", "BM = 8 // 0"),
    "trace_fails": variant("grid=(m // BM,),", "grid=(m // BM, n),"),
    "exits_on_import": variant("BM = 8", "import sys\n\nsys.exit(4)\nBM = 8"),
    "exits_in_entry": variant("    m, n = x.shape\n", "    raise SystemExit(2)\n"),
    "wrong_dtype": variant(
        "out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype)", "out_shape=jax.ShapeDtypeStruct(x.shape, jnp.bfloat16)"
    ).replace("o_ref[...] = x_ref[...] + 1.0", "o_ref[...] = (x_ref[...] + 1.0).astype(o_ref.dtype)"),
    "wrong_shape": variant("    return x + 1.0\n", "    return (x + 1.0).T\n"),
    "not_divisible": variant("M=2048", "M=2052"),
    "nondeterministic": variant("    m, n = x.shape\n", "    m, n = x.shape\n    _CALLS[0] += 1\n").replace(
        "o_ref[...] = x_ref[...] + 1.0", "o_ref[...] = x_ref[...] + 1.0 + 1e-6 * _CALLS[0]"
    )
    + "\n_CALLS = [0]\n",
}


@pytest.fixture(scope="module")
def k(tmp_path_factory) -> dict[str, Path]:
    """The kernel files, plus a garbage database and one of a newer schema."""
    root = tmp_path_factory.mktemp("bad")
    files = {}
    for name, text in KERNELS.items():
        files[name] = root / f"{name}.py"
        files[name].write_text(text)
    files["latin1"] = root / "latin1.py"
    files["latin1"].write_bytes(GOOD.replace("BM = 8", "BM = 8  # caf\xe9").encode("latin-1"))
    files["garbage_db"] = root / "garbage.db"
    files["garbage_db"].write_bytes(b"this is not an sqlite database, just bytes\x00\x01" * 64)
    files["newer_db"] = root / "newer.db"
    with sqlite3.connect(files["newer_db"]) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.execute("PRAGMA user_version=99")
    files["folder"] = root
    return files


def error_line(capsys, code: int, argv: list[str]) -> str:
    """Run the CLI; assert the exit code and that stderr is one `pallasopt: error:` line; return that line."""
    got = main(argv)
    err = capsys.readouterr().err
    assert got == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("pallasopt: error: "), lines[0]
    return lines[0].removeprefix("pallasopt: error: ")


# (argv with {name} for kernel paths, exit code, expected `FILE:LINE: ` prefix (or None), what is wrong, the fix)
USER_ERRORS = [
    ("missing_file", ["analyze", "{folder}/nope.py"], 3, "{folder}/nope.py: ", "no such file", "check the path"),
    ("folder", ["check", "{folder}"], 3, "{folder}: ", "is a folder", "pass a .py file"),
    ("syntax", ["check", "{syntax}"], 3, f"{{syntax}}:{REFERENCE_LINE}: ", "syntax error", "fix the Python syntax"),
    (  # add_one calls pl.BlockSpec (imported code might reach a pallas_call): the trace decides, at its line
        "no_entry",
        ["analyze", "{no_entry}"],
        3,
        f"{{no_entry}}:{ENTRY_LINE}: ",
        "entry 'add_one' reaches no pl.pallas_call when traced",
        "or a library kernel that does",
    ),
    (
        "two_entries",
        ["analyze", "{two_entries}"],
        3,
        f"{{two_entries}}:{ENTRY_LINE}: ",
        "two or more candidate entries: add_one (line 12), add_two",
        'name the one to optimize with ENTRY = "function_name"',
    ),
    (
        "bad_entry_name",
        ["analyze", "{bad_entry_name}"],
        3,
        "{bad_entry_name}:1: ",
        "ENTRY names 'add_three'",
        "set ENTRY to the function that calls pl.pallas_call",
    ),
    ("no_reference", ["analyze", "{no_reference}"], 3, "{no_reference}:1: ", "no `reference`", "def reference"),
    (
        "no_make_inputs",
        ["analyze", "{no_make_inputs}"],
        3,
        "{no_make_inputs}:1: ",
        "no `make_inputs`",
        "def make_inputs",
    ),
    (
        "make_inputs_fails",
        ["analyze", "{make_inputs_fails}"],
        3,
        f"{{make_inputs_fails}}:{MAKE_INPUTS_LINE + 2}: ",
        "make_inputs failed at dims {'M': 2048, 'N': 128}: TypeError: dot_general",
        "must build the inputs with jax.random",
    ),
    (
        "dim_without_default",
        ["analyze", "{dim_without_default}"],
        3,
        f"{{dim_without_default}}:{MAKE_INPUTS_LINE}: ",
        "make_inputs parameter 'M' has no default",
        "give every dimension a default",
    ),
    (
        "import_fails",
        ["analyze", "{import_fails}"],
        3,
        "{import_fails}:5: ",
        "importing the module failed: ZeroDivisionError",
        "the file must import on its own",
    ),
    (
        "trace_fails",
        ["analyze", "{trace_fails}"],
        3,
        "{trace_fails}:",
        "tracing the entry 'add_one' failed",
        "must trace with jax.make_jaxpr",
    ),
    (
        "exits_on_import",
        ["analyze", "{exits_on_import}"],
        3,
        "{exits_on_import}:7: ",
        "importing the module called sys.exit(4)",
        "without exiting",
    ),
    ("not_utf8", ["check", "{latin1}"], 3, "{latin1}: ", "cannot read: 'utf-8' codec", "save the file as UTF-8"),
    ("unknown_target", ["analyze", "{good}", "--target", "v9"], 2, None, "unknown target 'v9'", "known: v4, v5e"),
    ("unknown_target_run", ["run", "{good}", "--target", "v9", "--no-compile"], 2, None, "unknown target", "known:"),
    ("unknown_pass", ["apply", "{good}", "-p", "unroll"], 2, None, "unknown pass 'unroll'", "known passes: "),
    ("unknown_pass_run", ["run", "{good}", "--passes", "unroll", "--no-compile"], 2, None, "unknown pass", "known"),
    ("malformed_spec", ["apply", "{good}", "-p", "tile{BM=16"], 2, None, "malformed pass pipeline", "the form is"),
    ("empty_spec", ["apply", "{good}", "-p", " "], 2, None, "empty pass pipeline", 'write e.g. -p "tile'),
    ("spec_no_value", ["apply", "{good}", "-p", "tile{BM}"], 2, None, "parameter 'BM' needs a value", "key=value"),
    ("spec_not_int", ["apply", "{good}", "-p", "tile{BM=x}"], 2, None, "BM='x' must be an integer", "integer"),
    ("spec_negative", ["apply", "{good}", "-p", "tile{BM=-8}"], 2, None, "BM=-8 must be positive", "positive"),
    (
        "spec_unknown_param",
        ["apply", "{good}", "-p", "dimension-semantics{foo=1}"],
        2,
        None,
        "pass 'dimension-semantics' has no parameter 'foo'",
        "its parameters are: call",
    ),
    ("one_seed", ["check", "{good}", "--seeds", "1"], 2, None, "--seeds needs at least two", "two distinct"),
    ("bad_seeds", ["check", "{good}", "--seeds", "1,x"], 2, None, "--seeds must be comma-separated", "integers"),
    (
        "overwrite_input",
        ["apply", "{good}", "-p", "tile{BM=16}", "-o", "{good}"],
        2,
        None,
        "refusing to overwrite the input",
        "pass --force",
    ),
    (
        "garbage_db",
        ["db", "show", "{garbage_db}"],
        5,
        "{garbage_db}: ",
        "is not a usable SQLite database",
        "move the file aside",
    ),
    (
        "garbage_db_run",
        ["run", "{good}", "--db", "{garbage_db}", "--no-compile"],
        5,
        "{garbage_db}: ",
        "is not a usable SQLite database",
        "move the file aside",
    ),
    (
        "newer_db",
        ["run", "{good}", "--db", "{newer_db}", "--no-compile"],
        5,
        "{newer_db}: ",
        "was written by a newer pallasopt (schema 99 > 2)",
        "use a newer pallasopt or another --db path",
    ),
    ("missing_db", ["db", "show", "{folder}/none.db"], 2, None, "no kernel database at", "run `pallasopt run` first"),
]


@pytest.mark.parametrize(
    ("argv", "code", "where", "what", "fix"), [c[1:] for c in USER_ERRORS], ids=[c[0] for c in USER_ERRORS]
)
def test_user_error_is_one_line(capsys, k, argv, code, where, what, fix) -> None:
    names = {n: str(p) for n, p in k.items()}

    def fill(text: str) -> str:  # "{good}" -> its path; other braces ("tile{BM}") stay
        return re.sub(r"\{(\w+)\}", lambda m: names.get(m.group(1), m.group(0)), text)

    line = error_line(capsys, code, [fill(a) for a in argv])
    if where is not None:
        assert line.startswith(fill(where)), line
    assert what in line and fix in line, line


def test_two_entries_names_both_lines(capsys, k) -> None:
    line = error_line(capsys, 3, ["analyze", str(k["two_entries"])])
    assert re.search(r"add_one \(line 12\), add_two \(line \d+\)", line)


def test_syntax_error_same_message_in_every_command(capsys, k) -> None:
    want = error_line(capsys, 3, ["check", str(k["syntax"])])
    assert error_line(capsys, 3, ["analyze", str(k["syntax"])]) == want


def test_check_of_a_module_whose_make_inputs_fails_is_a_user_error(capsys, k) -> None:
    line = error_line(capsys, 3, ["check", str(k["make_inputs_fails"])])
    assert line.startswith(f"{k['make_inputs_fails']}:{MAKE_INPUTS_LINE + 2}: make_inputs failed")


def test_entry_calling_sys_exit_is_a_user_error(capsys, k) -> None:
    try:
        line = error_line(capsys, 3, ["analyze", str(k["exits_in_entry"])])
    except SystemExit as e:
        raise AssertionError(f"pallasopt exited silently with {e.code!r}") from None
    assert line.startswith(f"{k['exits_in_entry']}:13: ")


@pytest.mark.parametrize("size", [384, 100, 4096])
def test_tile_size_that_does_not_divide_the_dims_declines(capsys, k, size) -> None:
    assert main(["apply", str(k["good"]), "-p", f"tile{{BM={size}}}", "--diff"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert f"tile{{call=0,BM={size}}} declined: " in out and str(size) in out.split("declined: ")[1]


def test_tile_request_for_a_missing_knob_declines(capsys, k) -> None:
    assert main(["apply", str(k["good"]), "-p", "tile{bm=16}", "--diff"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "declined: call 0 has no tile knob 'bm' (knobs: BM)" in out


# Check failures: the kernel module is usable but wrong. `check` exits 1 with the oracle's verdict (here as JSON);
# `run` refuses to optimize a kernel that fails its own check (exit 3, one line).
CHECK_FAILURES = [
    ("wrong_dtype", "shape", "output 0: kernel gives bfloat16[32, 128], reference float32[32, 128]"),
    ("wrong_shape", "shape", "output 0: kernel gives float32[32, 128], reference float32[128, 32]"),
    ("not_divisible", "coverage", "writes only 2048 of the 2052 elements of out0 dim 0 (block 8)"),
    ("nondeterministic", "nondeterministic", "a second run on the same inputs changed"),
]


@pytest.mark.parametrize(("name", "status", "what"), CHECK_FAILURES, ids=[c[0] for c in CHECK_FAILURES])
def test_check_failure_exit_code_and_status(capsys, k, name, status, what) -> None:
    assert main(["check", str(k[name]), "--json"]) == 1
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert err == "" and result["status"] == status and what in result["message"], result


def test_run_refuses_a_kernel_that_fails_its_check(capsys, k, tmp_path) -> None:
    argv = ["run", str(k["wrong_dtype"]), "--no-compile", "--db", str(tmp_path / "k.db"), "-o", str(tmp_path / "o.py")]
    line = error_line(capsys, 3, argv)
    assert line.startswith(f"{k['wrong_dtype']}: the input kernel fails its own correctness check: seed 101: ")
    assert "(fix the kernel (or its reference/TOLERANCE) before optimizing it)" in line
