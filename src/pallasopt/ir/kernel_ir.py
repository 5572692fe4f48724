"""KernelIR: an immutable libcst Module plus the facts traced from JAX for each pallas_call."""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from ..errors import KernelError, check
from ..pyparse import parse_module
from ..workload import Workload, load_source, read_file
from .facts import CallFacts
from .trace import find_pallas_call_chains, trace_calls, trace_entry


def source_digest(source: str) -> str:
    """Digest of the code's meaning, not its formatting: equal for sources that differ only in layout/comments."""
    try:
        text = ast.dump(parse_module(source), annotate_fields=False, include_attributes=False)
    except SyntaxError:
        text = source
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_cst(source: str, path: str) -> cst.Module:
    try:
        return cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        raise KernelError(f"syntax error: {e.message}", path=path, line=e.raw_line, hint="fix the syntax") from None


@dataclass(frozen=True)
class KernelIR:
    """A kernel module as the passes see it. `source` is the truth; `module` and `calls` are derived from it."""

    source: str
    path: str
    calls: tuple[CallFacts, ...]
    dims: Mapping[str, int]
    entry: str
    recipe: tuple[str, ...] = ()
    module: cst.Module = field(compare=False, repr=False, default_factory=lambda: cst.parse_module(""))
    workload: Workload | None = field(compare=False, repr=False, default=None)

    @property
    def digest(self) -> str:
        return source_digest(self.source)

    @staticmethod
    def from_source(source: str, path: str, recipe: tuple[str, ...] = ()) -> KernelIR:
        """Parse, load and trace a kernel module source (raises `KernelError` on a bad module)."""
        workload = load_source(source, path)  # first: its syntax errors name the right line
        module = parse_cst(source, path)
        calls = trace_calls(workload)
        return KernelIR(
            source=source,
            path=path,
            calls=calls,
            dims=dict(workload.dims),
            entry=workload.spec.entry,
            recipe=recipe,
            module=module,
            workload=workload,
        )

    @staticmethod
    def from_file(path: str | Path) -> KernelIR:
        return KernelIR.from_source(read_file(path), str(path))

    def with_module(self, module: cst.Module, applied: str) -> KernelIR:
        """The IR of a rewritten module: re-loaded and re-traced (a rewrite that no longer traces raises)."""
        return KernelIR.from_source(module.code, self.path, (*self.recipe, applied))

    def with_source(self, source: str, applied: str) -> KernelIR:
        return KernelIR.from_source(source, self.path, (*self.recipe, applied))


def kernel_jaxpr(ir: KernelIR, call: int, dims: dict[str, int] | None = None) -> object:
    """The kernel body jaxpr of pallas_call `call`, traced at `dims` (default: the module's)."""
    check(ir.workload is not None, "the IR has no loaded workload to trace")
    assert ir.workload is not None
    chains = find_pallas_call_chains(trace_entry(ir.workload, dims).jaxpr)
    check(call < len(chains), f"no pallas_call #{call} when traced at {dims}")
    return chains[call][-1].params["jaxpr"]
