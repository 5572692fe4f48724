"""Library kernels: a `pallas_call` written in an installed package (jax's `pallas.ops.tpu`, tokamax, the user's own
package) that the user's entry calls into. The passes rewrite only the user's file, so such a call can be tuned only
through the values the file passes in (`BlockSizes(...)` fields, `tiling=(...)`, `pages_per_compute_block=`), which
the tile pass finds by tracing (`knobs.discover_knobs`). This module says, per call, what is tunable and what is not.
"""

from __future__ import annotations

from dataclasses import dataclass

from .kernel_ir import KernelIR
from .knobs import Knob, discover_knobs


@dataclass(frozen=True)
class LibraryCall:
    """A traced `pallas_call` written in a library, with the knobs the user's file holds for it."""

    index: int
    site: str  # where the library writes the pallas_call: `file:line (function)`
    line: int | None  # the user's line that calls into the library
    knobs: tuple[Knob, ...]

    def describe(self, path: str) -> str:
        where = f"{path}:{self.line}" if self.line is not None else path
        if not self.knobs:
            return (
                f"{where}: pallas_call #{self.index} is a library kernel ({self.site}) and nothing in this file "
                "changes its grid or blocks: it is analyzed, not tuned (pass its block sizes from this file, e.g. "
                "BlockSizes(...) or tiling=(...), to let the tile pass tune them)"
            )
        names = ", ".join(f"{k.name}={k.value} (grid axis {','.join(map(str, k.axes))})" for k in self.knobs)
        return f"{where}: pallas_call #{self.index} is a library kernel ({self.site}); tunable here: {names}"


def library_calls(ir: KernelIR) -> tuple[LibraryCall, ...]:
    """The module's library `pallas_call`s with their knobs (knob discovery re-traces: about a second a literal)."""
    lib = [c for c in ir.calls if c.library_site is not None]
    if not lib:
        return ()
    knobs = discover_knobs(ir.source, ir.path, ir.calls, ir.digest)
    return tuple(
        LibraryCall(
            index=c.index,
            site=c.library_site or "",
            line=c.span[0] if c.span else None,
            knobs=tuple(k for k in knobs if k.call == c.index),
        )
        for c in lib
    )


def untunable_notes(ir: KernelIR) -> tuple[str, ...]:
    """What `run` must say about library calls it cannot tune: one line per such call, and a summary line when
    nothing in the file is tunable at all (no pass can rewrite a `pallas_call` that is not in the file)."""
    calls = library_calls(ir)
    stuck = [c for c in calls if not c.knobs]
    if not stuck:
        return ()
    notes = [c.describe(ir.path) for c in stuck]
    if len(stuck) == len(ir.calls):
        notes.append(
            f"nothing in {ir.path} is tunable: every pallas_call is in a library and no value written in this file "
            "changes its grid or blocks"
        )
    return tuple(notes)
