"""The pass contract: a frozen dataclass with a kebab-case `name`, parameters as fields, `choices` and `apply`."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import libcst as cst

from ..errors import PassNotApplicable, ProblemChanged, UsageError, check
from ..ir.cst_edit import ensure_pltpu
from ..ir.facts import CallFacts
from ..ir.kernel_ir import KernelIR
from ..ir.matchers import Located, find_call_node, jnp_alias, kernel_function, pl_alias

if TYPE_CHECKING:
    from ..cost_model.hardware import Chip

P = TypeVar("P", bound="Pass")


@dataclass(frozen=True)
class Pass:
    """Base of every pass. Subclasses set `name`, document themselves in their docstring, and define
    `choices(ir, chip)` (the concrete instances worth trying here) and `apply(ir)` (pure; declines with
    `errors.check(cond, why)`)."""

    name: ClassVar[str] = "pass"

    @classmethod
    def summary(cls) -> str:
        doc = (cls.__doc__ or "").strip()
        return " ".join(doc.split("\n\n")[0].split())  # one line: the docstring's indentation folded

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        return ()

    def apply(self, ir: KernelIR) -> KernelIR:
        raise NotImplementedError

    def rewrite(self, ir: KernelIR) -> KernelIR:
        """`apply`, refused (`ProblemChanged`) when the result changes what the oracle checks against `ir`
        (`llm.validate.oracle_changes`: the reference, make_inputs, TOLERANCE... and the module names they read),
        e.g. a tile knob that is also a constant of the reference. The one guard the search, `apply` pipelines and
        the report's replay all go through."""
        from ..llm.validate import oracle_changes

        new = self.apply(ir)
        changed = oracle_changes(ir.source, new.source, ir.entry, ir.path)
        if changed:
            raise ProblemChanged(f"the rewrite changes what the oracle checks: {changed[0]}")
        return new

    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def spec(self) -> str:
        """`name{k=v,...}`: the same string in the CLI, the database, the logs and the report."""
        items = ",".join(f"{k}={_fmt(v)}" for k, v in self.params().items())
        return f"{self.name}{{{items}}}" if items else self.name

    @classmethod
    def from_params(cls, params: Mapping[str, str]) -> Pass:
        """Build an instance from spec parameters (strings), coercing to the field types."""
        hints = typing.get_type_hints(cls)
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, raw in params.items():
            if key not in known:
                raise UsageError(
                    f"pass {cls.name!r} has no parameter {key!r}",
                    hint=f"its parameters are: {', '.join(known) or 'none'}",
                )
            kwargs[key] = _coerce(raw, hints.get(key, str), cls.name, key)
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as e:
            raise UsageError(f"bad parameters for pass {cls.name!r}: {e}") from None

    def __str__(self) -> str:
        return self.spec()


def spec_name(spec: str) -> str:
    """The pass name a `name{k=v,...}` spec (a recipe step) starts with."""
    return spec.split("{", 1)[0].strip()


def _fmt(v: Any) -> str:
    if isinstance(v, tuple):
        return ":".join(_fmt(x) for x in v)
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _coerce(raw: str, typ: Any, pass_name: str, key: str) -> Any:
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if raw in ("none", "None", ""):
            return None
        typ = args[0] if args else str
        origin = typing.get_origin(typ)
    try:
        if typ is bool:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if typ is int:
            return int(raw)
        if typ is float:
            return float(raw)
        if origin is tuple:
            inner = typing.get_args(typ)[0] if typing.get_args(typ) else str
            return tuple(_coerce(x, inner, pass_name, key) for x in raw.split(":") if x)
    except ValueError:
        raise UsageError(
            f"pass {pass_name!r}: parameter {key}={raw!r} is not a valid {getattr(typ, '__name__', typ)}"
        ) from None
    return raw


def per_input_choices(ir: KernelIR, make: Callable[[int, int], P], viable: Callable[[P], object]) -> tuple[P, ...]:
    """`make(call, input)` for every input of every plain call (no library site, no scalar prefetch) on which
    `viable` (a pass's planning step) does not decline."""
    out: list[P] = []
    for c in ir.calls:
        if c.library_site is not None or c.num_scalar_prefetch:
            continue
        for i in range(len(c.inputs)):
            choice = make(c.index, i)
            try:
                viable(choice)
            except PassNotApplicable:
                continue
            out.append(choice)
    return tuple(out)


def own_call(ir: KernelIR, index: int) -> CallFacts:
    """The facts of pallas_call `index`, for a pass that rewrites its kernel: declines an index the module does not
    have and a call inside a library function (its kernel is not the module's to edit)."""
    check(0 <= index < len(ir.calls), f"no pallas_call #{index}")
    facts = ir.calls[index]
    check(facts.library_site is None, "the call is inside a library function")
    return facts


@dataclass(frozen=True)
class KernelSite:
    """Where a pass edits a pallas_call and its kernel: the module with pallas.tpu imported (`loc`), the aliases of
    jax.numpy, pallas.tpu and pallas in it, the call node and its module-level kernel def."""

    loc: Located
    node: cst.Call
    kernel: cst.FunctionDef
    jnp: str
    pltpu: str
    pl: str


def kernel_site(ir: KernelIR, facts: CallFacts, why_jnp: str = "") -> KernelSite:
    """The `KernelSite` of the call `facts` (pallas.tpu imported when missing); declines a module without jax.numpy
    (`why_jnp`: what the rewrite needs it for) and a kernel that is not a module-level def."""
    jnp = jnp_alias(ir.module)
    check(jnp is not None, f"the module does not import jax.numpy{why_jnp}")
    assert jnp is not None
    module, pltpu = ensure_pltpu(ir.module)
    loc = Located.of(module)
    node = find_call_node(loc, facts)
    kernel = kernel_function(loc, node)
    check(kernel is not None, "cannot find the kernel function (a module-level def)")
    assert kernel is not None
    return KernelSite(loc, node, kernel, jnp, pltpu, pl_alias(module))
