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
