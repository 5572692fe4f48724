"""Plain-text renderings of facts for the terminal (rich tables)."""

from __future__ import annotations

from rich.table import Table

from ..ir.facts import CallFacts


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def _axes(dep: tuple[tuple[int, ...], ...]) -> str:
    return "(" + ", ".join("g" + ",g".join(map(str, d)) if d else "-" for d in dep) + ")"


def _dynamic(call: CallFacts) -> str:
    if not call.dynamic_axes:
        return ""
    return f"; axes {list(call.dynamic_axes)} sized at run time, shown as array / block"


def facts_table(call: CallFacts) -> Table:
    """One pallas_call: an operand per row with block shape, bytes, and which grid axes each block dim follows."""
    sem = ",".join(call.dimension_semantics) if call.dimension_semantics else "default (all arbitrary)"
    title = (
        f"pallas_call #{call.index} {call.name}  lines {call.span[0]}-{call.span[1] if call.span else '?'}"
        if call.span
        else f"pallas_call #{call.index} {call.name}"
    )
    if call.library_site:
        title += f"  (library kernel {call.library_site})"
    caption = (
        f"grid={call.grid} ({call.steps} steps{_dynamic(call)})  semantics={sem}  "
        f"vmem_limit={fmt_bytes(call.vmem_limit_bytes) if call.vmem_limit_bytes else 'default'}  "
        f"reduction axes={list(call.revisited_axes()) or '-'}"
    )
    t = Table(title=title, caption=caption, title_justify="left", caption_justify="left")
    for col in ("operand", "array", "dtype", "block", "block bytes", "index map follows", "space", "buffers"):
        t.add_column(col)
    for o in call.operands:
        im = o.index_map
        follows = "data-dependent" if im.data_dependent else _axes(im.depends_on)
        t.add_row(
            o.name,
            "x".join(map(str, o.shape)),
            o.dtype,
            "x".join("_" if b is None else str(b) for b in o.block_shape),
            fmt_bytes(o.block_bytes),
            follows,
            o.memory_space,
            str(o.buffer_count or 2),
        )
    for i, s in enumerate(call.scratch):
        t.add_row(
            f"scratch{i}",
            "x".join(map(str, s.shape)) or "()",
            s.dtype,
            "",
            fmt_bytes(s.bytes),
            "",
            s.memory_space,
            "1",
        )
    return t


def body_line(call: CallFacts) -> str:
    b = call.body
    parts = [
        f"per step: {fmt_count(b.mxu_flops)} MXU flops",
        f"{fmt_count(b.vpu_elems)} VPU elem-ops",
        f"{fmt_count(b.transcendental_elems)} transcendentals",
    ]
    if b.dots:
        parts.append("dots " + ", ".join(f"{d.m}x{d.k}@{d.k}x{d.n}" for d in b.dots[:4]))
    if b.has_dma:
        parts.append("manual DMA")
    if b.conditional_axes:
        parts.append(f"step-dependent control or state on axes {list(b.conditional_axes)}")
    return "  ".join(parts)
