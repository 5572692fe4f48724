"""The rich progress display of `pallasopt run` (fed by the search's progress events)."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.status import Status


class RunDisplay:
    """A one-line live status plus a log line per beam depth; silent when disabled (--json)."""

    def __init__(self, console: Console, *, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
        self.status: Status | None = None
        self.checked = 0
        self.declined = 0
        self.failed = 0

    def __enter__(self) -> RunDisplay:
        if self.enabled:
            self.status = self.console.status("tracing and checking the baseline...")
            self.status.__enter__()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if self.status is not None:
            self.status.__exit__(et, ev, tb)

    def _update(self, text: str) -> None:
        if self.status is not None:
            self.status.update(text)

    def event(self, kind: str, info: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if kind == "baseline":
            node = info["node"]
            r = node.results.get(info["tier"]) or node.results["model"]
            if r.ok and r.time_s is not None:
                self.console.print(f"baseline: {_ms(r.time_s)} ({info['tier']}), correct")
            else:
                why = escape(r.message or "no time")
                self.console.print(f"baseline: correct, but no {info['tier']} time ({r.tier}: {why})")
            ranking = info.get("ranking")
            for tier, reason in ranking.not_used if ranking is not None else ():
                self.console.print(f"[yellow]{tier} tier not used[/]: {escape(reason)}")
        elif kind == "expanded":
            self._update(f"depth {info['depth']}: ranking {info['children']} candidates (model -> compiler -> check)")
        elif kind == "composed":
            self._update(f"composing the best steps of different calls: {', '.join(info['recipes'])}")
        elif kind == "checked":
            self.checked += 1
            self._update(f"checked {self.checked} candidates in interpret mode")
        elif kind == "declined":
            self.declined += 1
        elif kind == "failed":
            self.failed += 1
        elif kind == "depth":
            best = info["best"]
            self.console.print(f"depth {info['depth']}: best {_ms(info['time_s'])} ({info['tier']})  {best.spec}")
        elif kind == "start":
            recipe = escape(",".join(info["recipe"]) or "(empty)")
            if "dropped" in info:
                self.console.print(f"[yellow]start recipe dropped[/] ({escape(info['dropped'])}): {recipe}")
            else:
                self.console.print(f"start: {_ms(info['time_s'])}, verified  {recipe}")
        elif kind == "error":
            self.console.print(f"[yellow]warning[/]: {info['message']}")


def _ms(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e3:.3f} ms"
