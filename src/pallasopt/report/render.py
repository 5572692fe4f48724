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


def _roofline_plot(path: Path, base: KernelIR, best: KernelIR, chip: Chip) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    parts = ("dma_s", "mxu_s", "vpu_s", "eup_s", "overhead_s")
    labels = ("HBM DMA", "MXU", "VPU", "EUP", "step overhead")
    for i, ir in enumerate((base, best)):
        est = estimate_calls(ir.calls, chip)
        left = 0.0
        for part, label in zip(parts, labels, strict=True):
            v = sum(getattr(c, part) for c in est.calls) * 1e3
            ax.barh(i, v, left=left, label=label if i == 0 else None, color=f"C{parts.index(part)}")
            left += v
        ax.text(left, i, f"  est. {est.time_s * 1e3:.3f} ms", va="center")
    ax.set_yticks([0, 1], ["baseline", "best"])
    ax.set_xlabel(f"ms on {chip.name} (model; components overlap, the estimate is their roofline max)")
    ax.legend(loc="upper right", fontsize=8)
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
    for n in nodes:
        if n["parent"] and n["parent"] in g:
            g.add_edge(n["parent"], n["digest"])
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
    ax.set_title("search tree (gold: best, green: verified, red: rejected, gray: pruned before the check)")
    fig.savefig(path_png, dpi=100)
    plt.close(fig)


def write_report(folder: Path, base: KernelIR, outcome: Any, result: Any, chip: Chip) -> Path:
    """Write report.md, report.html, roofline.png, search_tree.png/.graphml and candidates.json into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    chain = _chain(outcome, result.recipe)
    diffs: list[tuple[str, str]] = []
    best_ir = base
    for node in chain:
        if node.ir is None:
            continue
        diffs.append((node.recipe[-1], unified_diff(best_ir.source, node.ir.source, Path(base.path).name)))
        best_ir = node.ir
    _roofline_plot(folder / "roofline.png", base, best_ir, chip)
    nodes = list(result.nodes)
    best_digest = best_ir.digest
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
        "## Roofline before / after",
        "",
        "![roofline](roofline.png)",
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
