"""Facts traced from JAX about each `pallas_call`: frozen values, JSON-serializable via `to_dict`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

import numpy as np

DTYPE_BYTES = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "int32": 4,
    "uint32": 4,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "float64": 8,
    "int64": 8,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int4": 1,
}


def dtype_bytes(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, int(np.dtype(dtype).itemsize) if dtype in np.sctypeDict else 4)


@dataclass(frozen=True)
class IndexMap:
    """How an operand's block index depends on the grid indices.

    `affine[d]` holds the coefficients of block dim d over the grid axes followed by a constant, when the map is
    affine (the common case: `lambda i, j, k: (i, k)`); `None` when it is not (e.g. `i // 2`, or data-dependent through
    scalar prefetch). `depends_on[d]` lists the grid axes block dim d varies with (sampled when not affine).
    """

    affine: tuple[tuple[int, ...], ...] | None
    depends_on: tuple[tuple[int, ...], ...]
    data_dependent: bool
    text: str
    fn: Callable[[Sequence[int]], tuple[int, ...]] | None = field(default=None, compare=False, repr=False)
    # For a block dim that depends on several grid axes (a causal kv map: `select(on_diag, kv, 0)`), the axis whose
    # index it takes at most grid points, when one clearly does (the axis its block size tiles); None otherwise.
    walks: tuple[int | None, ...] = ()
    # Vectorized evaluation (`ir/steps.py`): given each grid axis's index at every step and the scalar-prefetch
    # tables (None when not materialized), each block dim's index at every step; raises `NotEvaluable`.
    vfn: Callable[[Sequence[np.ndarray], Sequence[np.ndarray] | None], tuple[np.ndarray, ...]] | None = field(
        default=None, compare=False, repr=False
    )

    @property
    def axes(self) -> tuple[int, ...]:
        """All grid axes any block dim depends on."""
        return tuple(sorted({a for dims in self.depends_on for a in dims}))

    def block_index(self, idx: Sequence[int]) -> tuple[int, ...]:
        """The block index at grid point `idx` (affine closed form, else evaluated)."""
        if self.affine is not None:
            return tuple(sum(c * i for c, i in zip(row[:-1], idx, strict=True)) + row[-1] for row in self.affine)
        if self.fn is None:
            raise ValueError("index map is neither affine nor evaluable")
        return self.fn(idx)


@dataclass(frozen=True)
class Operand:
    """One blocked input or output of a pallas_call."""

    role: str  # "in" | "out"
    position: int  # index among the call's inputs (or outputs)
    shape: tuple[int, ...]
    dtype: str
    block_shape: tuple[int | None, ...]  # None = squeezed dimension (block size 1, dropped in the kernel)
    memory_space: str  # "vmem" (blocked, pipelined), "any"/"hbm" (raw ref, manual DMA), "smem"
    buffer_count: int | None  # pl.Buffered(n) if given, else None (the default: 2)
    index_map: IndexMap
    origin: str = ""

    @property
    def block_elems(self) -> int:
        return math.prod(1 if b is None else b for b in self.block_shape)

    @property
    def block_bytes(self) -> int:
        return self.block_elems * dtype_bytes(self.dtype)

    @property
    def array_bytes(self) -> int:
        return math.prod(self.shape) * dtype_bytes(self.dtype)

    @property
    def is_pipelined(self) -> bool:
        return self.memory_space in ("vmem", "default")

    def block_dim_of(self, ref_dim: int) -> int:
        """The block dim a dim of the kernel's ref stands for (squeezed `None` dims are not in the kernel's ref)."""
        return [i for i, b in enumerate(self.block_shape) if b is not None][ref_dim]

    @property
    def name(self) -> str:
        return f"{self.role}{self.position}"


@dataclass(frozen=True)
class Scratch:
    shape: tuple[int, ...]
    dtype: str
    memory_space: str

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * dtype_bytes(self.dtype) if self.shape else dtype_bytes(self.dtype)


@dataclass(frozen=True)
class Dot:
    """A matmul in the kernel body: (batch, m, n, k) sizes and operand dtypes, counted per grid step."""

    batch: int
    m: int
    n: int
    k: int
    lhs_dtype: str
    rhs_dtype: str
    out_dtype: str
    count: float = 1  # times executed per grid step (loops; a fraction inside a pl.when on some steps)
    transposed_rhs: bool = False

    @property
    def flops(self) -> int:
        return round(2 * self.batch * self.m * self.n * self.k * self.count)


@dataclass(frozen=True)
class Branching:
    """A top-level `pl.when` / `lax.cond` of the kernel body whose predicate is scalar arithmetic on program ids,
    grid sizes and scalar-prefetch values, so each grid step's branch can be computed (`select`).

    `branches[b]` is the work of branch b alone; `assumed[b]` the weight it was given in the body's aggregate counts
    (`BodyStats.dots` etc.), so a per-step evaluation replaces `assumed` by the true fraction of steps."""

    branches: tuple[BodyStats, ...]
    assumed: tuple[float, ...]
    uses_prefetch: bool
    select: Callable[[Sequence[np.ndarray], Sequence[int], Sequence[np.ndarray] | None], np.ndarray] | None = field(
        default=None, compare=False, repr=False
    )
    # The grid axes the predicate's value derives from (through any arithmetic, prefetch lookup or nested jaxpr that
    # reads program ids); None: unknown, evaluate it on every step.
    axes: tuple[int, ...] | None = None


@dataclass(frozen=True)
class BodyStats:
    """Work the kernel body does in one grid step (from its jaxpr)."""

    dots: tuple[Dot, ...] = ()
    vpu_elems: int = 0  # elementwise + reduction element-ops
    transcendental_elems: int = 0  # exp, log, tanh, logistic, rsqrt, ... (EUP)
    load_bytes: int = 0  # ref reads (VMEM -> vregs)
    store_bytes: int = 0  # ref writes
    has_dma: bool = False
    has_semaphore: bool = False
    has_unbounded_loop: bool = False
    program_id_axes: tuple[int, ...] = ()
    conditional_axes: tuple[int, ...] = ()  # grid axes whose program_id feeds a `pl.when`/cond or resets state
    primitives: tuple[str, ...] = ()
    max_temp_bytes: int = 0  # largest intermediate value in the body
    max_reduced_bytes: int = 0  # largest value a reduction consumes (the compiler keeps one copy in VMEM)
    dma_serialized: bool = False  # a manual copy is waited on right after it starts (no overlap with compute)
    branchings: tuple[Branching, ...] = ()  # pl.when regions whose branch each grid step takes can be computed
    # Loops inside a grid step run by simulation (`ir/loops.py`; emit_pipeline, fori_loop with SMEM bounds): their
    # iterations per grid step (the counts above already include them), the bytes their DMAs move per grid step
    # (0 when none or when the simulation was incomplete) and what was simulated.
    inner_steps: float = 0.0
    dma_bytes: int = 0
    loop_note: str = ""
    # A loop's trip count changes from grid step to grid step (its bound reads program ids: a causal loop that
    # stops at the diagonal). libtpu's static profile cannot count such a loop (search/tiers.py gives no time).
    loop_trips_vary: bool = False
    # Bytes the kernel's top-level `dma_wait`s receive per grid step (each waits on one copy every step, whether
    # that copy was started this step or earlier in a ring); 0 without manual DMA.
    dma_step_bytes: int = 0
    # The largest single manual copy the body starts, at any depth (under `pl.when` too): with the manual traffic it
    # tells how many rounds of copies the grid makes (`cost_model/roofline.py: manual_dma_rounds`).
    dma_copy_bytes: int = 0

    @property
    def mxu_flops(self) -> int:
        return sum(d.flops for d in self.dots)


@dataclass(frozen=True)
class CallFacts:
    """Everything traced about one pallas_call reached from the entry, in trace order."""

    index: int
    name: str
    grid: tuple[int, ...]
    operands: tuple[Operand, ...]
    scratch: tuple[Scratch, ...]
    num_scalar_prefetch: int
    dimension_semantics: tuple[str, ...] | None
    vmem_limit_bytes: int | None
    compiler_params: dict[str, Any]
    body: BodyStats
    span: tuple[int, int] | None  # first and last source line of the pallas_call expression
    input_output_aliases: tuple[tuple[int, int], ...] = ()
    has_cost_estimate: bool = False
    # `file:line (function)` of the pallas_call when a library wrote it (then `span` is the user's call into the
    # library, and only the values the user's file passes in can be rewritten); None when the user's file wrote it.
    library_site: str | None = None
    # Grid axes whose extent is only known at run time (a scalar the wrapper computes, e.g. megablox's active tiles,
    # splash attention's active blocks): `grid` holds the extent materialized from make_inputs when it could be
    # (the prefetch note says so), else ceil(array / block), the extent when no block is visited twice.
    dynamic_axes: tuple[int, ...] = ()
    # Values of the scalar-prefetch operands, materialized from `make_inputs` when they are small integer tables
    # (block masks, page indices, group sizes, lengths); None when not, and `prefetch_note` says why.
    prefetch: tuple[np.ndarray, ...] | None = field(default=None, compare=False, repr=False)
    prefetch_note: str = ""
    kernel_jaxpr_text: str = field(default="", compare=False, repr=False)
    # Buffers the body allocates itself (`pl.run_scoped`; `pltpu.emit_pipeline` holds its block buffers and DMA
    # semaphores there): they take VMEM like scratch, and a semaphore array's length is a pipeline's depth.
    scoped: tuple[Scratch, ...] = ()

    @property
    def inputs(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.operands if o.role == "in")

    @property
    def outputs(self) -> tuple[Operand, ...]:
        return tuple(o for o in self.operands if o.role == "out")

    @property
    def steps(self) -> int:
        return math.prod(self.grid) if self.grid else 1

    @property
    def flops(self) -> int:
        return self.body.mxu_flops * self.steps

    def revisited_axes(self) -> tuple[int, ...]:
        """Grid axes along which some output block index stays fixed: reductions ("arbitrary" axes)."""
        out: set[int] = set()
        for o in self.outputs:
            for axis in range(len(self.grid)):
                if axis not in o.index_map.axes and self.grid[axis] > 1:
                    out.add(axis)
        return tuple(sorted(out))

    def to_dict(self) -> dict[str, Any]:
        out = plain(self)
        assert isinstance(out, dict)
        return out


def plain(value: Any) -> Any:
    """A JSON-ready copy of a facts value: dataclasses to dicts, tuples to lists, `compare=False` fields dropped."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value) if f.compare}
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    if isinstance(value, np.integer | np.floating):
        return value.item()
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)
