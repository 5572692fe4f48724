"""Terminal rendering of the cost model's and the compiler's view (`pallasopt analyze --target/--compile`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from ..cost_model.hardware import get_chip
from ..cost_model.roofline import Estimate, explain
from .tables import fmt_bytes


def print_estimates(console: Console, estimates: Sequence[Estimate], compiled: Any) -> None:
    for est in estimates:
        chip = get_chip(est.chip)
        t = Table(title=f"roofline model on {chip.name} (tier: model)", title_justify="left")
        for col in ("call", "time", "bound", "HBM bytes", "DMA", "MXU", "VPU+EUP", "step overhead", "VMEM", "legal"):
            t.add_column(col)
        for c in est.calls:
            t.add_row(
                str(c.call),
                f"{c.time_s * 1e3:.3f} ms",
                c.bound,
                fmt_bytes(c.bytes),
                f"{c.dma_s * 1e3:.3f} ms",
                f"{c.mxu_s * 1e3:.3f} ms",
                f"{(c.vpu_s + c.eup_s) * 1e3:.3f} ms",
                f"{c.overhead_s * 1e3:.3f} ms",
                f"{fmt_bytes(c.vmem_bytes)} / {fmt_bytes(c.vmem_limit_bytes)}",
                "yes" if c.ok else "NO",
            )
        console.print(t)
        for c in est.calls:
            console.print(f"  call {c.call}: {explain(c, chip)}")
    if compiled:
        for name, rep in compiled.items():
            if rep.get("ok") and "method" in rep:  # the reference, estimated as the bench does
                console.print(
                    f"compiler ({rep.get('target')}, tier: compiler estimate) for {name}: {_ms(rep.get('time_s'))}"
                    f" ({rep.get('method')})"
                )
            elif rep.get("ok"):
                console.print(
                    f"compiler ({rep.get('target')}, tier: compiler estimate) for {name}: "
                    f"static estimate {_ms(rep.get('estimated_s'))} at dims {rep.get('dims')}"
                    f" x{rep.get('steps_scale', 1):.1f} steps{_per_call(rep.get('call_scales'))};"
                    f" with the HBM floor {_ms(rep.get('time_s'))}"
                )
            else:
                console.print(f"compiler ({rep.get('target')}) for {name}: [red]rejected[/]: {rep.get('error')}")


def _per_call(scales: Any) -> str:
    return f" (per call: {', '.join(f'x{k:.1f}' for k in scales)})" if scales else ""


def _ms(t: Any) -> str:
    return "-" if t is None else f"{float(t) * 1e3:.3f} ms"
