"""An optimized kernel that still runs at every size the original ran (issue 17, item 8).

A block size tuned for one problem can be wrong at another (`bk=2048` at K=1024 gives a grid of zero steps: all NaN).
So the module pallasopt writes keeps the original kernel beside the optimized one: the entry runs the optimized code
on the argument shapes it was tuned and verified for, and the original kernel, kept verbatim in the file, on any
other shapes. The module docstring says which dims it was tuned for. `generalize` builds that module and checks it
at the verified size (the optimized path) and at another size the original kernel passes at (the original path).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import libcst as cst

if TYPE_CHECKING:
    from .executors import Executor
    from .harness.check import CheckResult

Shapes = tuple[tuple[int, ...] | None, ...]  # the shape of each positional argument (None: not an array)

TUNED_PREFIX = "_pallasopt_tuned_"

FOOTER = '''

# --- pallasopt: the optimized kernel at the shapes it was tuned and verified for, the original at any other -----
_PALLASOPT_SHAPES = {shapes!r}
_PALLASOPT_ORIGINAL = "\\n".join(
    (
{original}
    )
)
_pallasopt_original_entry = []


def {entry}(*args, **kwargs):
    """`{tuned}` on argument shapes in _PALLASOPT_SHAPES; the original kernel on any other shapes."""
    if tuple(getattr(a, "shape", None) for a in args) in _PALLASOPT_SHAPES:
        return {tuned}(*args, **kwargs)
    if not _pallasopt_original_entry:
        import sys
        import types

        original = types.ModuleType(__name__ + "_pallasopt_original")
        original.__file__ = __file__
        sys.modules[original.__name__] = original
        exec(compile(_PALLASOPT_ORIGINAL, __file__, "exec"), original.__dict__)
        _pallasopt_original_entry.append(getattr(original, {entry!r}))
    return _pallasopt_original_entry[0](*args, **kwargs)
'''


def shapes_of(args: Sequence[Any]) -> Shapes:
    return tuple(tuple(int(d) for d in a.shape) if hasattr(a, "shape") else None for a in args)


def with_fallback(
    optimized: str, original: str, entry: str, tuned_dims: Mapping[str, int], shapes: Sequence[Shapes]
) -> str | None:
    """`optimized` with its entry renamed and a dispatching entry appended (see the module doc); None when the entry
    is not a top-level `def` or a plain assignment (nothing to rename)."""
    module = cst.parse_module(optimized)
    renamed = _rename_top_level(module, entry, TUNED_PREFIX + entry)
    if renamed is None:
        return None
    note = (
        f"pallasopt tuned `{entry}` for the dims {dict(tuned_dims)} (argument shapes {shapes[0]}). It runs the "
        "optimized code on the shapes in _PALLASOPT_SHAPES (those, and the ones it was verified at) and the "
        "original kernel, kept verbatim at the end of this file, on any other shapes."
    )
    body = _with_docstring_note(renamed, note).code.rstrip("\n")
    lines = "\n".join(f"        {line!r}," for line in original.split("\n"))
    footer = FOOTER.format(shapes=tuple(shapes), original=lines, entry=entry, tuned=TUNED_PREFIX + entry)
    return body + "\n" + footer


def _rename_top_level(module: cst.Module, old: str, new: str) -> cst.Module | None:
    body = list(module.body)
    for i, stmt in enumerate(body):
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == old:
            body[i] = stmt.with_changes(name=cst.Name(new))
            return module.with_changes(body=body)
        if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
            small = stmt.body[0]
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
                and small.targets[0].target.value == old
            ):
                target = small.targets[0].with_changes(target=cst.Name(new))
                body[i] = stmt.with_changes(body=[small.with_changes(targets=[target])])
                return module.with_changes(body=body)
    return None


def _with_docstring_note(module: cst.Module, note: str) -> cst.Module:
    """Append `note` to a plain triple-quoted module docstring, or add a docstring when there is none."""
    first = module.body[0] if module.body else None
    if isinstance(first, cst.SimpleStatementLine) and isinstance(first.body[0], cst.Expr):
        string = first.body[0].value
        if isinstance(string, cst.SimpleString):
            value = string.value
            if value[:3] in ('"""', "'''") and "\\" not in value and note[:3] not in value:
                new = value[:-3].rstrip() + "\n\n" + note + "\n" + value[-3:]
                expr = first.body[0].with_changes(value=string.with_changes(value=new))
                return module.with_changes(body=[first.with_changes(body=[expr]), *module.body[1:]])
            return module  # an escaped or one-line docstring is left as it is; the footer comment says the same
    doc = cst.parse_statement(f'"""{note}"""\n')
    return module.with_changes(body=[doc, *module.body])


@dataclass(frozen=True)
class Generalized:
    """The module to write and what checking it at more than one size found."""

    source: str
    ok: bool
    checks: tuple[Mapping[str, Any], ...] = ()
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [dict(c) for c in self.checks], "note": self.note}


def other_dims(tuned: Mapping[str, int], verified: Mapping[str, int], baseline: Mapping[str, int]) -> dict[str, int]:
    """A size to run the original path at: the original kernel's own check dims when they differ from the verified
    and tuned ones, else the verified dims with every even dim halved."""
    if baseline and dict(baseline) not in (dict(verified), dict(tuned)):
        return dict(baseline)
    return {k: v // 2 if v % 2 == 0 and v >= 16 else v for k, v in verified.items()}


def generalize(
    best_source: str,
    original_source: str,
    path: str,
    workload: Any,
    verified_dims: Mapping[str, int],
    baseline_dims: Mapping[str, int],
    seeds: Sequence[int],
    executor: Executor | None = None,
) -> Generalized:
    """Build the module with the fallback and check it at `verified_dims` and at another size (see `other_dims`).

    `workload` is the original's (its `make_inputs` gives the argument shapes). The checks are jobs of `executor`
    (the search's: warm workers, or Ray), both sizes at once; the original kernel is checked at the other size only
    when the module fails there (a failure the original has too is not the optimization's). Without an executor,
    fresh child processes, one after another."""
    from .ir.trace import arg_structs

    tuned = dict(workload.dims)
    shapes = [shapes_of(arg_structs(workload, d)) for d in (tuned, verified_dims)]
    entry = workload.spec.entry
    source = with_fallback(best_source, original_source, entry, tuned, list(dict.fromkeys(shapes)))
    if source is None:
        return Generalized(best_source, True, note=f"no fallback: the entry {entry!r} is not a def or an assignment")
    other = other_dims(tuned, verified_dims, baseline_dims)
    two_sizes = shapes_of(arg_structs(workload, other)) not in shapes
    run = _checks(executor, path, seeds)
    here = run(source, verified_dims)
    there = run(source, other) if two_sizes else None
    checks: list[Mapping[str, Any]] = []
    r = here()
    checks.append({"dims": dict(verified_dims), "path": "optimized", "ok": r.ok, "message": r.message})
    if not r.ok:
        return Generalized(source, False, tuple(checks), f"the module with its fallback fails: {r.message}")
    if there is None:
        return Generalized(source, True, tuple(checks), f"no other size to check: {other} has the tuned shapes")
    r = there()
    if not r.ok:  # whose fault: the original kernel's own at this size is not ours
        b = run(original_source, other)()
        if not b.ok:
            note = f"the original kernel does not pass at {other} either ({b.status}), so no other size was checked"
            return Generalized(source, True, tuple(checks), note)
    checks.append({"dims": dict(other), "path": "original", "ok": r.ok, "message": r.message})
    return Generalized(source, r.ok, tuple(checks), "" if r.ok else f"fails at {other}: {r.message}")


GENERALIZE_CHECK_TIMEOUT_S = 300.0


def _checks(
    executor: Executor | None, path: str, seeds: Sequence[int]
) -> Callable[[str, Mapping[str, int]], Callable[[], CheckResult]]:
    """`run(source, dims)` starts a check of `source` at `dims` and returns a function that waits for its result:
    a job of `executor` (started now), or a fresh child when called (no executor)."""
    from .executors.jobs import check_job
    from .harness.check import check

    def run(source: str, dims: Mapping[str, int]) -> Callable[[], CheckResult]:
        if executor is None:
            return lambda: check(source, path, seeds=seeds, dims=dims, timeout_s=GENERALIZE_CHECK_TIMEOUT_S)
        fut = executor.submit(check_job(source, path, seeds, timeout_s=GENERALIZE_CHECK_TIMEOUT_S, dims=dims))
        return fut.result

    return run
