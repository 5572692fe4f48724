"""What the JAXBench and MaxKernel loaders share: SuiteWorkload, key routing, dims, the _Bridge, the final survey.

The key routing and the mapping of the suites onto pallasopt's format are described in the package docstring
(`pallasopt.adapters`).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import keyword
import re
import threading
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import KernelError, short
from ..pyparse import parse_module
from ..workload import user_line

Signature = tuple[tuple[Any, ...], ...]
DIMS_GLOBAL = "__pallasopt_dims__"  # the dict a suite module's rewritten size literals read


@dataclass(frozen=True)
class SuiteWorkload:
    """A suite's workload seen as pallasopt's reference + inputs (the kernel is still to be written)."""

    name: str
    path: str
    reference: Callable[..., Any]
    make_inputs: Callable[..., tuple[Any, ...]]  # make_inputs(key, **dims) -> the dynamic arguments
    dims: dict[str, int]
    source: str
    suite: str = "jaxbench"  # "jaxbench" or "maxkernel"
    arg_names: tuple[str, ...] = ()
    params: Callable[..., dict[str, Any]] | None = None  # params(*args): CONFIG / static args for these inputs
    hand_tuned: Callable[..., Any] | None = None  # the suite's own Pallas kernel, when the folder has one
    hand_tuned_path: str | None = None
    hand_tuned_source: str | None = None
    tolerance: dict[str, float] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # loader keywords the template repeats (dtype, case)
    notes: tuple[str, ...] = ()  # what the import noticed and the user should know
    dims_of: Callable[..., dict[str, int]] | None = None  # dims_of(*args): the dims that built these inputs
    full_args: Callable[..., tuple[Any, ...]] | None = None  # full_args(*args): with the static scalars put back

    @contextlib.contextmanager
    def kernel_globals(self, namespace: dict[str, Any], *args: Any) -> Iterator[None]:
        """While a kernel module's code runs on `args`, its module-level sizes and CONFIG follow the dims that
        built `args` (a kernel written for the suite reads them as the suite's own files do)."""
        dims = self.dims_of(*args) if self.dims_of is not None else {}
        saved = dict(namespace)
        for k, v in dims.items():
            if isinstance(namespace.get(k), int) and not isinstance(namespace.get(k), bool):
                namespace[k] = v
        config = namespace.get("CONFIG")
        if isinstance(config, dict):
            namespace["CONFIG"] = {**config, **{k: v for k, v in dims.items() if k in config}}
        try:
            yield
        finally:
            for k in [*dims, "CONFIG"]:
                if k in saved:
                    namespace[k] = saved[k]

    def args_for(self, fn: Callable[..., Any], *args: Any, extra: int = 0) -> tuple[Any, ...]:
        """The arguments a kernel's function takes: the builder's outputs with its static scalars put back, or
        only the arrays when the kernel takes just those (a kernel file with its own create_inputs may drop a
        size it derives from the shapes, as JAXBench's 11p_Megablox_GMM/optimized.py does). `extra`: how many
        more arguments the caller appends (MaxKernel's static args)."""
        full = self.full_args(*args) if self.full_args is not None else args
        names, star = _positional_names(fn)
        if star or len(names) == len(full) + extra:
            return full
        if len(names) == len(args) + extra:
            return args
        shapes = ", ".join(f"{a.dtype}{list(a.shape)}" if hasattr(a, "shape") else repr(a) for a in full)
        raise KernelError(
            f"the kernel's {getattr(fn, '__name__', 'function')}({', '.join(names)}) takes {len(names)} arguments; "
            f"the task gives {len(full) + extra} ({shapes}" + (f", and {extra} static" if extra else "") + ")",
            path=getattr(getattr(fn, "__code__", None), "co_filename", None),
            line=getattr(getattr(fn, "__code__", None), "co_firstlineno", None),
            hint="the kernel was written for other inputs: pair it with its own task, or adapt its signature",
        )

    def static_args(self, *args: Any) -> list[Any]:
        """MaxKernel: the static args `get_inputs` returned beside these dynamic args."""
        assert self.params is not None
        return list(self.params(*args).values())

    def maxkernel_args(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
        """MaxKernel: what `computation` takes: the dynamic args, then the static args."""
        static = self.static_args(*args)
        return (*self.args_for(fn, *args, extra=len(static)), *static)

    def run_model(self, model_cls: Any, *args: Any) -> Any:
        """KernelBench: `model_cls(*get_init_inputs())` with the parameters from `args`, applied to the inputs."""
        from .kernelbench import run_model

        assert self.params is not None
        return run_model(model_cls, args, self.params(*args), self.path)


# ---------------------------------------------------------------- keys: fixed seeds become functions of the key

_ROUTING = threading.RLock()


def _is_typed(key: Any) -> bool:
    return bool(jnp.issubdtype(key.dtype, jax.dtypes.prng_key))


def _u32(seed: Any) -> Any:
    return int(seed) % (1 << 32) if isinstance(seed, int | np.integer) else seed


def _mix(base: int, seed: object) -> int:
    return int.from_bytes(hashlib.sha256(f"{base}:{seed!r}".encode()).digest()[:4], "little")


def _concrete_seed(key: Any) -> int | None:
    """A 32-bit seed from the key's bits; None for an abstract key (under eval_shape or jit)."""
    try:
        bits = np.asarray(jax.random.key_data(key) if _is_typed(key) else key)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None
    return int.from_bytes(hashlib.sha256(bits.tobytes()).digest()[:4], "little")


@contextlib.contextmanager
def _seeded_from(key: Any, module: types.ModuleType) -> Iterator[None]:
    """While the suite's builder runs in this thread, its fixed seeds are folded into `key` (see module docstring)."""
    owner = threading.get_ident()
    typed = _is_typed(key)
    orig_key, orig_prng = jax.random.key, jax.random.PRNGKey

    def new_key(seed: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != owner:
            return orig_key(seed, *args, **kwargs)
        k = jax.random.fold_in(key, _u32(seed))
        return k if typed else jax.random.wrap_key_data(k)

    def new_prng(seed: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() != owner:
            return orig_prng(seed, *args, **kwargs)
        k = jax.random.fold_in(key, _u32(seed))
        return jax.random.key_data(k) if typed else k

    swaps: list[tuple[Any, str, Any]] = [(jax.random, "key", new_key), (jax.random, "PRNGKey", new_prng)]
    swaps += [(module, n, new_key) for n, v in vars(module).items() if v is orig_key]
    swaps += [(module, n, new_prng) for n, v in vars(module).items() if v is orig_prng]
    np_seed = _concrete_seed(key)
    with _ROUTING:
        np_state = None
        if np_seed is not None:
            swaps += _numpy_swaps(np_seed, owner)
            np_state = np.random.get_state()
            np.random.seed(np_seed)
        saved = [(obj, name, getattr(obj, name)) for obj, name, _ in swaps]
        try:
            for obj, name, value in swaps:
                setattr(obj, name, value)
            yield
        finally:
            for obj, name, value in reversed(saved):
                setattr(obj, name, value)
            if np_state is not None:
                np.random.set_state(np_state)


def _numpy_swaps(base: int, owner: int) -> list[tuple[Any, str, Any]]:
    orig_seed, orig_rng, orig_rs = np.random.seed, np.random.default_rng, np.random.RandomState

    def seed(s: Any = None) -> None:
        orig_seed(_mix(base, s) if threading.get_ident() == owner else s)

    def default_rng(s: Any = None) -> np.random.Generator:
        return orig_rng(_mix(base, s) if threading.get_ident() == owner else s)

    class RandomState(orig_rs):  # type: ignore[misc,valid-type]
        def __init__(self, s: Any = None) -> None:
            super().__init__(_mix(base, s) if threading.get_ident() == owner else s)

    return [(np.random, "seed", seed), (np.random, "default_rng", default_rng), (np.random, "RandomState", RandomState)]


# ---------------------------------------------------------------- dims and suite parameters


@contextlib.contextmanager
def _module_global(module: types.ModuleType, name: str, value: Any) -> Iterator[None]:
    had, old = hasattr(module, name), getattr(module, name, None)
    setattr(module, name, value)
    try:
        yield
    finally:
        if had:
            setattr(module, name, old)
        else:
            delattr(module, name)


def _is_dim(name: object, value: object) -> bool:
    return (
        isinstance(name, str)
        and name.isidentifier()
        and not keyword.iskeyword(name)
        and name not in ("key", "dtype", "atol", "rtol")
        and "seed" not in name.lower()
        and isinstance(value, int)
        and not isinstance(value, bool)
    )


def _signature(args: Sequence[Any]) -> Signature:
    out: list[tuple[Any, ...]] = []
    for a in jax.tree.leaves(args):
        shape = getattr(a, "shape", None)
        out.append((tuple(shape), str(a.dtype)) if shape is not None else ("value", repr(a)))
    return tuple(out)


Build = Callable[[Any, dict[str, int]], tuple[tuple[Any, ...], dict[str, Any]]]
Call = Callable[[tuple[Any, ...], dict[str, Any]], Any]


@dataclass(frozen=True)
class _Built:
    """What one make_inputs call knew: the suite's parameters, the dims, and where its static scalars sat."""

    params: dict[str, Any]
    dims: dict[str, int]
    n_outputs: int
    static: dict[int, Any]


# Per suite file and default dims, shared by every bridge of it in the process: a module pallasopt writes (the
# optimized kernel, with the same embedded task) must know the inputs its original's make_inputs built.
_SEEN: dict[tuple[str, tuple[tuple[str, int], ...]], dict[Signature, _Built]] = {}


def _is_scalar(x: Any) -> bool:
    """A Python number among a builder's outputs: a static argument (a size, a flag), never a traced array."""
    return isinstance(x, bool | int | float | complex | str) or x is None


class _Bridge:
    """make_inputs/reference for one suite module; remembers which parameters built inputs of which shapes.

    Python scalars among the builder's outputs (JAXBench's ``max_expert_size``) are static: make_inputs leaves them
    out (they would become int32 arrays under jit), and `full_args` puts them back where the suite's functions
    expect them."""

    def __init__(self, path: str, dims: dict[str, int], build: Build, call: Call, hand: Call | None) -> None:
        self.path, self.dims, self._build, self._call, self._hand = path, dims, build, call, hand
        self._seen = _SEEN.setdefault((path, tuple(sorted(dims.items()))), {})
        self.default_static: tuple[int, ...] = ()  # positions of the static scalars at the default dims

    def make_inputs(self, key: Any, **dims: int) -> tuple[Any, ...]:
        unknown = sorted(set(dims) - set(self.dims))
        if unknown:
            raise KernelError(
                f"make_inputs got unknown dims {unknown}", path=self.path, hint=f"its dims are {sorted(self.dims)}"
            )
        full = {**self.dims, **{k: int(v) for k, v in dims.items()}}
        built, params = self._build(key, full)
        static = {i: a for i, a in enumerate(built) if _is_scalar(a)}
        args = tuple(a for i, a in enumerate(built) if i not in static)
        self._seen[_signature(args)] = _Built(params, full, len(built), static)
        if full == self.dims:
            self.default_static = tuple(static)
        return args

    def _record(self, args: tuple[Any, ...]) -> _Built:
        sig = _signature(args)
        if sig not in self._seen:
            jax.eval_shape(lambda: self.make_inputs(jax.random.key(0)))  # records the default dims' shapes
        if sig not in self._seen:
            shapes = ", ".join(f"{s[1]}{list(s[0])}" if s[0] != "value" else s[1] for s in sig)
            raise KernelError(
                f"the reference got inputs ({shapes}) that make_inputs did not build in this process",
                path=self.path,
                hint="build them with make_inputs(key, **dims): the suite's parameters follow the dims",
            )
        return self._seen[sig]

    def params(self, *args: Any) -> dict[str, Any]:
        return dict(self._record(args).params)

    def dims_of(self, *args: Any) -> dict[str, int]:
        """The dims that built inputs of these shapes (see `params`)."""
        return dict(self._record(args).dims)

    def full_args(self, *args: Any) -> tuple[Any, ...]:
        """`args` with the builder's static scalars put back in their places."""
        rec = self._record(args)
        dyn = iter(args)
        return tuple(rec.static[i] if i in rec.static else next(dyn) for i in range(rec.n_outputs))

    def reference(self, *args: Any) -> Any:
        return self._call(self.full_args(*args), self.params(*args))

    def hand_tuned(self, *args: Any) -> Any:
        assert self._hand is not None
        return self._hand(self.full_args(*args), self.params(*args))


# ---------------------------------------------------------------- reading suite files


def wrap_dim_sites(source: str, sites: list[tuple[int, int, int, str]]) -> str:
    """Wrap each literal site in ``__pallasopt_dims__.get(name, literal)`` without moving any line."""
    lines = source.splitlines(keepends=True)
    for lineno, c0, c1, name in sorted(sites, reverse=True):
        raw = lines[lineno - 1].encode("utf-8")  # ast column offsets count UTF-8 bytes
        wrapped = f"{DIMS_GLOBAL}.get({name!r}, ".encode() + raw[c0:c1] + b")"
        lines[lineno - 1] = (raw[:c0] + wrapped + raw[c1:]).decode("utf-8")
    return "".join(lines)


def parse_source(source: str, path: str) -> ast.Module:
    try:
        return parse_module(source, filename=path)
    except SyntaxError as e:
        raise KernelError(f"syntax error: {e.msg}", path=path, line=e.lineno, hint="fix the Python syntax") from None


def top_names(tree: ast.Module) -> dict[str, ast.stmt]:
    out: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            out.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def _require(
    tree: ast.Module, path: str, needed: Mapping[str, str], fmt: str, other: tuple[str, str, str] | None = None
) -> None:
    """Each needed top-level name exists, else a one-line error (which names a look-alike of the other suite)."""
    names = top_names(tree)
    for name, what in needed.items():
        if name not in names:
            looks_other = other is not None and other[0] in names and other[1] in names
            hint = (
                f"this looks like a {other[2]} file"
                if other and looks_other
                else f"a {fmt} defines {', '.join(needed)}"
            )
            raise KernelError(f"no `{name}` ({what})", path=path, line=1, hint=hint)


def _positional_names(fn: Callable[..., Any]) -> tuple[list[str], bool]:
    """Positional parameter names and whether the function also takes *args."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [], True
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names, any(p.kind == p.VAR_POSITIONAL for p in params)


def _dtype_option(dtype: str | None) -> Any:
    return None if dtype is None else jnp.dtype(dtype)


def _builder_kwargs(fn: Callable[..., Any], key: Any, dtype: str | None) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    kwargs: dict[str, Any] = {}
    if dtype is not None and "dtype" in params:
        kwargs["dtype"] = _dtype_option(dtype)
    for name in ("key", "rng", "prng_key"):  # none of the real files takes one; if a builder does, give it the key
        if name in params:
            kwargs[name] = key
    return kwargs


# ---------------------------------------------------------------- shared finish: validation and notes


def _finish(
    bridge: _Bridge,
    *,
    name: str,
    source: str,
    suite: str,
    arg_names: tuple[list[str], bool],
    hand: tuple[str | None, str | None],
    tolerance: dict[str, float],
    options: dict[str, Any],
    notes: list[str],
    survey: bool,
) -> SuiteWorkload:
    builder = "create_inputs" if suite == "jaxbench" else "get_inputs"
    count = None
    if survey:
        count = _survey(bridge, source, builder, notes)
    names, star = arg_names
    if not star and not re.search(r"\b(np|numpy)\.random\b", source):
        if count is None:
            jax.eval_shape(lambda: bridge.make_inputs(jax.random.key(0)))  # learns where the static scalars sit
        names = [n for i, n in enumerate(names) if i not in bridge.default_static]
    if count is None:
        count = len(names) if not star else 0
    args = tuple(names[:count]) if not star and len(names) >= count else tuple(f"arg{i}" for i in range(count))
    return SuiteWorkload(
        name=name,
        path=bridge.path,
        reference=bridge.reference,
        make_inputs=bridge.make_inputs,
        dims=dict(bridge.dims),
        source=source,
        suite=suite,
        arg_names=args,
        params=bridge.params,
        dims_of=bridge.dims_of,
        full_args=bridge.full_args,
        hand_tuned=bridge.hand_tuned if hand[1] is not None else None,
        hand_tuned_path=hand[1],
        hand_tuned_source=hand[0] if hand[1] is not None else None,
        tolerance=tolerance,
        options=options,
        notes=tuple(notes),
    )


def _survey(bridge: _Bridge, source: str, builder: str, notes: list[str]) -> int | None:
    """Check the builder at the default dims (abstractly) and note what the user should know; the input count."""
    path = bridge.path
    if re.search(r"\b(np|numpy)\.random\b", source):
        notes.append(f"{builder} uses numpy's random generator: make_inputs reseeds it from the key's bits")
        return None  # numpy materializes even under eval_shape: do not build the default size here
    key = jax.random.key(0)
    try:
        structs = jax.eval_shape(lambda: bridge.make_inputs(key))
    except KernelError:
        raise
    except Exception as e:
        raise KernelError(
            f"{builder}() failed at the default dims: {type(e).__name__}: {short(e, 240)}",
            path=path,
            line=user_line(e, path),
            hint=f"make_inputs runs {builder} under jax.eval_shape at the default dims",
        ) from None
    closed = jax.make_jaxpr(lambda k: bridge.make_inputs(k))(key)
    dependent = set(closed.jaxpr.invars)
    for eqn in closed.jaxpr.eqns:
        if any(not hasattr(v, "val") and v in dependent for v in eqn.invars):
            dependent.update(eqn.outvars)
    for i, (v, s) in enumerate(zip(closed.jaxpr.outvars, structs, strict=True)):
        if hasattr(v, "val") or v not in dependent:
            notes.append(
                f"input {i} ({s.dtype}{list(s.shape)}) does not depend on the key: every seed gives the same values"
            )
    base = _signature(structs)
    for d, value in bridge.dims.items():
        try:
            probe = jax.eval_shape(lambda d=d, value=value: bridge.make_inputs(key, **{d: 2 * value}))
        except Exception:
            continue  # a size that only works at its default (divisibility, asserts): it does drive something
        if _signature(probe) == base:
            notes.append(f"dim {d!r} does not change any input's shape ({builder} may hardcode its sizes)")
    jax.eval_shape(lambda: bridge.make_inputs(key))  # the default dims are the ones remembered for these shapes
    try:
        jax.eval_shape(bridge.reference, *structs)
    except Exception as e:
        notes.append(f"the reference does not trace at the default dims: {type(e).__name__}: {short(e, 120)}")
    calls = (n.func for n in ast.walk(parse_module(source)) if isinstance(n, ast.Call))
    if any(
        (isinstance(f, ast.Attribute) and f.attr == "pallas_call")
        or (isinstance(f, ast.Name) and f.id == "pallas_call")
        for f in calls
    ):
        notes.append("the suite's reference itself calls pallas_call: on the CPU it needs interpret mode")
    return len(structs)


def _with_notes(sw: SuiteWorkload, extra: tuple[str, ...]) -> SuiteWorkload:
    return replace(sw, notes=sw.notes + extra)
