"""The `triton.language` names the rules translate, and how (a table per kind, read by `exprs.py`)."""

from __future__ import annotations

DTYPES = {
    "float32": "jnp.float32",
    "float16": "jnp.float16",
    "bfloat16": "jnp.bfloat16",
    "float64": "jnp.float32",  # TPUs have no f64: computed in f32 (said in the port's header)
    "int64": "jnp.int32",  # index math: int32 on TPU (x64 off)
    "int32": "jnp.int32",
    "int16": "jnp.int16",
    "int8": "jnp.int8",
    "uint8": "jnp.uint8",
    "uint32": "jnp.uint32",
    "int1": "jnp.bool_",
}

# elementwise math: tl.X, tl.math.X, libdevice.X and bare names imported from triton modules
MATH = {
    "exp": "jnp.exp",
    "exp2": "jnp.exp2",
    "log": "jnp.log",
    "log2": "jnp.log2",
    "log1p": "jnp.log1p",
    "sqrt": "jnp.sqrt",
    "sqrt_rn": "jnp.sqrt",
    "rsqrt": "jax.lax.rsqrt",
    "sigmoid": "jax.nn.sigmoid",
    "abs": "jnp.abs",
    "fabs": "jnp.abs",
    "cos": "jnp.cos",
    "sin": "jnp.sin",
    "tanh": "jnp.tanh",
    "erf": "jax.lax.erf",
    "floor": "jnp.floor",
    "ceil": "jnp.ceil",
    "maximum": "jnp.maximum",
    "minimum": "jnp.minimum",
    "where": "jnp.where",
    "fma": "_fma",
    "div_rn": "jnp.true_divide",
    "fdiv": "jnp.true_divide",
    "pow": "jnp.power",
    "cdiv": "_cdiv",
    "clamp": "jnp.clip",
    "softmax": "_softmax",
}

REDUCTIONS = ("sum", "max", "min", "argmax", "argmin")

# constructs declined on sight, with the reason printed for the line that uses them
DECLINED = {
    "atomic_add": "atomics have no Pallas TPU equivalent (programs do not share writable memory)",
    "atomic_max": "atomics have no Pallas TPU equivalent (programs do not share writable memory)",
    "atomic_min": "atomics have no Pallas TPU equivalent (programs do not share writable memory)",
    "atomic_cas": "atomics have no Pallas TPU equivalent (programs do not share writable memory)",
    "atomic_xchg": "atomics have no Pallas TPU equivalent (programs do not share writable memory)",
    "atomic_and": "atomics have no Pallas TPU equivalent (programs do not share writable memory)",
    "atomic_or": "atomics have no Pallas TPU equivalent (programs do not share writable memory)",
    "inline_asm_elementwise": "inline PTX/assembly cannot run on a TPU",
    "dot": "tl.dot outside a 2-D tile kernel body (e.g. in a @triton.jit helper) is not in the rule subset",
    "make_block_ptr": "tl.make_block_ptr outside a 2-D tile kernel body (e.g. in a @triton.jit helper)",
    "advance": "tl.advance outside the K loop of a 2-D tile kernel",
    "rand": "tl.rand (Philox random numbers) differs from any TPU generator",
    "randn": "tl.randn (Philox random numbers) differs from any TPU generator",
    "cumsum": "tl.cumsum does not lower for TPU (FACTS.md: cumsum is rejected)",
    "sort": "tl.sort does not lower for TPU (FACTS.md: sort is rejected)",
    "histogram": "tl.histogram is not in the rule subset",
    "gather": "tl.gather (data-dependent indexing) is not in the rule subset",
}

DROPPED = (
    "static_assert",
    "static_print",
    "debug_barrier",
    "device_assert",
    "device_print",
    "multiple_of",
    "max_contiguous",
    "assume",
)
