"""Evolutionary search: a population of verified recipes, mutated and crossed, selected by the tiers' score.

Each generation makes `beam x PRUNE_FACTOR x 2` offspring from parents picked by tournament (two at random, the
faster wins): a mutation (change one pass's parameter, insert a pass at a random position, drop one; with `--llm`
also an LLM rewrite of the member, the `llm-rewrite` pass appended) or a crossover (the head of one parent's recipe,
the tail of the other's, replayed from the baseline; the child names both parents). Mutations are guided, as
tinygrad's BEAM and TVM MetaSchedule's evolutionary search guide theirs with a cost model: the pass is drawn among
those with a choice at that point, the choice favouring the head of the pass's list (passes list their choices
model-best first where they can rank them, e.g. `tile`), and a change moves one parameter of the pass (a neighbour)
when it has neighbours; a share of draws stays uniform over the whole list, so every choice can still be reached.
The funnel prunes them with the model to `2 x beam` compiles, checks in rank order and returns only verified
members; the population is the best `beam` of old and new (elitism: the best never leaves). Only verified members
ever enter the population, so nothing unverified can be returned. `depth` generations; generation g draws from its
own generator seeded by (`SearchConfig.seed`, g). Each generation's population is recorded through the evaluator
(the kernel DB's `population` table, with CachedEvaluator); a resumed run (`--resume`) reloads the last recorded
generation, replays its members' recipes (their verdicts come from the DB) and goes on with the next generation.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from ..config import SearchConfig
from ..cost_model.hardware import Chip
from ..ir.kernel_ir import KernelIR
from ..passes.base import Pass, spec_name
from ..passes.registry import parse_pipeline
from .funnel import PRUNE_FACTOR, Funnel
from .node import Node, ProgressFn, SearchOutcome
from .tiers import Evaluator

CROSSOVER_P = 0.3  # share of offspring made by crossover (when the population has two members)
MAX_TRIES = 10  # proposals tried per wanted offspring before a generation gives up
UNIFORM_P = 0.25  # share of choice draws uniform over the whole list (exploration); the rest favour its head
HEAD_P = 0.3  # the head-favouring draw is geometric: rank r with probability HEAD_P x (1 - HEAD_P)^r (mean ~2.3)


def pick(options: Sequence[Pass], rng: random.Random) -> Pass:
    """One of `options` (listed best first where the pass can rank them): uniform with probability UNIFORM_P, else
    geometric over the rank, wrapping past the end (so a short list is not biased to its last element)."""
    if rng.random() < UNIFORM_P:
        return options[rng.randrange(len(options))]
    r = 0
    while rng.random() > HEAD_P:
        r += 1
    return options[r % len(options)]


def neighbours(options: Sequence[Pass], current: str) -> list[Pass]:
    """The options that differ from the spec `current` (same pass) in exactly one parameter, in their order: the
    local moves a change tries first (empty where none differs in one, e.g. a permutation's other orders)."""
    try:
        (base,) = parse_pipeline(current)
    except Exception:  # a spec that no longer parses has no neighbours
        return []
    mine = {k: str(v) for k, v in base.params().items()}
    out = []
    for o in options:
        theirs = {k: str(v) for k, v in o.params().items()}
        keys = mine.keys() | theirs.keys()
        if sum(mine.get(k) != theirs.get(k) for k in keys) == 1:
            out.append(o)
    return out


def mutate(f: Funnel, member: Node, passes: Sequence[type[Pass]], rng: random.Random, llm: bool) -> Node | None:
    """One random mutation of `member` (None: it did not apply)."""
    r = member.recipe
    kinds = ["insert", "insert"] + (["change", "drop"] if r else []) + (["llm"] if llm else [])
    kind = rng.choice(kinds)
    if kind == "llm":
        by = {p.name: p for p in passes}
        if "llm-rewrite" not in by:
            return None
        rewrites = f.choices(member, by["llm-rewrite"])
        return f.follow(member, rewrites[rng.randrange(len(rewrites))], (member.digest,)) if rewrites else None
    if kind == "drop":
        i = rng.randrange(len(r))
        return f.replay(f.root, r[:i] + r[i + 1 :], (member.digest,))
    i = rng.randrange(len(r) + 1) if kind == "insert" else rng.randrange(len(r))
    head = f.replay(f.root, r[:i])
    if head is None or head.ir is None or head.ir.workload is None:
        return None
    candidates = list(passes) if kind == "insert" else [p for p in passes if p.name == spec_name(r[i])]
    candidates = [p for p in candidates if f.choices(head, p)]  # a pass with no choice here cannot mutate it
    if not candidates:
        return None
    p = candidates[rng.randrange(len(candidates))]
    options = [o for o in f.choices(head, p) if kind == "insert" or o.spec() != r[i]]
    if kind == "change":
        options = neighbours(options, r[i]) or options
    if not options:
        return None
    spec = pick(options, rng).spec()
    tail = r[i:] if kind == "insert" else r[i + 1 :]
    return f.replay(head, (spec, *tail), (member.digest,))


def tournament(f: Funnel, population: Sequence[Node], rng: random.Random) -> Node:
    """Two members at random; the faster one (ties by recipe)."""
    x, y = rng.choice(population), rng.choice(population)
    return min(x, y, key=f.rank_key)


def crossover(f: Funnel, a: Node, b: Node, rng: random.Random) -> Node | None:
    """`a`'s recipe up to a random cut, then `b`'s from a random cut; both are its parents."""
    i, j = rng.randint(0, len(a.recipe)), rng.randint(0, len(b.recipe))
    specs = a.recipe[:i] + b.recipe[j:]
    if not specs:
        return None
    return f.replay(f.root, specs, (a.digest, b.digest))


def restore(f: Funnel, evaluator: Evaluator) -> tuple[list[Node], int]:
    """The population to start from and the generation it is from: the last one an interrupted run recorded
    (`evaluator.resumed_population()`, the kernel DB), its members replayed and re-verified from their recorded
    verdicts; else the baseline alone at generation 0. A member that no longer replays or passes is dropped."""
    fn = getattr(evaluator, "resumed_population", None)
    got = fn() if callable(fn) else None
    if not got:
        return [f.root], 0
    generation, recipes = got
    members = {}
    for specs in recipes:
        node = f.replay(f.root, specs)
        if node is not None and node.ir is not None:
            members[node.digest] = node
    f.restore(list(members.values()))
    alive = [n for n in members.values() if n.passed("check") and f.key(n) < float("inf")]
    if not alive:
        return [f.root], 0
    f.say("restored", {"generation": generation, "members": len(alive)})
    return sorted(alive, key=f.rank_key), generation


def evolve_search(
    base: KernelIR,
    passes: Sequence[type[Pass]],
    evaluator: Evaluator,
    chip: Chip,
    config: SearchConfig,
    *,
    progress: ProgressFn | None = None,
    seeds: tuple[int, int] | None = None,
) -> SearchOutcome:
    f = Funnel(base, evaluator, chip, config, progress=progress, seeds=seeds, clock=lambda: time.perf_counter())
    want = config.beam * PRUNE_FACTOR * 2
    record = getattr(evaluator, "record_population", None)
    population, done = restore(f, evaluator)
    started = f.warm_start(config.start_from)  # an earlier run's verified states join the first population
    population = sorted({n.digest: n for n in population + started}.values(), key=f.rank_key)[: config.beam]
    if done and callable(record):  # the new run's table starts with the generation it continues from
        record(done, [n.ir for n in population if n.ir is not None])
    stop = "depth limit"
    for gen in range(done + 1, config.depth + 1):
        if not f.budget_left():
            stop = "budget"
            break
        rng = random.Random(f"evolve:{config.seed}:{gen}")  # a resumed run draws what the uninterrupted one would

        offspring: dict[str, Node] = {}
        for _ in range(want * MAX_TRIES):
            if len(offspring) >= want or not f.budget_left():
                break
            if len(population) > 1 and rng.random() < CROSSOVER_P:
                child = crossover(f, tournament(f, population, rng), tournament(f, population, rng), rng)
            else:
                child = mutate(f, tournament(f, population, rng), passes, rng, config.llm)
            if child is not None and child.ir is not None and "model" not in child.results:
                offspring[child.digest] = child
        f.say("expanded", {"depth": gen, "children": len(offspring)})
        if not offspring:
            stop = "no applicable pass"
            break
        worst = max(f.key(n) for n in population) if len(population) >= config.beam else float("inf")
        verified = f.evaluate(offspring.values(), config.beam, worst)
        merged = {n.digest: n for n in population + verified}.values()
        population = sorted(merged, key=f.rank_key)[: config.beam]
        if callable(record) and population[0].ir is not None:
            record(gen, [n.ir for n in population if n.ir is not None])
        f.say("depth", {"depth": gen, "best": population[0], "time_s": f.key(population[0]), "tier": f.score_tier})
        if f.cut:
            stop = "budget"
            break
    return f.outcome(stop, "evolve")
