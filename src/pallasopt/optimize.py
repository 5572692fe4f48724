"""The library entry point: `optimize(path_or_source, SearchConfig(...)) -> Result` (or its fields as keywords)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from .config import SearchConfig, read_env
from .cost_model.hardware import Chip, UnknownTarget, get_chip
from .db.store import KernelDB, default_path
from .errors import EnvironmentProblem, KernelError, UsageError
from .executors import Executor, make_executor
from .ir.kernel_ir import KernelIR
from .ir.library import untunable_notes
from .outputs import write_atomic  # bench imports it from here too
from .passes.base import Pass, spec_name
from .passes.registry import PASSES, by_name
from .search.cached import CachedEvaluator
from .search.node import BaselineIncorrect, Node, SearchOutcome, score_of
from .search.ranking import TierChoice, baseline_verdict
from .search.spend import Budget
from .search.strategies import run_strategy
from .search.tiers import TIER_LABEL, Evaluator, TierResult, Tiers

FINAL_SEEDS = (7919, 104729)  # fresh seeds for the final re-verification at --seed 0 (never used during the search)


def final_seeds(seed: int) -> tuple[int, int]:
    """The final re-check's seeds for `run --seed` (shifted by one per seed: never one of the search's seeds)."""
    return (FINAL_SEEDS[0] + seed, FINAL_SEEDS[1] + seed)


@dataclass(frozen=True)
class Measurement:
    """A kernel's time at the tier that ranked the run. `ok=False`: it has none there, and `reason` says why
    (e.g. the baseline does not compile on the target: VMEM over the scoped limit)."""

    time_s: float | None
    tier: str  # "model" | "compiler" | "hardware"
    ok: bool = True
    reason: str | None = None
    device: str | None = None  # the chip a "hardware" time was measured on

    @property
    def label(self) -> str:
        base = TIER_LABEL.get(self.tier, self.tier)
        return f"{base} on {self.device}" if self.tier == "hardware" and self.device else base

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_s": self.time_s,
            "tier": self.tier,
            "tier_label": self.label,
            "ok": self.ok,
            "reason": self.reason,
            "device": self.device,
        }

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Measurement:
        return Measurement(d.get("time_s"), str(d["tier"]), bool(d.get("ok", True)), d.get("reason"), d.get("device"))


@dataclass(frozen=True)
class Result:
    """What an optimization run produced, JSON-ready through `to_dict()`."""

    kernel: str
    target: str
    baseline: Measurement
    best: Measurement
    speedup: float | None  # None when either time is missing (e.g. the baseline does not compile): never a fake 1.0
    correct: bool
    recipe: tuple[str, ...]
    source: str
    output_path: str | None
    candidates_evaluated: int
    wall_s: float
    stop_reason: str
    final_check: Mapping[str, Any]
    from_cache: bool = False
    model_baseline_s: float | None = None
    model_best_s: float | None = None
    report_path: str | None = None
    llm_usage: Mapping[str, Any] | None = None
    ranking: TierChoice | None = None
    budget: Budget | None = None
    nodes: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)
    notes: tuple[str, ...] = ()  # what the run could not tune (library kernels no value in the file drives)
    strategy: str = "beam"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "target": self.target,
            "baseline": self.baseline.to_dict(),
            "best": self.best.to_dict(),
            "speedup": self.speedup,
            "correct": self.correct,
            "recipe": list(self.recipe),
            "output_path": self.output_path,
            "candidates_evaluated": self.candidates_evaluated,
            "wall_s": self.wall_s,
            "stop_reason": self.stop_reason,
            "final_check": dict(self.final_check),
            "from_cache": self.from_cache,
            "model_baseline_s": self.model_baseline_s,
            "model_best_s": self.model_best_s,
            "report_path": self.report_path,
            "llm_usage": dict(self.llm_usage) if self.llm_usage else None,
            "ranking": self.ranking.to_dict() if self.ranking else None,
            "budget": self.budget.to_dict() if self.budget else None,
            "notes": list(self.notes),
            "strategy": self.strategy,
        }


def _kernels_alone_notes(baseline: TierResult | None) -> tuple[str, ...]:
    """A line saying the compiler tier's times cover the pallas_calls' schedule and the wrapper's XLA work at its
    floor, where libtpu could not profile the whole entry (`search.tiers.kernels_alone_reason`)."""
    data = baseline.data if baseline is not None else {}
    if not data.get("kernels_alone"):
        return ()
    ops = ", ".join(data.get("xla_rest_ops") or ()) or "none"  # the distinct names (`XlaRest.kinds`)
    rest_ms = float(data.get("xla_rest_s") or 0) * 1e3
    return (
        f"compiler tier: the pallas_calls' static schedule alone ({data['kernels_alone']}); the wrapper's other XLA "
        f"ops ({ops}) are priced per op (FLOPs at the matmul peak or bytes at the HBM bandwidth), {rest_ms:.3f} ms, "
        "in every time of this tier",
    )


def select_passes(names: Sequence[str], hardware: bool = False) -> tuple[type[Pass], ...]:
    """The passes a search runs: `names`, or by default every pass the search can rank; passes whose gain only a
    measurement shows (`search_needs_hardware`) join the default set only when `hardware` (the target chip is
    here to time candidates on)."""
    if not names:
        return tuple(
            p
            for p in PASSES
            if getattr(p, "in_search", True) and (hardware or not getattr(p, "search_needs_hardware", False))
        )
    registry = by_name()
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise UsageError(f"unknown pass {unknown[0]!r}", hint=f"known passes: {', '.join(sorted(registry))}")
    return tuple(registry[n] for n in names)


def hardware_only_starts(
    recipes: Sequence[Sequence[str]], selected: Sequence[type[Pass]]
) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]:
    """`recipes` (`start_from`) split into those the search may start from and a note for each one it may not: a
    recipe with a step of a pass whose gain only the chip shows (`search_needs_hardware`) that this search does not
    offer (no chip here, the pass not named). Its tiers would rank that step blind, as they ranked `stage-masked` on
    fused_33 (a [C] gain, a chip loss), so such a warm start would carry a misranked choice on into the result."""
    offered = {p.name for p in selected}
    blind = {p.name for p in PASSES if getattr(p, "search_needs_hardware", False)} - offered
    kept: list[tuple[str, ...]] = []
    notes: list[str] = []
    for r in recipes:
        names = [spec_name(spec) for spec in r]
        off = sorted(blind.intersection(names))
        if off:
            notes.append(
                f"start recipe {','.join(r)} not used: {', '.join(off)} only pays where the chip times it "
                "(no chip here; name the pass in --passes to allow it)"
            )
        else:
            kept.append(tuple(r))
    return tuple(kept), tuple(notes)


def resolve_target(name: str) -> Chip:
    try:
        return get_chip(name)
    except UnknownTarget as e:
        raise UsageError(str(e)) from None


@functools.cache
def code_digest() -> str:
    """Digest of pallasopt's own source: evaluations cached by other code (another oracle, cost model or pass
    version) are never reused, even between releases with the same version number."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def _versions() -> dict[str, str]:
    import jax
    import jaxlib

    out = {
        "pallasopt": __version__,
        "pallasopt_code": code_digest(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
    }
    try:
        import importlib.metadata as md

        out["libtpu"] = md.version("libtpu")
    except Exception:
        out["libtpu"] = "absent"
    return out


def _config_key(config: SearchConfig, passes: Sequence[type[Pass]], evaluator: Any = None) -> dict[str, Any]:
    d = dataclasses.asdict(config)
    d.pop("jobs", None)  # parallelism never changes the answer
    d.pop("budget_seconds", None)
    d.pop("llm_max_requests", None)
    d["passes"] = [p.name for p in passes]
    device = getattr(evaluator, "device_kind", None)  # the accelerator the hardware tier would time on, if any
    d["device"] = device() if callable(device) else None
    return d


def default_output(kernel: Path) -> Path:
    return kernel.with_name(kernel.stem + ".opt.py")


def node_summary(n: Node, tier: str) -> dict[str, Any]:
    s = score_of(n, tier)
    return {
        "recipe": list(n.recipe),
        "digest": n.digest,
        "parent": n.parent,
        "parents": list(n.parents),
        "depth": n.depth,
        "verdict": n.verdict(),
        "time_s": s.time_s if s else None,
        "model_s": n.results["model"].time_s if "model" in n.results else None,
        "tiers": {k: v.to_dict() for k, v in n.results.items()},
    }


def optimize(
    path_or_source: str | os.PathLike[str],
    config: SearchConfig | None = None,
    *,
    path: str | None = None,
    output: str | os.PathLike[str] | None = None,
    in_place: bool = False,
    db_path: str | os.PathLike[str] | None = None,
    resume: bool = False,
    fresh: bool = False,
    report_dir: str | os.PathLike[str] | None = None,
    progress: Callable[[str, dict[str, Any]], None] | None = None,
    evaluator: Evaluator | None = None,
    write_output: bool = True,
    llm_client: Any = None,
    executor: str | Executor = "local",
    ray_address: str | None = None,
    **search: Any,
) -> Result:
    """Optimize a kernel module (a file path, or source text with `path=` for messages).

    What to search is one `SearchConfig` (`config`); for short calls its fields can be given as keywords instead,
    e.g. `optimize("k.py", beam=4, target="v6e")`, which override `config`'s. The rest says where things go: writes
    the optimized module to `output` (default `<stem>.opt.py` beside the kernel; never the input unless `in_place`).
    Every evaluation goes to the kernel database (`db_path`, default `.pallasopt/kernels.db` beside the kernel), so a
    repeated run is served from it and `resume=True` continues an interrupted one. `report_dir`: write the report
    there (also when the result comes from the database).

    `executor`: where compiles, checks and timings run: "local" (child processes of this host), "ray" (tasks of
    the Ray cluster at `ray_address`, else RAY_ADDRESS, else a local Ray instance for this run), or an `Executor`
    the caller owns (bench shares one between searches); `jobs` of them are in flight at once. The database stays
    here: workers only return records.
    """
    start = time.perf_counter()
    config = _search_config(config, search)
    text = str(path_or_source)
    if "\n" not in text and Path(text).exists():
        kernel_path = Path(text)
        base = KernelIR.from_file(kernel_path)
    elif "\n" in text:
        kernel_path = Path(path or "kernel.py")
        base = KernelIR.from_source(text, str(kernel_path))
    else:
        raise KernelError("no such file", path=text, hint="pass a kernel module path or its source text")
    chip = resolve_target(config.target)
    config = dataclasses.replace(config, target=chip.name)
    env = read_env()
    if config.llm and llm_client is None and not env.anthropic_api_key:
        raise EnvironmentProblem("--llm needs ANTHROPIC_API_KEY", hint="export it, or drop --llm")
    db_file = Path(db_path) if db_path else (env.db_path or default_path(kernel_path))
    out_path = kernel_path if in_place else Path(output) if output else default_output(kernel_path)
    owned = contextlib.ExitStack()
    if isinstance(executor, str):
        executor = make_executor(executor, ray_address or (env.ray_address if executor == "ray" else None))
        owned.callback(executor.close)
    inner = evaluator or Tiers(chip, use_compiler=config.use_compiler, executor=executor)
    timed_here = getattr(inner, "unavailable", None)
    selected = select_passes(config.passes, hardware=callable(timed_here) and timed_here("hardware") is None)
    starts, start_notes = hardware_only_starts(config.start_from, selected)
    config = dataclasses.replace(config, start_from=starts)
    with owned, KernelDB.open(db_file) as db:
        wid = db.workload(base.digest, str(kernel_path), dict(base.dims), chip.name, _versions())
        key = json.loads(json.dumps(_config_key(config, selected, inner)))
        last = db.last_run(wid)
        if (
            not fresh
            and not resume
            and last is not None
            and last.state == "done"
            and last.config == key
            and last.result
        ):
            result = _from_row(last.result, time.perf_counter() - start)
            if write_output and result.correct:
                _write_output(out_path, result.source, kernel_path, in_place)
            if report_dir is not None:
                result = _report(Path(report_dir), base, None, result, chip)
            return result
        # --resume continues the newest run if it was interrupted with this config (evolve reloads its population)
        resume_from = (
            last.id if resume and last is not None and last.state == "interrupted" and last.config == key else None
        )
        run_id = db.start_run(wid, key)
        cached = CachedEvaluator(inner, db, wid, chip.name, run_id=run_id, resume_from=resume_from)
        try:
            with contextlib.ExitStack() as stack:
                session = None
                if config.llm:
                    from .llm.client import AnthropicClient
                    from .llm.session import llm_session

                    client = llm_client or AnthropicClient(env.anthropic_api_key or "")
                    session = stack.enter_context(
                        llm_session(client, db, model=env.llm_model, chip=chip, max_requests=config.llm_max_requests)
                    )
                outcome = run_strategy(config.strategy, base, selected, cached, chip, config, progress=progress)
                usage = session.usage().to_dict() if session is not None else None
        except BaselineIncorrect as e:
            db.finish_run(run_id, {"error": e.message}, state="done")
            raise KernelError(
                f"the input kernel fails its own correctness check: {e.message}",
                path=str(kernel_path),
                hint="fix the kernel (or its reference/TOLERANCE) before optimizing it",
            ) from None
        except BaseException:
            db.finish_run(run_id, {}, state="interrupted")
            raise
        result = _finish(outcome, base, chip, cached, kernel_path, out_path, start, config)
        result = dataclasses.replace(
            result, llm_usage=usage, notes=(*result.notes, *start_notes, *untunable_notes(base))
        )
        if evaluator is None:  # a caller's own evaluator (tests, fakes) decides correctness alone
            result = _generalize(result, base, outcome, executor)
        if write_output and result.correct:
            _write_output(out_path, result.source, kernel_path, in_place)
        if report_dir is not None:
            result = _report(Path(report_dir), base, outcome, result, chip)
        db.finish_run(run_id, {**result.to_dict(), "source": result.source, "nodes": list(result.nodes)})
    return result


def _search_config(config: SearchConfig | None, overrides: Mapping[str, Any]) -> SearchConfig:
    """`config` with keyword overrides; an unknown keyword is a UsageError naming the known ones."""
    config = config or SearchConfig()
    known = {f.name for f in dataclasses.fields(SearchConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise UsageError(
            f"optimize() got an unknown option {unknown[0]!r}", hint=f"SearchConfig fields: {sorted(known)}"
        )
    if "passes" in overrides:
        overrides = {**overrides, "passes": tuple(overrides["passes"])}
    return dataclasses.replace(config, **overrides)


def _report(folder: Path, base: KernelIR, outcome: SearchOutcome | None, result: Result, chip: Chip) -> Result:
    from .report.render import write_report

    rp = write_report(folder, base, outcome, result, chip)
    return dataclasses.replace(result, report_path=str(rp))


def _generalize(result: Result, base: KernelIR, outcome: SearchOutcome, executor: Executor) -> Result:
    """Keep the original kernel as the fallback at sizes the optimized one was not tuned for, and check the module
    at a second size (fallback.py); its verdict joins the final check under "sizes"."""
    if not result.correct or not result.recipe or base.workload is None:
        return result
    from .fallback import generalize

    verified = result.final_check.get("data", {}).get("dims") or dict(base.dims)
    own = outcome.baseline.results.get("check")
    g = generalize(
        result.source,
        base.source,
        result.kernel,
        base.workload,
        verified,
        (own.data.get("dims") if own is not None else None) or {},
        tuple(result.final_check.get("data", {}).get("seeds") or FINAL_SEEDS),
        executor,
    )
    final = {**result.final_check, "sizes": g.to_dict()}
    return dataclasses.replace(result, source=g.source, correct=g.ok, final_check=final)


def _write_output(out_path: Path, source: str, kernel_path: Path, in_place: bool) -> None:
    if out_path.resolve() == kernel_path.resolve() and not in_place:
        raise UsageError("refusing to overwrite the input kernel", hint="pass --in-place to replace it")
    write_atomic(out_path, source)


def _finish(
    outcome: SearchOutcome,
    base: KernelIR,
    chip: Chip,
    evaluator: CachedEvaluator,
    kernel_path: Path,
    out_path: Path,
    start: float,
    config: SearchConfig,
) -> Result:
    tier = outcome.score_tier
    t0 = time.perf_counter()
    best, gate_notes = _target_gate(outcome, evaluator, chip.name)
    seeds = final_seeds(config.seed)
    final: TierResult = evaluator.check(best.ir, seeds) if best.ir is not None else TierResult("check", False)
    final_s = time.perf_counter() - t0
    correct = final.ok
    if not correct:  # never return an unverified kernel: fall back to the baseline
        best = outcome.baseline
    b = score_of(outcome.baseline, tier)
    s = score_of(best, tier)
    base_ok, base_reason = baseline_verdict(outcome.baseline.results, tier)
    device = outcome.ranking.device if tier == "hardware" else None
    best_reason = (
        None
        if s
        else f"the best candidate failed the final re-check ({final.message}); the baseline is kept"
        if not correct
        else _untimed_reason(best, tier, chip.name)
        if best is not outcome.baseline
        else "no verified candidate has a time at this tier"
    )
    return Result(
        kernel=str(kernel_path),
        target=chip.name,
        baseline=Measurement(b.time_s if b else None, tier, base_ok, base_reason, device),
        best=Measurement(s.time_s if s else None, tier, s is not None, best_reason, device),
        speedup=(b.time_s / s.time_s) if b and s and s.time_s else None,
        correct=correct,
        recipe=best.recipe,
        source=best.ir.source if best.ir is not None else base.source,
        output_path=str(out_path),
        candidates_evaluated=outcome.evaluations,
        wall_s=time.perf_counter() - start,
        stop_reason=outcome.stop_reason,
        final_check=final.to_dict(),
        model_baseline_s=outcome.baseline.results["model"].time_s,
        model_best_s=best.results["model"].time_s if "model" in best.results else None,
        ranking=outcome.ranking,
        budget=Budget(config.budget_seconds, outcome.wall_s, outcome.spend, final_s),
        strategy=outcome.strategy,
        nodes=tuple(node_summary(n, tier) for n in outcome.nodes.values()),
        notes=(*gate_notes, *_kernels_alone_notes(outcome.baseline.results.get("compiler"))),
    )


GATE_TRIES = 3  # verified candidates the target-compile gate tries, best first, before it keeps the baseline


def _target_gate(outcome: SearchOutcome, evaluator: CachedEvaluator, target: str) -> tuple[Node, tuple[str, ...]]:
    """The result: the best verified candidate that compiles for the target at the module's default dims
    (`Tiers.target_compile`; the compiler tier compiles at reduced dims, a model-ranked search not at all), trying
    up to `GATE_TRIES` in rank order, else the baseline; and a note per candidate it refused. Without a compiler
    here the search's best stands (the run already says the compiler tier is not used). A compile that times out is
    no verdict: that candidate stands, said in a note."""
    best = outcome.best
    if best is outcome.baseline or best.ir is None:
        return best, ()
    ranked = [best, *(n for n in outcome.verified if n is not best)][:GATE_TRIES]  # the search's own order
    notes: list[str] = []
    for n in ranked:
        assert n.ir is not None
        r = evaluator.target_compile(n.ir)
        if r is None:
            return best, ()
        if r.ok:
            return n, tuple(notes)
        recipe = ",".join(n.recipe)
        if r.data.get("no_verdict"):
            return n, (*notes, f"{recipe}: its compile for {target} at the default dims did not end ({r.message})")
        notes.append(f"{recipe} does not compile for {target} at the default dims ({r.message}): not the result")
    return outcome.baseline, (*notes, "no verified candidate tried compiles there: the input kernel is kept")


def _untimed_reason(best: Node, tier: str, target: str) -> str:
    """Why a verified best that replaced a baseline with no time (it does not fit or compile) has none either."""
    r = best.results.get(tier)
    why = (r.message or str(r.data.get("report", {}).get("note") or "")) if r is not None else ""
    runs = f"compiles for {target}" if tier == "compiler" else f"runs on {target}"
    return f"{runs} where the baseline does not, and passes the checks; the {tier} tier gives it no time" + (
        f" ({why})" if why else ""
    )


def _from_row(row: Mapping[str, Any], wall_s: float) -> Result:
    return Result(
        kernel=row["kernel"],
        target=row["target"],
        baseline=Measurement.from_dict(row["baseline"]),
        best=Measurement.from_dict(row["best"]),
        speedup=row["speedup"],
        correct=row["correct"],
        recipe=tuple(row["recipe"]),
        source=row["source"],
        output_path=row["output_path"],
        candidates_evaluated=0,
        wall_s=wall_s,
        stop_reason=row["stop_reason"],
        final_check=row["final_check"],
        from_cache=True,
        model_baseline_s=row.get("model_baseline_s"),
        model_best_s=row.get("model_best_s"),
        report_path=row.get("report_path"),
        ranking=TierChoice.from_dict(row["ranking"]) if row.get("ranking") else None,
        budget=Budget.from_dict(row["budget"]) if row.get("budget") else None,
        nodes=tuple(row.get("nodes") or ()),
        notes=tuple(row.get("notes") or ()),
        strategy=str(row.get("strategy") or "beam"),
    )
