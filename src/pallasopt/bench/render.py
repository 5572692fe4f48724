"""Bench outputs: the summary lines, the Markdown table, the speedup plot and the JSON / Markdown / PNG files."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .rows import Row, effective_speedup, summarize

TIER_TAG = {"model": "M", "compiler": "C", "hardware": "H"}


def fmt_time(t: float | None, tier: str = "") -> str:
    if t is None:
        return "-"
    text = f"{t * 1e3:.3f} ms" if t >= 1e-4 else f"{t * 1e6:.1f} us"
    return f"{text} [{TIER_TAG.get(tier, tier)}]" if tier else text


def fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _pct(v: float) -> str:
    return f"{100 * v:.0f}%"


def summary_lines(s: Mapping[str, Any]) -> list[tuple[str, str]]:
    fp = ", ".join(f"fast_{p} {_pct(v)}" for p, v in s["fast_p"].items())
    return [
        ("correct (final oracle verdict)", f"{s['correct']}/{s['kernels']}"),
        ("geomean speedup over the naive kernel (unclipped)", fmt_ratio(s["geomean_speedup"])),
        ("geomean speedup, each clipped at >= 1x (MaxKernel)", fmt_ratio(s["geomean_speedup_clipped"])),
        ("fast_p (correct and faster than p x)", fp),
        (
            f"geomean vs XLA reference ({s['vs_xla_kernels']} kernels)",
            f"{fmt_ratio(s['vs_xla_geomean'])}; faster than XLA on {s['beats_xla']}/{s['vs_xla_kernels']}"
            + (
                f", slower on {s['behind_xla']} ({s['behind_xla_by_2pct']} by more than 2%)"
                if "behind_xla" in s
                else ""
            ),
        ),
        (
            f"geomean vs XLA reference of the input kernels ({s.get('baseline_vs_xla_kernels', 0)} kernels)",
            fmt_ratio(s.get("baseline_vs_xla_geomean")),
        ),
        *(
            [
                (
                    f"suite's own record: XLA / its kernel ({s['suite_speedup_kernels']} kernels)",
                    fmt_ratio(s["suite_speedup_geomean"]),
                )
            ]
            if s.get("suite_speedup_kernels")
            else []
        ),
        (
            f"geomean hand-tuned time / best time ({s['hand_tuned_kernels']} kernels)",
            fmt_ratio(s["frac_hand_tuned_geomean"]),
        ),
        ("search crashes", str(s["errors"])),
        ("tiers of the speedups", ", ".join(f"{k or '-'}: {v}" for k, v in s["tiers"].items()) or "-"),
        ("search wall / estimate wall", f"{s['search_wall_s']:.0f} s / {s['estimate_wall_s']:.0f} s"),
        ("candidates evaluated", str(s["candidates"])),
        ("suite time baseline -> best", f"{fmt_time(s['baseline_total_s'])} -> {fmt_time(s['best_total_s'])}"),
    ]


def render_markdown(rows: Sequence[Row], summary: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    chip = meta["target"]
    lines = [
        f"# pallasopt bench: {chip}, {meta['date']}",
        "",
        f"Command: `{meta['command']}` (beam {meta['beam']}, depth {meta['depth']}, jobs {meta['jobs']}, "
        f"budget {meta['budget_seconds'] or 'none'} s per kernel). Machine: {meta['machine']}. "
        f"Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}. Wall: {meta['wall_s']:.0f} s.",
        "",
        f"Tiers: [C] compiler estimate (libtpu static schedule for {chip}, no TPU; joined with the HBM bytes/bandwidth "
        f"floor: max, or the chip's fitted p-norm), [M] roofline model, [H] measured on {chip}. Ratios only between "
        "times of the same tier.",
        "",
        "| summary | |",
        "| --- | --- |",
        *(f"| {k} | {v} |" for k, v in summary_lines(summary)),
        "",
        "| kernel | correct | baseline | best | speedup | XLA reference | vs XLA | hand-tuned | HT/best | recipe "
        "| search s | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        ht = r.hand_tuned
        notes = [r.error or r.stop_reason] + ["kept the --start-from recipe"] * r.kept_start + list(r.notes)
        notes += [f"{e.fn}: {e.error}" for e in (r.xla, ht) if e is not None and e.error]
        verdict = "ERROR" if r.error else ("yes" if r.correct else "NO")
        cells = [
            f"`{r.kernel}`",
            verdict,
            fmt_time(r.baseline_s, r.tier),
            fmt_time(r.best_s, r.tier),
            fmt_ratio(r.speedup if not r.error else None),
            fmt_time(r.xla.time_s, r.xla.tier) if r.xla else "-",
            fmt_ratio(r.vs_xla),
            fmt_time(ht.time_s, ht.tier) if ht else "n/a",
            fmt_ratio(r.frac_hand_tuned),
            f"`{','.join(r.recipe)}`" if r.recipe else "-",
            f"{r.wall_s:.0f}",
            "; ".join(n for n in notes if n)[:200],
        ]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    recorded = [r for r in rows if r.suite]
    if recorded:
        lines += [
            "",
            f"The suite's own record beside ours ({recorded[0].suite.get('tier', '') if recorded[0].suite else ''}):",
            "",
        ]
        lines += [
            "| kernel | suite: XLA original | suite: its kernel | suite: XLA / kernel | ours: XLA / input | ours: XLA / best | import |"
        ]
        lines += ["| --- | --- | --- | --- | --- | --- | --- |"]
        for r in recorded:
            rec = r.suite or {}
            o, g = rec.get("original_ms"), rec.get("generated_ms")
            cells = [
                f"`{r.kernel}`",
                f"{o} ms" if o is not None else "-",
                f"{g} ms" if g is not None else "-",
                fmt_ratio(r.suite_speedup),
                fmt_ratio(r.baseline_vs_xla),
                fmt_ratio(r.vs_xla),
                "; ".join(rec.get("fixed", [])) or "-",
            ]
            lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    lines += ["", "How each XLA / hand-tuned estimate was made:", ""]
    for r in rows:
        for e in (r.xla, r.hand_tuned):
            if e is not None and e.method:
                lines.append(f"- `{r.kernel}` {e.fn}: {e.method}")
    return "\n".join(lines) + "\n"


def plot_speedups(path: Path, rows: Sequence[Row], meta: Mapping[str, Any]) -> None:
    """Horizontal bars per kernel, log scale: speedup over the naive kernel and best vs the XLA reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ys = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.3 * len(rows)))
    series: list[tuple[list[float | None], float, str]] = [
        ([effective_speedup(r) for r in rows], 0.2, "speedup over the naive kernel (red: not verified / crashed)"),
        ([r.vs_xla for r in rows], -0.2, "XLA reference time / best time"),
    ]
    for (values, dy, label), color in zip(series, ("tab:blue", "tab:orange"), strict=True):
        colors = [color if r.ok or dy < 0 else "tab:red" for r in rows]
        width = [(v or 1.0) - 1.0 for v in values]  # bars grow from 1x: right is faster, left slower
        ax.barh([y + dy for y in ys], width, left=1.0, height=0.4, color=colors, label=label)
        for y, v in zip(ys, values, strict=True):
            if v is not None:
                ax.annotate(
                    f"{v:.2f}",
                    (v, y + dy),
                    xytext=(2 if v >= 1 else -2, 0),
                    textcoords="offset points",
                    ha="left" if v >= 1 else "right",
                    va="center",
                    fontsize=6,
                )
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_yticks(ys, [r.kernel for r in rows], fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.margins(x=0.15)
    tiers = "/".join(sorted({r.tier for r in rows if r.tier})) or "-"
    ax.set_title(f"pallasopt bench, {meta['target']}, {meta['date']}: {tiers} tier times", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.04 - 0.5 / max(len(rows), 1)), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_results(
    out: Path, stem: str, rows: Sequence[Row], meta: Mapping[str, Any], *, plot: bool = True
) -> dict[str, Path]:
    from ..optimize import write_atomic

    summary = summarize(rows)
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md"}
    doc = {"meta": dict(meta), "summary": summary, "rows": [r.to_dict() for r in rows]}
    write_atomic(paths["json"], json.dumps(doc, indent=1, default=str))
    write_atomic(paths["md"], render_markdown(rows, summary, meta))
    if plot and rows:
        paths["png"] = out / f"{stem}.png"
        plot_speedups(paths["png"], rows, meta)
    for p in paths.values():
        p.chmod(0o644)  # results are for everyone to read (write_atomic's temp file is private)
    return paths
