"""Making candidates for the funnel (search/funnel.py): a pass choice applied to a state (`apply_choice`), a
strategy's truncation of a choice space (`truncate`), one candidate per tier signature (`one_per_signature`), and
the baseline's verdicts at every tier (`evaluate_baseline`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ..errors import PassNotApplicable, ProblemChanged
from ..passes.base import Pass, spec_name
from .node import Node, ProgressFn
from .ranking import only_in_margin, unavailable_reason
from .spend import Ledger
from .tiers import Evaluator, deadline_kw


def truncate(options: Sequence[Pass], per_call: int | None, window: int = 0) -> tuple[Pass, ...]:
    """The first `per_call` options for each `pallas_call` (by the pass's `call` field), order kept; `window` n > 0:
    the n-th next `per_call` of each call instead (none without a `per_call`: the first window held them all)."""
    if per_call is None:
        return tuple(options) if window == 0 else ()
    lo, hi = window * per_call, (window + 1) * per_call
    seen: dict[object, int] = {}
    out = []
    for o in options:
        k = getattr(o, "call", None)
        if lo <= seen.get(k, 0) < hi:
            out.append(o)
        seen[k] = seen.get(k, 0) + 1
    return tuple(out)


def evaluate_baseline(
    root: Node,
    evaluator: Evaluator,
    ledger: Ledger,
    seeds: tuple[int, int],
    clock: Callable[[], float],
    compile_deadline: float | None = None,
    jobs: int = 1,
) -> tuple[int, float]:
    """Model, compiler, check and hardware verdicts on the baseline; the number of evaluations and the check's
    seconds; with `jobs` >= 2 the compile and the check run at once. `compile_deadline` (a search with a budget): the
    baseline's compile is stopped there; stopped, it is a `budget_cut` result (no verdict on the kernel), so the
    ranking goes to the next tier and says why.

    A baseline the model finds over the VMEM limit (or with an illegal block shape) is not compiled or timed: the
    compiler can take minutes to reject huge blocks (FACTS.md), and its verdict is already known. One the model
    rejects only for its safety margin under the limit is compiled: there the compiler decides."""
    assert root.ir is not None
    ir = root.ir
    root.results["model"] = ledger.timed("model", evaluator.model, ir)
    n = 1
    compile_it = root.passed("model") or only_in_margin(root.results["model"])
    with ThreadPoolExecutor(1) as side:
        # The compile runs beside the check when two jobs may run at once (neither reads the other's verdict).
        compiling = None
        if compile_it and unavailable_reason(evaluator, "compiler") is None:
            kw = deadline_kw(evaluator.compiler, compile_deadline)
            compiling = side.submit(lambda: ledger.timed("compiler", evaluator.compiler, ir, **kw))
            if jobs < 2:
                compiling.result()
        t_check = clock()
        root.results["check"] = ledger.timed("check", evaluator.check, ir, seeds)
        check_s = clock() - t_check
        n += 1
        comp = compiling.result() if compiling is not None else None
    if comp is not None:
        root.results["compiler"] = comp
        n += 1
    fits = root.passed("model") or root.passed("compiler")
    if root.passed("check") and fits and unavailable_reason(evaluator, "hardware") is None:
        hw = ledger.timed("hardware", evaluator.hardware, ir)
        if hw is not None:
            root.results["hardware"] = hw
            n += 1
    return n, check_s


def signature(n: Node) -> tuple[object, ...]:
    """Candidates with the same blocks, grid, buffering, traced body and model time are the same to every tier we
    rank with (e.g. three vmem-limit values that all fit): compile and check one of them. The body's traced stats
    are part of it: a rewrite of the body alone (`fold-last-step`: the same blocks and model time, one store and
    load of the accumulator fewer) is another program to the compiler."""
    assert n.ir is not None
    t = n.results["model"].time_s or 0.0
    shape = tuple(
        (
            c.grid,
            tuple((o.block_shape, o.buffer_count) for o in c.operands),
            c.dimension_semantics,
            len(c.scratch),
            c.body,
        )
        for c in n.ir.calls
    )
    return (round(t, 12), shape)


def one_per_signature(nodes: list[Node]) -> list[Node]:
    seen: set[tuple[object, ...]] = set()
    out = []
    for n in nodes:
        key = signature(n)
        if key not in seen:
            seen.add(key)
            out.append(n)
    return out


# Calls whose best candidates the model times within this factor of the overall best all need a step of the
# recipe (`share_calls`). Chosen, not fitted: llm_swiglu_mlp's best gate/up and down tiles are 0.3% apart.
CALL_SHARE_RATIO = 1.1
_CALL = re.compile(r"[{,]call=(\d+)[,}]")


def changed_call(n: Node) -> int | None:
    """The pallas_call the node's last pass changed (its `call=` parameter), None when it names none."""
    found = _CALL.search(n.recipe[-1]) if n.recipe else None
    return int(found.group(1)) if found else None


def share_calls(ordered: list[Node], prune: int | None) -> tuple[list[Node], int | None]:
    """The compile order and count for `ordered` (model order, one per signature) where several calls compete.

    When the best candidates changing two or more different calls are within CALL_SHARE_RATIO of the overall best
    (a kernel whose calls all matter: a recipe needs a step on each), the `prune` compiles of this depth are split:
    `prune // n**2` for each of the n competing calls, taken round-robin in model order, the rest after them
    (refills when the compiler rejects one). A depth then costs 1/n of the compiles, so the search reaches the depth
    where every call is tiled. llm_swiglu_mlp (2026-12-04): its 8 depth-1 compiles (10-27 s each) all tiled the
    down projection (model 95.5-95.6 ms, the gate/up tiles 95.8-96.4 ms), spent the 120 s budget, and the run ended
    at 0.16x of XLA with the gate/up call untouched. Otherwise `ordered` and `prune` unchanged."""
    if prune is None or not ordered:
        return ordered, prune
    best = ordered[0].results["model"].time_s
    if best is None:
        return ordered, prune
    groups: dict[int, list[Node]] = {}
    for n in ordered:
        call = changed_call(n)
        if call is not None:
            groups.setdefault(call, []).append(n)
    competing = [g for g in groups.values() if (g[0].results["model"].time_s or 0.0) <= CALL_SHARE_RATIO * best]
    if len(competing) < 2:
        return ordered, prune
    per = max(1, prune // len(competing) ** 2)
    first = [g[i] for i in range(per) for g in competing if i < len(g)]
    chosen = {n.digest for n in first}
    return first + [n for n in ordered if n.digest not in chosen], len(first)


# At most one in this many of a depth's compiles goes to a body rewrite the model cannot rank (`body_rewrites_first`).
# Chosen, not fitted: a beam-4 search compiles 8 per depth, so 2 of them.
BODY_REWRITE_SHARE = 4


def layout_of(n: Node) -> tuple[object, ...]:
    """What the roofline model times a candidate by, call by call: grid, block shapes and buffer counts, dimension
    semantics and scratch count. Two candidates with the same layout and different bodies differ only where the
    model does not look (the vector and transcendental work of the body)."""
    assert n.ir is not None
    return tuple(
        (c.grid, tuple((o.block_shape, o.buffer_count) for o in c.operands), c.dimension_semantics, len(c.scratch))
        for c in n.ir.calls
    )


def body_rewrite(n: Node, parent: Node | None) -> bool:
    """Whether `n` rewrites only its parent's kernel bodies: the same layout (`layout_of`) and model time, another
    body. The model's time for it is its parent's by construction, so its order in the model's list says nothing."""
    if parent is None or parent.ir is None or n.ir is None or len(n.parents) != 1:
        return False
    if n.results["model"].time_s != parent.results.get("model", n.results["model"]).time_s:
        return False
    same_bodies = all(a.body == b.body for a, b in zip(n.ir.calls, parent.ir.calls, strict=False))
    return layout_of(n) == layout_of(parent) and not same_bodies


def body_rewrites_first(
    ordered: list[Node],
    prune: int | None,
    parent_of: Callable[[Node], Node | None],
    parent_key: Callable[[Node], tuple[float, float, str]],
) -> list[Node]:
    """`ordered` (the compile order) with up to `prune // BODY_REWRITE_SHARE` (at least one) body rewrites
    (`body_rewrite`) of parents that passed the compiler tier moved to second place, those of the best-ranked
    parents (`parent_key`) first; the first candidate stays first, the rest keep their order.

    A body rewrite has its parent's model time, and the model ranks a memory-bound kernel by its bytes only: the
    2026-12-06 bench (merged-2765dca) never compiled `sigmoid-tanh` on fused_28's best (0.430 -> 0.4245 ms [C], XLA
    0.426), as eight tile choices the model put a hair ahead took every compile of the depth. The compiler tier sees
    the body (libtpu's static schedule: a logistic 0.081 ms per 2^25 f32 elements against tanh's 0.0117), so it
    ranks them."""
    if prune is None or len(ordered) < 2:
        return ordered
    found = []
    for n in ordered[1:]:
        parent = parent_of(n)
        if parent is not None and parent.passed("compiler") and body_rewrite(n, parent):
            found.append((parent_key(parent), n))
    picks = [n for _, n in sorted(found, key=lambda kn: kn[0])[: max(1, prune // BODY_REWRITE_SHARE)]]
    chosen = {n.digest for n in picks}
    return [ordered[0], *picks, *(n for n in ordered[1:] if n.digest not in chosen)]


def step_leaders(state: Node, ordered: Sequence[Node], faster: Callable[[Node], bool]) -> list[Node]:
    """The children of `state` whose steps `Funnel.compose` applies one after the other, in that order: among those
    `faster` than `state`, taken in `ordered` order, the best of each (pass, call) group (its `call=` parameter; one
    group for a pass that names no call) that keeps the module's calls, then the best one that changes how many calls
    there are (fuse: last, since it renumbers the calls the others name). Steps of different groups edit different
    things, so one after the other is a recipe a further depth would have to find. An LLM-written child is a leaf
    (no workload: it runs only in child processes) and takes no part: replaying its step would ask the LLM again."""
    assert state.ir is not None
    calls = len(state.ir.calls)
    keep: list[Node] = []
    structural: Node | None = None
    seen: set[tuple[str, int | None]] = set()
    for n in ordered:
        if n.parent != state.digest or n.ir is None or n.ir.workload is None or not n.recipe or not faster(n):
            continue
        if len(n.ir.calls) != calls:
            structural = structural or n
            continue
        group = (spec_name(n.recipe[-1]), changed_call(n))
        if group not in seen:
            seen.add(group)
            keep.append(n)
    return keep + ([structural] if structural is not None else [])


def apply_choice(
    state: Node, choice: Pass, nodes: dict[str, Node], say: ProgressFn, parents: tuple[str, ...] = ()
) -> tuple[Node | None, bool]:
    """The node `choice` makes from `state` and whether it is new (None: declined, or failed: recorded)."""
    assert state.ir is not None
    spec = choice.spec()
    recipe = (*state.recipe, spec)
    lineage = parents or (state.digest,)
    try:
        new_ir = choice.rewrite(state.ir)
    except PassNotApplicable as e:
        if isinstance(e, ProblemChanged):  # e.g. a tile knob that is also a constant of the reference: not a kernel
            _failed(nodes, state, recipe, lineage, e.reason, say)
        else:
            say("declined", {"recipe": recipe, "reason": e.reason})
        return None, False
    except Exception as e:  # a candidate that breaks is a result, never the end of the search
        _failed(nodes, state, recipe, lineage, f"{type(e).__name__}: {e}", say)
        return None, False
    if new_ir.digest in nodes:
        return nodes[new_ir.digest], False
    node = Node(recipe, new_ir.digest, lineage[0], state.depth + 1, new_ir, parents=lineage)
    nodes[node.digest] = node
    return node, True


def _failed(
    nodes: dict[str, Node], state: Node, recipe: tuple[str, ...], lineage: tuple[str, ...], why: str, say: ProgressFn
) -> None:
    """Record the candidate `recipe` as failed (`why`): a result of the search, kept in `nodes` and reported."""
    digest = f"failed:{'|'.join(recipe)}"
    nodes[digest] = Node(recipe, digest, lineage[0], state.depth + 1, None, error=why, parents=lineage)
    say("failed", {"recipe": recipe, "error": why})
