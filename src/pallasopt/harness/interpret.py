"""Running Pallas kernels on the CPU: the adapter over JAX's interpret-mode switches (private API)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

# Entries in the TPU interpreter's vector clocks. JAX defaults to 2 x cores (2), so every DMA shares one virtual
# clock entry and two copies in flight look ordered: DMA-vs-DMA races go unseen. With more entries each DMA gets its
# own (random, so two copies collide with probability ~1/63).
VECTOR_CLOCK_SIZE = 64


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

        params = pltpu.InterpretParams(
            detect_races=True, uninitialized_memory="nan", vector_clock_size=VECTOR_CLOCK_SIZE
        )
        with pltpu.force_tpu_interpret_mode(params):
            yield ipc
        return
    prev = config.pallas_tpu_interpret_mode_context_manager.swap_local(True)
    try:
        yield None
    finally:
        config.pallas_tpu_interpret_mode_context_manager.set_local(prev)


def races_found(state: Any) -> bool:
    """Whether the TPU interpreter's race detector reported a race during the last run."""
    races = getattr(state, "races", None)
    return bool(getattr(races, "races_found", False))
