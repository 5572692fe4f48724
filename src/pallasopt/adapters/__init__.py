"""Adapters: a JAXBench workload file or a MaxKernel task folder as pallasopt's reference + inputs.

Both suites give an oracle and an input builder; the Pallas kernel to optimize is the one the user writes against
them (`to_kernel_module_template` writes the kernel-module skeleton, `import_main` is `pallasopt import`).

The formats, as read in the public repositories:

- JAXBench (github.com/AI-Hypercomputer/accelerator-agents: JAXBench/README.md, JAXBench/harness/evaluator.py,
  JAXBench/harness/loader.py, JAXBench/benchmark/level2/8p_GEMM/baseline.py; github.com/aryatschand/JAXBench:
  README.md, benchmark/12p_RMSNorm/baseline.py, benchmark/19k_Matmul_Subtract_Multiply_ReLU/baseline.py,
  benchmark/11p_Megablox_GMM/baseline.py, real_workloads/qwen3/qwen3_8b_gqa.py,
  real_workloads/llama3/llama3_8b_token_embed.py, tokamax/gated_linear_unit/llama3_8b_swiglu.py).
  A workload file (``benchmark/<name>/baseline.py``, with a hand-written Pallas ``optimized.py`` beside some) has a
  module-level ``CONFIG`` dict (metadata, sizes, sometimes ``atol``/``rtol``), ``create_inputs(dtype=...)`` taking
  no key and no CONFIG (it reads the global CONFIG and seeds itself: ``jax.random.PRNGKey(42)`` or
  ``jax.random.key(0)``), and ``workload(*inputs)`` taking the inputs unpacked (it may read CONFIG too). The harness
  calls ``create_inputs(dtype=jnp.bfloat16)`` when there is a ``dtype`` parameter, wraps a lone array in a tuple,
  runs ``workload`` eagerly when the module sets ``_skip_jit``, and compares with atol = rtol = 1e-2.
- MaxKernel (same accelerator-agents repository: MaxCode/MaxKernel/evaluation/jaxbench_adapted_dataset/{12p_RMSNorm,
  1p_Flash_Attention,11p_Megablox_GMM,7p_Ragged_Paged_Attention}/reference.py and kernel_task.yaml,
  MaxCode/MaxKernel/tools/test_harness_template.py, tools/assemble_test_run.py, v2/tools/assemble_test_harness.py,
  subagents/generate_test_file_agent.md). A task folder holds ``reference.py`` with ``get_inputs(dtype=...)``
  (sizes are literals or a ``CONFIG`` dict *local* to it; fixed ``jax.random.key(42)`` seed) returning
  ``(dynamic_args, static_args)`` or a list of such pairs, and ``computation(*dynamic_args, *static_args)``, the
  static args being jit ``static_argnums``; ``kernel_task.yaml`` repeats ``get_inputs`` as ``input_gen_code``. A
  kernel file is another module with a module-level ``computation`` of the same signature. No ``get_init_inputs``
  appeared there (that is KernelBench's ``Model`` format); this module does not use it.

How the suites map onto pallasopt's format:

- dims: JAXBench's integer ``CONFIG`` entries; MaxKernel's integer literals assigned to names (or to keys of a dict
  literal) at the top of ``get_inputs``, which are rewritten in place to ``__pallasopt_dims__.get(name, literal)``
  (same lines, so tracebacks stay right). ``make_inputs(key, **dims)`` runs the builder with those sizes.
- the key: the builders ignore any key, so while they run ``jax.random.key(s)`` / ``jax.random.PRNGKey(s)`` return
  ``jax.random.fold_in(key, s)`` (same key flavour as asked for), and numpy's generators are seeded with a hash of
  the key's bits mixed with the seed they ask for (``np.random.seed``/``default_rng``/``RandomState``; the global
  numpy state is seeded too and restored afterwards). Distinct keys give distinct inputs and the suite's own
  distributions are kept. Under ``jax.eval_shape`` the key has no bits, so numpy keeps its own seed (only shapes
  matter there).
- the reference: ``workload`` (with CONFIG set to the dims that built the inputs) or ``computation(*args,
  *static_args)`` with the static args that ``get_inputs`` returned for those inputs. The adapter remembers which
  dims built inputs of which shapes; inputs of the same shapes built from dims that differ only in non-shape
  integers share the last record.
- static args and CONFIG values are not kernel arguments: the entry takes the dynamic args only, and
  ``SuiteWorkload.params(*args)`` gives them for a given input tuple.
"""

from ._common import DIMS_GLOBAL, Build, Call, Signature, SuiteWorkload
from .emit import to_kernel_module, to_kernel_module_template
from .importer import import_main, import_task
from .jaxbench import JAXBENCH_TOLERANCE, jaxbench_from_source, load_jaxbench
from .kernelbench import KERNELBENCH_TOLERANCE, kernelbench_from_source
from .maxkernel import MAXKERNEL_TOLERANCE, load_maxkernel, maxkernel_from_source
from .tasks import Task, locate

__all__ = [
    "DIMS_GLOBAL",
    "JAXBENCH_TOLERANCE",
    "KERNELBENCH_TOLERANCE",
    "MAXKERNEL_TOLERANCE",
    "Build",
    "Call",
    "Signature",
    "SuiteWorkload",
    "Task",
    "import_main",
    "import_task",
    "jaxbench_from_source",
    "kernelbench_from_source",
    "load_jaxbench",
    "load_maxkernel",
    "locate",
    "maxkernel_from_source",
    "to_kernel_module",
    "to_kernel_module_template",
]
