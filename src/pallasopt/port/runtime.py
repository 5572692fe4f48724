"""The helpers every ported module carries (emitted verbatim into OUT.py, so the module stands alone)."""

PRELUDE = """
BLOCK_ROWS = 8  # rows per program of a row kernel (the Triton launch ran one row per program); tunable


def _cdiv(a, b):
    return -(-a // b)


def _next_power_of_2(n):
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def _calculate_settings(n):
    # liger_kernel.ops.utils.calculate_settings returns (BLOCK_SIZE, num_warps); warps mean nothing on a TPU
    return _next_power_of_2(n), 4


def _stride(x, d=None):
    strides, acc = [], 1
    for n in reversed(x.shape):
        strides.insert(0, acc)
        acc *= n
    return tuple(strides) if d is None else strides[d]


class _Device:
    type = "tpu"


_DEVICE = _Device()


class _constexpr(int):
    @property
    def value(self):
        return int(self)


def _empty(*shape, dtype=jnp.float32, **_unused):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return jnp.zeros(shape, dtype)


def _cast(x, dtype):
    return jnp.asarray(x).astype(dtype)


def _fma(a, b, c):
    return a * b + c


def _pid(R):
    i = pl.program_id(0)
    return i if R is None else i * R + jax.lax.broadcasted_iota(jnp.int32, (R, 1), 0)


def _iota(n, W):
    return jax.lax.iota(jnp.int32, n) if W is None else jax.lax.broadcasted_iota(jnp.int32, (1, W), 1)


def _red(op, x):
    x = jnp.asarray(x)
    f = getattr(jnp, op)
    return f(x, axis=-1, keepdims=True) if x.ndim == 2 else f(x)


def _full(shape, value, dtype, W):
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if W is not None and len(shape) == 1:
        shape = (1, W)
    return jnp.full(shape, value, dtype)


def _ld(ref, kind, mask, other):
    v = ref[:, 0:1] if kind == "scalar" else ref[...]
    if mask is not None and other is not None:
        v = jnp.where(mask, v, other)
    return v


def _st(out, old, kind, value, mask):
    v = jnp.broadcast_to(jnp.asarray(value).astype(out.dtype), out.shape)
    if mask is not None and old is not None:
        v = jnp.where(mask, v, old[...])
    out[...] = v


def _view(mode, name, arr, kind, stride, width, rows, R):
    if arr is None:
        raise ValueError(f"the launch passes None for {name}, which the kernel reads or writes")
    if mode == "flat":
        return arr.reshape(-1), pl.BlockSpec((width,), lambda i: (i,))
    if kind in ("row", "rowscalar"):
        v = arr.reshape(-1, stride)
        if v.shape[0] != rows:
            raise ValueError(f"{name}: {v.shape[0]} rows of stride {stride}, but the launch grid has {rows} programs")
        return v, pl.BlockSpec((R, width if kind == "row" else 1), lambda i: (i, 0))
    v = arr.reshape(1, -1)
    return v, pl.BlockSpec((1, width if kind == "bcast" else v.shape[1]), lambda i: (0, 0))


def _launch(body, grid, mode, arrays, stored, scalars, width, inputs, aliased):
    grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
    if any(int(g) != 1 for g in grid[1:]):
        raise ValueError(f"launch grid {grid}: only program axis 0 is ported")
    rows = int(grid[0])
    R = min(BLOCK_ROWS, rows) if mode == "rows" else None
    views, specs = [], []
    for name, arr, kind, stride in arrays:
        v, s = _view(mode, name, arr, kind, stride, width, rows, R)
        views.append(v)
        specs.append(s)
    outs = [i for i, a in enumerate(arrays) if a[0] in stored]
    ins = [i for i, a in enumerate(arrays) if a[0] in inputs]
    call = pl.pallas_call(
        functools.partial(body, _W=width if mode == "rows" else None, _R=R, **scalars),
        grid=(pl.cdiv(rows, R),) if mode == "rows" else (rows,),
        in_specs=[specs[i] for i in ins],
        out_specs=[specs[i] for i in outs],
        out_shape=[jax.ShapeDtypeStruct(views[i].shape, views[i].dtype) for i in outs],
        input_output_aliases={ins.index(i): k for k, i in enumerate(outs) if arrays[i][0] in aliased},
    )
    res = call(*[views[i] for i in ins])
    return tuple(r.reshape(arrays[i][1].shape) for r, i in zip(res, outs))


def _select(result, keep):
    if keep is None:
        return result
    return tuple(result[i] for i in keep) if len(keep) > 1 else result[keep[0]]
"""

# emitted only when a 2-D tile kernel is ported (tiles.py)
TILE_PRELUDE = """
def _view2(name, arr, rows, cols, store):
    if arr is None:
        raise ValueError(f"the launch passes None for {name}, which the kernel reads or writes")
    s0, s1 = int(rows[2]), int(cols[2])
    if s1 == 1 and s0 >= 1 and arr.size % s0 == 0:
        return arr.reshape(-1, s0)
    if s0 == 1 and s1 > 1 and arr.size % s1 == 0 and not store:
        return arr.reshape(-1, s1).T  # a transposed (column-major) operand
    raise ValueError(f"{name}: strides ({s0}, {s1}) are neither a row-major nor a transposed 2-D view")


def _check_tiles(tiles, launch, gm, gn, scalars):
    # the Triton program -> tile mapping (e.g. the grouped swizzle), run for every program of the launch grid: it
    # must visit each (tile_m, tile_n) once; the port then walks the plain 2-D grid instead
    seen = [tiles(p + (0,) * (3 - len(p)), **scalars) for p in itertools.product(*(range(g) for g in launch))]
    want = {(i, j) for i in range(gm) for j in range(gn)}
    if len(seen) != len(want) or set(seen) != want:
        raise ValueError(
            f"the kernel's program -> tile mapping over the launch grid {launch} is not a permutation of the "
            f"{gm} x {gn} tile grid: not ported"
        )


def _tcast(x, dtype):
    # a cast to f16 inside a tile kernel stays f32 (Mosaic cannot pack f16 either): the f16 output is narrowed
    # outside the kernel, which rounds a stored value exactly as the cast would; arithmetic after the cast is in f32
    x = jnp.asarray(x)
    return x.astype(jnp.float32 if jnp.dtype(dtype) == jnp.float16 else dtype)


def _imap(rows, cols):
    axes = (rows, cols)
    return lambda *g: tuple(0 if a is None else g[a] for a in axes)


def _launch_tiles(body, tiles, grid, arrays, inputs, out, scalars, nk, carried, bounds):
    launch = tuple(int(g) for g in (grid if isinstance(grid, (tuple, list)) else (grid,)))
    views = {n: _view2(n, a, r, c, n == out) for n, a, r, c in arrays}
    # Mosaic has no f16 vectors (the v5e compile fails "Invalid vector type for load"): f16 arrays are widened to f32
    # outside the kernel (exact) and the result narrowed back; values the kernel casts to f16 stay f16-rounded
    half = {n for n, v in views.items() if v.dtype == jnp.float16}
    views = {n: v.astype(jnp.float32) if n in half else v for n, v in views.items()}
    layout = {n: (r, c) for n, _, r, c in arrays}
    ov, (orow, ocol) = views[out], layout[out]
    gm, gn = _cdiv(ov.shape[0], int(orow[0])), _cdiv(ov.shape[1], int(ocol[0]))
    _check_tiles(tiles, launch, gm, gn, scalars)
    for axis, bound in bounds:
        if int(bound) < ov.shape[axis]:
            raise ValueError(f"{out}: the store mask bound {bound} on axis {axis} leaves part of the array unwritten")
    g = (gm, gn) if nk is None else (gm, gn, int(nk))
    spec = {n: pl.BlockSpec((int(r[0]), int(c[0])), _imap(r[1], c[1])) for n, (r, c) in layout.items()}
    sem = ("parallel", "parallel") + (() if nk is None else ("arbitrary",))
    call = pl.pallas_call(
        functools.partial(body, _W=None, _NK=None if nk is None else int(nk), **scalars),
        grid=g,
        in_specs=[spec[n] for n in inputs],
        out_specs=[spec[out]],
        out_shape=[jax.ShapeDtypeStruct(ov.shape, ov.dtype)],
        scratch_shapes=[pltpu.VMEM(tuple(int(s) for s in shape), dtype) for shape, dtype in carried],
        compiler_params=pltpu.CompilerParams(dimension_semantics=sem),
    )
    (res,) = call(*[views[n] for n in inputs])
    res = res.astype(jnp.float16) if out in half else res
    return (res.reshape(next(a for n, a, _, _ in arrays if n == out).shape),)
"""
