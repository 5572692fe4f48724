"""ir/cst_edit.py: `semantics_edit`, the one edit of a pallas_call's dimension_semantics (no tracing: a stand-in for
the traced facts, which it reads only `dimension_semantics` of), and `grid_locals` (program ids moved under pl.when)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import libcst as cst
import pytest

from pallasopt.errors import PassNotApplicable
from pallasopt.ir.cst_edit import edit_call_params, grid_locals, replace_many, semantics_edit
from pallasopt.ir.matchers import Located, pallas_call_nodes

HEAD = """import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

PARAMS = pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))


def make():
    return PARAMS


def f(x):
    sem = ("parallel", "arbitrary")
"""
CALL = "    return pl.pallas_call(kernel, grid=(2, 4), out_shape=x{params})(x)\n"


def facts(sem: tuple[str, ...] | None) -> Any:
    return SimpleNamespace(dimension_semantics=sem, library_site=None, span=(14, 14), index=0)


def edited(params: str, sem: tuple[str, ...] | None, new: Callable[[tuple[str, ...]], tuple[str, ...]]) -> str:
    """The call line after the edit (which leaves every line before it alone)."""
    source = HEAD + CALL.format(params=params)
    loc = Located.of(cst.parse_module(source))
    (node,) = pallas_call_nodes(loc)
    out = replace_many(loc.wrapper.module, semantics_edit(loc, node, facts(sem), new)).code
    assert out.startswith(HEAD), out
    return out.removeprefix(HEAD)


def call(params: str) -> str:
    return CALL.format(params=", compiler_params=" + params)


def swap(s: tuple[str, ...]) -> tuple[str, ...]:
    return s[::-1]


@pytest.mark.parametrize(
    ("written", "new", "want"),
    [
        # in place: the quoting, the list brackets and a trailing comma stay
        ("('parallel', 'arbitrary')", swap, "('arbitrary', 'parallel')"),
        ('["parallel", "parallel",]', lambda s: (*s, "arbitrary"), '["parallel", "parallel", "arbitrary",]'),
        ("('parallel',)", lambda s: (*s, "arbitrary"), "('parallel', 'arbitrary')"),
        ('("arbitrary", "arbitrary")', lambda s: ("parallel",), '("parallel",)'),
        ('(\n    "parallel",\n    "arbitrary",\n)', lambda s: (*s, "arbitrary"), None),
    ],
)
def test_a_literal_is_edited_in_place(written: str, new: Callable, want: str | None) -> None:
    literal = cst.parse_expression(written)
    assert isinstance(literal, cst.Tuple | cst.List)
    traced = tuple(str(e.value.evaluated_value) for e in literal.elements if isinstance(e.value, cst.SimpleString))
    got = edited(f", compiler_params=pltpu.CompilerParams(dimension_semantics={written})", traced, new)
    if want is None:  # one element a line, the new one too
        want = '(\n    "parallel",\n    "arbitrary",\n    "arbitrary",\n)'
    assert got == call(f"pltpu.CompilerParams(dimension_semantics={want})")


def test_other_forms_are_set_whole() -> None:
    # a name: the keyword gets a new tuple and the name's definition is left alone
    got = edited(", compiler_params=pltpu.CompilerParams(dimension_semantics=sem)", ("parallel", "arbitrary"), swap)
    assert got == call('pltpu.CompilerParams(dimension_semantics=("arbitrary", "parallel"))')
    # a module-level CompilerParams other calls may share: `.replace(...)` at the call site
    got = edited(", compiler_params=PARAMS", ("parallel", "arbitrary"), swap)
    assert got == call('PARAMS.replace(dimension_semantics=("arbitrary", "parallel"))')
    # none given: compiler_params added
    got = edited("", None, lambda _: ("parallel", "arbitrary"))
    assert got == call('pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))')


def test_no_change_is_no_edit_and_an_opaque_params_declines() -> None:
    loc = Located.of(cst.parse_module(HEAD + call("make()")))
    (node,) = pallas_call_nodes(loc)
    assert semantics_edit(loc, node, facts(("parallel", "arbitrary")), lambda s: s) == {}
    with pytest.raises(PassNotApplicable, match="cannot edit"):
        semantics_edit(loc, node, facts(("parallel", "arbitrary")), swap)


def test_edit_call_params_imports_pallas_tpu_for_new_params() -> None:
    source = HEAD.replace("from jax.experimental.pallas import tpu as pltpu\n", "") + CALL.format(params="")
    source = source.replace("pltpu.CompilerParams", "dict")
    module = cst.parse_module(source)
    fake = SimpleNamespace(dimension_semantics=None, library_site=None, span=(13, 13), index=0)
    out = edit_call_params(module, fake, lambda loc, node: semantics_edit(loc, node, fake, lambda _: ("parallel",)))
    assert "from jax.experimental.pallas import tpu as pltpu\n" in out.code
    assert 'compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)))(x)' in out.code


def test_a_local_params_two_calls_share_is_edited_at_the_call_site() -> None:
    # `params` is one local object two pallas_calls use: editing its definition would change the other call's
    # semantics too (a reduction axis made "parallel" there), so the edited call gets `params.replace(...)`.
    body = (
        '    params = pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))\n'
        "    y = pl.pallas_call(kernel, grid=(2, 4), out_shape=x, compiler_params=params)(x)\n"
        "    return pl.pallas_call(kernel, grid=(2, 4), out_shape=x, compiler_params=params)(y)\n"
    )
    loc = Located.of(cst.parse_module(HEAD + body))
    first, _second = pallas_call_nodes(loc)
    out = replace_many(loc.wrapper.module, semantics_edit(loc, first, facts(("parallel", "arbitrary")), swap)).code
    assert 'params = pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))' in out
    assert 'compiler_params=params.replace(dimension_semantics=("arbitrary", "parallel")))(x)' in out
    assert out.endswith("compiler_params=params)(y)\n")
    # Used by one call only, the local definition is edited in place (as before).
    alone = HEAD + body.replace(
        "    y = pl.pallas_call(kernel, grid=(2, 4), out_shape=x, compiler_params=params)(x)\n", "    y = x\n"
    )
    loc = Located.of(cst.parse_module(alone))
    (only,) = pallas_call_nodes(loc)
    out = replace_many(loc.wrapper.module, semantics_edit(loc, only, facts(("parallel", "arbitrary")), swap)).code
    assert 'params = pltpu.CompilerParams(dimension_semantics=("arbitrary", "parallel"))' in out


def test_grid_locals_bind_and_use_program_ids_and_counts() -> None:
    """Program ids (and, when asked, grid sizes) read in statements a pass moves under `pl.when` become locals:
    fresh names, an id the kernel already bound keeps its local, an extra axis (a mask's) is bound too."""
    stmts = list(
        cst.parse_module(
            "pid0 = 1\n"
            "x = pl.program_id(1) + pl.program_id(2)\n"
            "if pl.program_id(1) == pl.num_programs(1) - 1:\n"
            "    y = pl.program_id(3)\n"
        ).body
    )
    g = grid_locals(stmts[1:], {"pid0", "pid1", "x", "y"}, also={0}, bound={2: "kv"}, counts=True)
    assert dict(g.pids) == {0: "_pid0", 1: "_pid1", 2: "kv", 3: "pid3"} and g.new_pids == (0, 1, 3)
    assert g.bind("pl") == [
        "_pid0 = pl.program_id(0)",
        "_pid1 = pl.program_id(1)",
        "pid3 = pl.program_id(3)",
        "num1 = pl.num_programs(1)",
    ]
    used = cst.Module(body=[g.use(s) for s in stmts[1:]]).code
    assert "program_id" not in used and "num_programs" not in used
    assert "x = _pid1 + kv" in used and "if _pid1 == num1 - 1:" in used and "y = pid3" in used
    plain = grid_locals(stmts[1:2], set())
    assert plain.counts == {} and plain.bind("pl") == ["pid1 = pl.program_id(1)", "pid2 = pl.program_id(2)"]
