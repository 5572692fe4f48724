"""Running Pallas kernels on the CPU: the adapter over JAX's interpret-mode switches (private API)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# Entries in the TPU interpreter's vector clocks. JAX defaults to 2 x cores (2), so every DMA shares one virtual
# clock entry and two copies in flight look ordered: DMA-vs-DMA races go unseen. With more entries each DMA gets its
# own (random, so two copies collide with probability ~1/63).
VECTOR_CLOCK_SIZE = 64


# How many block reads `_read_blocks` remembers before it forgets them all (a forgotten read only costs speed).
_READS_KEPT = 4096


@dataclass
class _ReadBlocks:
    """Skips plain interpret mode's write-back of blocks the kernel body did not change.

    JAX 0.10.2's HLO interpreter (`jax._src.pallas.hlo_interpreter.pallas_call_hlo_interpret`) runs the grid as a
    while loop that, on every step, slices each operand's block out of the whole array (`_dynamic_slice`), evaluates
    the body, and writes *every* block back (`_dynamic_update_slice`), inputs included. Writing an input back into
    the loop-carried array it was also read from makes XLA copy the whole array, twice, on every step: that is
    why FACTS.md measured interpret-mode steps costing by the whole array (0.53 ms per step at 1024^2 f32 with
    128 blocks, 7.3 ms at 2048^2, here). A block the body did not change comes back from `eval_jaxpr` as the very
    same tracer `_dynamic_slice` returned, and writing a block back where it was read is the identity, so returning
    the array unchanged is exact: outputs, poisoned outputs and written inputs go through as before. Measured on
    that matmul: 0.09 ms per step at 1024^2 and 2048^2, same result bits."""

    slice_fn: Any
    update_fn: Any
    reads: dict[int, tuple[Any, Any, Any]] = field(default_factory=dict)

    def dynamic_slice(self, start_idx: Any, block_shape: Any, value: Any, *rest: Any) -> Any:
        block = self.slice_fn(start_idx, block_shape, value, *rest)
        if len(self.reads) >= _READS_KEPT:
            self.reads.clear()
        self.reads[id(block)] = (block, value, start_idx)
        return block

    def dynamic_update_slice(self, start_idx: Any, block_shape: Any, value: Any, update: Any, *rest: Any) -> Any:
        read = self.reads.get(id(update))
        if read is not None and read[0] is update and read[1] is value and read[2] is start_idx:
            return value
        return self.update_fn(start_idx, block_shape, value, update, *rest)


def _install_read_blocks() -> bool:
    """Route the HLO interpreter's block slicing through `_ReadBlocks` (once per process); False when this JAX has
    no such functions (then interpret mode runs as JAX wrote it: correct, slower)."""
    from jax._src.pallas import hlo_interpreter as hi

    current = getattr(hi, "_dynamic_slice", None)
    update = getattr(hi, "_dynamic_update_slice", None)
    if current is None or update is None:
        return False
    owner = getattr(current, "__self__", None)
    if isinstance(owner, _ReadBlocks):
        return True
    patch = _ReadBlocks(current, update)
    setattr(hi, "_dynamic_slice", patch.dynamic_slice)  # noqa: B010 (a private function mypy types by its own)
    setattr(hi, "_dynamic_update_slice", patch.dynamic_update_slice)  # noqa: B010
    return True


class DeadlockError(RuntimeError):
    """A kernel waits on a semaphore that nothing in flight can signal: on the chip it would hang."""


def _deadlock_aware(wait: Any) -> Any:
    """The TPU interpreter's `Semaphore.wait`, failing at once where it would spin forever: on one core (the checks
    run one) the waiting thread is the only one, so a count short of the wait with no pending copy to run can never
    rise (JAX 0.10.2's loop polls every 0.1 s until the check's timeout, 300 s and more, a whole search budget). With
    copies pending it runs them one at a time as JAX's loop does, then leaves the wait (and its clocks) to JAX."""

    def checked(self: Any, value: Any, global_core_id: Any, *args: Any, **kwargs: Any) -> Any:
        core = int(global_core_id)
        while self.num_cores == 1:
            self.shared_memory.check_failed()
            with self.cv:
                count = int(self.count_by_core[core])
                task = self.tasks[core].pop() if count < value and self.tasks[core] else None
            if count >= value:
                break
            if task is None:
                raise DeadlockError(
                    f"deadlock: the kernel waits on a semaphore for {int(value)} with {count} signalled and no copy in "
                    "flight to signal it (a wait on the wrong slot or semaphore, or a copy never started): on the "
                    "chip it would hang"
                )
            task()
        return wait(self, value, global_core_id, *args, **kwargs)

    checked.__wrapped__ = wait  # type: ignore[attr-defined]
    return checked


def _install_deadlock_check() -> bool:
    """Wrap the TPU interpreter's semaphore wait with `_deadlock_aware` (once per process); False when this JAX has
    no such class (then a deadlocked kernel runs into the check's timeout, as before)."""
    try:
        from jax._src.pallas.mosaic.interpret.shared_memory import Semaphore
    except ImportError:
        return False
    if not hasattr(Semaphore.wait, "__wrapped__"):
        Semaphore.wait = _deadlock_aware(Semaphore.wait)  # type: ignore[method-assign]
    return True


@contextlib.contextmanager
def interpret_mode(simulate_tpu: bool) -> Iterator[Any]:
    """Force every pallas_call traced inside to run in interpret mode, without editing the kernel.

    `simulate_tpu=False`: plain interpret (`interpret=True`, fast; unwritten outputs are NaN / INT_MIN).
    `simulate_tpu=True`: TPU interpret mode with DMA/semaphore simulation and the race detector, for kernels with
    manual DMA; yields the race-detection state holder (read `races_found` after running).
    """
    from jax._src import config
    from jax.experimental.pallas import tpu as pltpu

    if simulate_tpu:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

        _install_deadlock_check()
        params = pltpu.InterpretParams(
            detect_races=True, uninitialized_memory="nan", vector_clock_size=VECTOR_CLOCK_SIZE
        )
        with pltpu.force_tpu_interpret_mode(params):
            yield ipc
        return
    _install_read_blocks()
    prev = config.pallas_tpu_interpret_mode_context_manager.swap_local(True)
    try:
        yield None
    finally:
        config.pallas_tpu_interpret_mode_context_manager.set_local(prev)


def races_found(state: Any) -> bool:
    """Whether the TPU interpreter's race detector reported a race during the last run."""
    races = getattr(state, "races", None)
    return bool(getattr(races, "races_found", False))
