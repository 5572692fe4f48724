"""ir/scope.py: the names one function body binds, read from source (no tracing)."""

from __future__ import annotations

import libcst as cst
import pytest

from pallasopt.errors import PassNotApplicable
from pallasopt.ir.matchers import code
from pallasopt.ir.scope import Scope, params, statements

KERNEL = """
def kernel(q_ref, o_ref, *, scale):
    i = pl.program_id(0)
    h, j = pl.program_id(1), pl.program_id(2)
    k = pl.program_id(3); row = i * 8
    n = 1
    n = n + 1
    m: int = 2
    acc = 0
    acc += 1
    o_ref[i] = row  # a store into a ref binds no name
    for t in range(2):
        pass

    def body(c, carry):
        hidden = 3  # a nested def's locals are its own
        return carry

    late = pl.program_id(4)
"""


def _scope() -> tuple[cst.FunctionDef, Scope]:
    fn = cst.parse_module(KERNEL).body[0]
    assert isinstance(fn, cst.FunctionDef)
    return fn, Scope.of(statements(fn))


def test_pid_locals_through_aliases_and_tuples() -> None:
    _, scope = _scope()
    assert scope.pid_locals() == {0: "i", 1: "h", 2: "j", 3: "k", 4: "late"}
    assert scope.pid_locals(stop=3) == {0: "i", 1: "h", 2: "j", 3: "k"}  # `late` is bound after statement 3
    assert scope.pid_locals(stop=1) == {0: "i"}


def test_single_assignments_and_opaque_names() -> None:
    fn, scope = _scope()
    assert {n: code(v) for n, v in scope.env.items()} == {
        "i": "pl.program_id(0)",
        "k": "pl.program_id(3)",
        "row": "i * 8",
        "late": "pl.program_id(4)",
    }
    assert scope.rebound == {"n", "acc"}  # assigned twice / a plain assignment then `+=`
    assert {"n", "acc", "h", "j", "m", "t", "body"} <= scope.opaque  # rebound, or not bound by a plain assignment
    assert not ({"hidden", "o_ref", "q_ref", "c", "carry"} & scope.bound)
    assert scope.bound_in(0, 2) == {"i", "h", "j"}
    assert [p.name.value for p in params(fn)] == ["q_ref", "o_ref", "scale"]


def test_a_second_pid_binding_is_not_an_alias() -> None:
    fn = cst.parse_module("def f():\n    i = pl.program_id(0)\n    i = i + 1\n    j = pl.program_id(0)\n").body[0]
    assert isinstance(fn, cst.FunctionDef)
    scope = Scope.of(statements(fn))
    assert "i" in scope.rebound and "i" not in scope.env
    assert scope.pid_locals() == {0: "j"}


def test_nonlocal_rebinds_the_outer_name() -> None:
    src = "def f():\n    x = 1\n    def g():\n        nonlocal x\n        x = 2\n"
    fn = cst.parse_module(src).body[0]
    assert isinstance(fn, cst.FunctionDef)
    assert "x" not in Scope.of(statements(fn)).env


def test_one_line_def_declines() -> None:
    fn = cst.parse_module("def f(): pass\n").body[0]
    assert isinstance(fn, cst.FunctionDef)
    with pytest.raises(PassNotApplicable, match="one-line def"):
        statements(fn)
