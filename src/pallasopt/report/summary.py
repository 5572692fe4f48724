"""The run summary for the terminal (`pallasopt run`): times with their tier, which tier ranked the run and why a
higher one was not used, a baseline that does not fit the target, and how the budget was spent.

Takes a `Result` (duck-typed: this module sits below `optimize`). Strings are rich markup; every value that comes
from outside (compiler messages, paths) is escaped.
"""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table


def fmt_time(t: float | None) -> str:
    if t is None:
        return "-"
    return f"{t * 1e3:.3f} ms" if t >= 1e-4 else f"{t * 1e6:.1f} us"


def _verb(result: Any) -> str:
    return "does not fit" if result.baseline.tier == "model" else "does not compile"


def run_table(result: Any, title: str) -> Table:
    """Baseline, best and the model's view, each with the source of the number."""
    t = Table(title=escape(title), title_justify="left")
    for col in ("", "time", "source of the number"):
        t.add_column(col)
    b = result.baseline
    if b.ok:
        t.add_row("baseline", fmt_time(b.time_s), escape(b.label))
    else:
        t.add_row("baseline", f"{_verb(result)} on {result.target}", escape(b.reason or "-"))
    s = result.best
    t.add_row("best", fmt_time(s.time_s) if s.ok else "-", escape(s.label if s.ok else s.reason or "-"))
    model = f"{fmt_time(result.model_baseline_s)} -> {fmt_time(result.model_best_s)}"
    t.add_row("model (roofline)", model, "model")
    return t


def _plain(text: str) -> str:
    return text


RICH = ("[bold]", "[/]", escape)
MARKDOWN = ("**", "**", _plain)


def headline(result: Any, style: tuple[str, str, Any] = RICH) -> str:
    """The speedup, or what stands in for it when a time is missing (never a made-up 1.0x)."""
    on, off, esc = style
    b, s = result.baseline, result.best
    if result.speedup is not None:
        return f"speedup {on}{result.speedup:.2f}x{off} ({esc(s.label)})"
    if not b.ok:
        head = f"the baseline {_verb(result)} on {result.target} ({esc(b.reason or 'no reason recorded')}); "
        if s.ok and result.recipe:
            return head + f"the optimized kernel does: {on}{fmt_time(s.time_s)}{off} ({esc(s.label)})"
        if result.recipe and result.correct:
            return head + f"the optimized kernel does, with no time at this tier ({esc(s.reason or '-')})"
        return head + "no candidate does either"
    return f"no speedup figure: the best kernel has no time at this tier ({esc(s.reason or '-')})"


def tier_lines(result: Any, style: tuple[str, str, Any] = RICH) -> list[str]:
    """Which tier ranked the run, on what, and why each higher tier was not used."""
    esc = style[2]
    r = result.ranking
    if r is None:
        return []
    lines = [f"ranked by: {esc(r.describe())}"]
    lines += [f"  {tier} tier not used: {esc(why)}" for tier, why in r.not_used]
    trust = r.trust_line() if hasattr(r, "trust_line") else None
    if trust:
        lines.append(f"  {esc(trust)}")
    return lines


def summary_lines(result: Any, style: tuple[str, str, Any] = RICH) -> list[str]:
    """Everything `pallasopt run` prints after the table, before the recipe and correctness lines."""
    lines = [headline(result, style), *tier_lines(result, style)]
    if result.budget is not None:
        lines.append(style[2](result.budget.line()))
    return lines
