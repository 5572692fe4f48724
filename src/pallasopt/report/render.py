"""The run report: Markdown and HTML with the recipe, a diff per pass, the roofline before/after plot, the search
tree (networkx, drawn and exported as GraphML) and every candidate's verdict."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from ..cost_model.hardware import Chip
from ..cost_model.roofline import estimate_calls
from ..ir.kernel_ir import KernelIR
from ..passes.pipeline import unified_diff
from .summary import MARKDOWN, summary_lines


def _components_plot(path: Path, base: KernelIR, best: KernelIR, chip: Chip) -> None:
    """The model's time components of baseline and best, side by side (they overlap: the estimate is their max)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    parts = ("dma_s", "mxu_s", "vpu_s", "eup_s", "overhead_s")
    labels = ("HBM DMA", "MXU", "VPU", "EUP", "step overhead")
    width = 0.16
    for i, ir in enumerate((base, best)):
        est = estimate_calls(ir.calls, chip)
        for j, (part, label) in enumerate(zip(parts, labels, strict=True)):
            v = sum(getattr(c, part) for c in est.calls) * 1e3
            ax.barh(i + (j - 2) * width, v, height=width, label=label if i == 0 else None, color=f"C{j}")
        ax.text(0, i + 0.45, f"est. {est.time_s * 1e3:.3f} ms", va="center", fontsize=8)
    ax.set_yticks([0, 1], ["baseline", "best"])
    ax.set_xlabel(f"ms on {chip.name} (model; components overlap, the estimate is about their max)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def roofline_points(nodes: list[dict[str, Any]]) -> list[tuple[float, float, dict[str, Any]]]:
    """(arithmetic intensity FLOP/byte, attained FLOP/s, node) for every node with a model verdict and a time: FLOPs
    and HBM bytes from the model's per-call figures, time at the run's ranking tier (the model's when it has none)."""
    out = []
    for n in nodes:
        calls = ((n.get("tiers") or {}).get("model") or {}).get("data", {}).get("calls") or []
        flops = sum(float(c.get("flops") or 0) for c in calls)
        nbytes = sum(float(c.get("bytes") or 0) for c in calls)
        t = n.get("time_s") or n.get("model_s")
        if flops > 0 and nbytes > 0 and t:
            out.append((flops / nbytes, flops / float(t), n))
    return out


def _roofline_plot(path: Path, nodes: list[dict[str, Any]], base_digest: str, best_digest: str, chip: Chip) -> None:
    """The roofline people mean: arithmetic intensity vs attainable FLOP/s, log-log, the chip's compute roof (bf16
    and f32) and HBM-bandwidth roof, every candidate faint, the baseline and the best as marked points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = roofline_points(nodes)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bw = chip.device_hbm_bw_bytes_s
    xs = [p[0] for p in pts] or [1.0]
    lo, hi = min(min(xs) / 4, 0.1), max(max(xs) * 4, 4 * chip.device_peak_bf16_flops / bw)
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for dtype, style in (("bfloat16", "-"), ("float32", ":")):
        peak = chip.device_peak_flops(dtype)
        ax.plot(grid, [min(peak, x * bw) for x in grid], "k" + style, lw=1.2, label=f"roof, {dtype} peak")
    delivered = chip.delivered_hbm_bw_bytes_s
    if delivered < bw:  # the bandwidth the tiers charge (Chip.hbm_efficiency, measured) under the datasheet's
        peak = chip.device_peak_bf16_flops
        label = f"HBM delivered, {delivered / 1e9:.0f} GB/s ({chip.hbm_efficiency:.2f} of the datasheet)"
        ax.plot(grid, [min(peak, x * delivered) for x in grid], color="gray", ls="--", lw=1.0, label=label)
    others = [p for p in pts if p[2].get("digest") not in (base_digest, best_digest)]
    if others:
        ax.scatter([p[0] for p in others], [p[1] for p in others], s=10, c="tab:blue", alpha=0.25, label="candidates")
    for digest, label, color in ((base_digest, "baseline", "tab:red"), (best_digest, "best", "gold")):
        for x, y, n in pts:
            if n.get("digest") == digest:
                ax.scatter([x], [y], s=70, c=color, edgecolors="k", zorder=3, label=label)
                break
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte, model)")
    ax.set_ylabel("attained FLOP/s (FLOPs / time at the ranking tier)")
    ax.set_title(
        f"roofline on {chip.name}: HBM {bw / 1e9:.0f} GB/s, bf16 peak {chip.device_peak_bf16_flops / 1e12:.0f} TFLOP/s"
    )
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _tree(path_png: Path, path_graphml: Path, nodes: list[dict[str, Any]], best: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    g = nx.DiGraph()
    for n in nodes:
        g.add_node(
            n["digest"],
            label=(n["recipe"][-1] if n["recipe"] else "baseline"),
            verdict=n["verdict"],
            time_s=n["time_s"] if n["time_s"] is not None else -1.0,
            depth=n["depth"],
        )
    for n in nodes:  # a DAG: a crossover has two parents
        for p in n.get("parents") or ([n["parent"]] if n.get("parent") else []):
            if p in g:
                g.add_edge(p, n["digest"])
    nx.write_graphml(g, path_graphml)
    for layer in range(max((d for _, d in g.nodes(data="depth")), default=0) + 1):
        members = sorted(n for n, d in g.nodes(data="depth") if d == layer)
        for i, n in enumerate(members):
            g.nodes[n]["pos"] = (i - len(members) / 2, -layer)
    pos = nx.get_node_attributes(g, "pos")
    colors = [
        "gold"
        if n == best
        else ("tab:green" if d["verdict"] == "ok" else "tab:gray" if "not checked" in d["verdict"] else "tab:red")
        for n, d in g.nodes(data=True)
    ]
    fig, ax = plt.subplots(figsize=(10, 5))
    nx.draw(g, pos, ax=ax, node_color=colors, node_size=60, arrows=False, width=0.4)
    ax.set_title("search lineage (gold: best, green: verified, red: rejected, gray: pruned before the check)")
    fig.savefig(path_png, dpi=100)
    plt.close(fig)


def write_report(folder: Path, base: KernelIR, outcome: Any, result: Any, chip: Chip) -> Path:
    """Write report.md, report.html, roofline.png, components.png, search_tree.png/.graphml and candidates.json into
    `folder`. `outcome` None (a result served from the kernel DB): the recipe is replayed on `base` for the diffs."""
    folder.mkdir(parents=True, exist_ok=True)
    chain = _chain(outcome, result.recipe) if outcome is not None else _replayed(base, result.recipe)
    diffs: list[tuple[str, str]] = []
    best_ir = base
    for node in chain:
        if node.ir is None:
            continue
        diffs.append((node.recipe[-1], unified_diff(best_ir.source, node.ir.source, Path(base.path).name)))
        best_ir = node.ir
    _components_plot(folder / "components.png", base, best_ir, chip)
    nodes = list(result.nodes)
    best_digest = best_ir.digest
    _roofline_plot(folder / "roofline.png", nodes, base.digest, best_digest, chip)
    _tree(folder / "search_tree.png", folder / "search_tree.graphml", nodes, best_digest)
    (folder / "candidates.json").write_text(json.dumps(nodes, indent=1, default=str))
    fc = result.final_check.get("data", {})
    baseline = _ms(result.baseline.time_s) if result.baseline.ok else f"none ({result.baseline.reason})"
    lines = [
        f"# pallasopt report: `{Path(base.path).name}` on {chip.name}",
        "",
        *(f"- {line.strip()}" for line in summary_lines(result, MARKDOWN)),
        f"- Baseline: {baseline}; best: {_ms(result.best.time_s)} ({result.best.label}).",
        f"- Roofline model: {_ms(result.model_baseline_s)} -> {_ms(result.model_best_s)}.",
        f"- Recipe: `{','.join(result.recipe) or '(baseline kept)'}`",
        f"- Correctness: {'verified' if result.correct else 'NOT verified'} in {fc.get('mode')} mode on fresh seeds "
        f"{fc.get('seeds')} at dims {fc.get('dims')}: max abs err {fc.get('max_abs_err')}, max rel err "
        f"{fc.get('max_rel_err')} (outputs poisoned with NaN before the run; tolerance by dtype).",
        f"- Search: {result.candidates_evaluated} evaluations, stopped on {result.stop_reason}, {result.wall_s:.1f} s.",
        "",
        "CPU interpret-mode time is never used as kernel time; no number here was measured on a TPU unless its "
        "tier says `measured`.",
        "",
        "## What changed, pass by pass",
    ]
    for spec, diff in diffs:
        lines += ["", f"### `{spec}`", "", "```diff", diff.rstrip(), "```"]
    lines += [
        "",
        "## Roofline",
        "",
        "![roofline](roofline.png)",
        "",
        "Model time components, before / after:",
        "",
        "![components](components.png)",
        "",
        "## Search tree",
        "",
        "![search tree](search_tree.png) (GraphML: `search_tree.graphml`)",
        "",
        "## Every candidate",
        "",
        "| recipe | time | model | verdict |",
        "| --- | --- | --- | --- |",
    ]
    for n in sorted(nodes, key=lambda n: (n["time_s"] is None, n["time_s"] or 0)):
        lines.append(
            f"| `{','.join(n['recipe']) or 'baseline'}` | {_ms(n['time_s'])} | {_ms(n['model_s'])} | "
            f"{str(n['verdict']).replace('|', '/')[:160]} |"
        )
    md = "\n".join(lines) + "\n"
    (folder / "report.md").write_text(md)
    (folder / "report.html").write_text(_html(md))
    return folder / "report.md"


def _chain(outcome: Any, recipe: tuple[str, ...]) -> list[Any]:
    """The search nodes from the baseline's first child to the node with `recipe` (no pass is re-applied)."""
    by_recipe = {n.recipe: n for n in outcome.nodes.values()}
    return [by_recipe[recipe[: i + 1]] for i in range(len(recipe)) if recipe[: i + 1] in by_recipe]


def _replayed(base: KernelIR, recipe: tuple[str, ...]) -> list[Any]:
    """Nodes-like steps for `recipe` applied to `base` again (for a result from the DB, which keeps no IRs); stops at
    a step that cannot be replayed here (an LLM rewrite)."""
    from types import SimpleNamespace

    from ..passes.registry import parse_pipeline

    out: list[Any] = []
    ir = base
    for i, spec in enumerate(recipe):
        try:
            (p,) = parse_pipeline(spec)
            ir = p.rewrite(ir)
        except Exception:
            break
        out.append(SimpleNamespace(recipe=recipe[: i + 1], ir=ir))
    return out


def _ms(t: Any) -> str:
    return "-" if t is None else f"{float(t) * 1e3:.3f} ms"


def _inline(text: str) -> str:
    """Escape, then render **bold** and `code` spans."""
    import re

    out = html.escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", out)


def _html(md: str) -> str:
    """A minimal Markdown-to-HTML rendering (headings, lists, code blocks, tables, images) without a dependency."""
    out = [
        "<!doctype html><meta charset='utf-8'><title>pallasopt report</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto}pre{background:#f4f4f4;padding:.5em;"
        "overflow:auto}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px}</style>",
    ]
    in_code = False
    in_table = False
    for line in md.splitlines():
        if line.startswith("```"):
            out.append("</pre>" if in_code else "<pre>")
            in_code = not in_code
            continue
        if in_code:
            out.append(html.escape(line))
            continue
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if set("".join(cells)) <= set("- "):
                continue
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{_inline(line.lstrip('#').strip())}</h{level}>")
        elif line.startswith("- "):
            out.append(f"<li>{_inline(line[2:])}</li>")
        elif line.startswith("!["):
            src = line[line.index("(") + 1 : line.index(")")]
            out.append(f"<img src='{html.escape(src)}' style='max-width:100%'>")
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    if in_table:
        out.append("</table>")
    return "\n".join(out)
