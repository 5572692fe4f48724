"""Configuration values and the one place that reads environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UsageError

DEFAULT_MODEL = "claude-sonnet-4-5"
DEFAULT_TARGET = "v5e"


@dataclass(frozen=True)
class Env:
    """What pallasopt takes from the environment. Read once with `read_env()`; pass the value around."""

    anthropic_api_key: str | None = None
    llm_model: str = DEFAULT_MODEL
    db_path: Path | None = None  # PALLASOPT_DB overrides the default `.pallasopt/` beside the kernel
    python: str | None = None  # PALLASOPT_PYTHON: interpreter for evaluation subprocesses
    no_color: bool = False
    ray_address: str | None = None  # RAY_ADDRESS: the Ray cluster `--executor ray` joins (else a local instance)


def read_env(environ: Mapping[str, str] | None = None) -> Env:
    """Read pallasopt's environment variables (ANTHROPIC_API_KEY, PALLASOPT_MODEL, PALLASOPT_DB, PALLASOPT_PYTHON,
    NO_COLOR, RAY_ADDRESS)."""
    e = os.environ if environ is None else environ
    db = e.get("PALLASOPT_DB")
    return Env(
        anthropic_api_key=e.get("ANTHROPIC_API_KEY") or None,
        llm_model=e.get("PALLASOPT_MODEL") or DEFAULT_MODEL,
        db_path=Path(db) if db else None,
        python=e.get("PALLASOPT_PYTHON") or None,
        no_color=bool(e.get("NO_COLOR")),
        ray_address=e.get("RAY_ADDRESS") or None,
    )


# Set (never read) before Ray is imported to start a local instance: Ray's switch for a single-node cluster makes
# every Ray process bind 127.0.0.1 (ray/_private/services.py get_node_ip_address), and no usage report is sent.
RAY_LOCAL_ENV: Mapping[str, str] = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}


# Variables removed from every evaluation subprocess: candidate code never sees credentials.
SECRET_ENV_PREFIXES: tuple[str, ...] = (
    "ANTHROPIC_",
    "OPENAI_",
    "AWS_",
    "GOOGLE_APPLICATION",
    "HF_TOKEN",
    "GH_TOKEN",
)


def child_env(extra: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of an evaluation subprocess: ours, minus secrets, CPU-only JAX, plus `extra`."""
    base = os.environ if environ is None else environ
    env = {k: v for k, v in base.items() if not k.startswith(SECRET_ENV_PREFIXES)}
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("TPU_SKIP_MDS_QUERY", "1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.update(extra or {})
    return env


STRATEGY_NAMES = ("beam", "evolve", "random", "exhaustive")  # search/strategies.py holds the functions


@dataclass(frozen=True)
class SearchConfig:
    """Everything that shapes one optimization run's search (`optimize(kernel, config)`; `run`'s flags). Every field
    is read: `target` picks the chip, `passes` the passes, `use_compiler` the compiler tier, `seed` the check seeds and
    the random strategies' choices; all but `jobs` and `budget_seconds` go into the run's key in the kernel DB."""

    beam: int = 8  # beam width; the population size for evolve; per-round samples / PRUNE_FACTOR for random
    depth: int = 4  # recipe length for beam/exhaustive; generations for evolve; rounds for random
    target: str = DEFAULT_TARGET
    strategy: str = "beam"
    budget_seconds: float | None = None
    max_candidates: int | None = None
    seed: int = 0
    llm: bool = False
    llm_max_requests: int = 20
    use_compiler: bool = True  # use the deviceless TPU compiler tier when libtpu is installed
    jobs: int = 2
    passes: tuple[str, ...] = field(default_factory=tuple)  # restrict to these pass names (empty: all)
    # Recipes (each a sequence of pass specs) to replay, check and start the search from (`run --start-from`,
    # `bench --start-from`): an earlier run's best is re-verified and kept unless the search finds better.
    start_from: tuple[tuple[str, ...], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGY_NAMES:
            raise UsageError(
                f"unknown search strategy {self.strategy!r}", hint=f"known strategies: {', '.join(STRATEGY_NAMES)}"
            )
        if self.beam < 1 or self.depth < 0:
            raise UsageError("--beam must be >= 1 and --depth >= 0")
        if isinstance(self.start_from, str) or any(
            isinstance(r, str) or not all(isinstance(s, str) for s in r) for r in self.start_from
        ):
            raise UsageError(
                "start_from takes recipes, each a sequence of pass specs",
                hint='e.g. start_from=[("tile{call=0,bm=512}", "fuse{producer=0}")]',
            )
        # lists (JSON, the kernel DB's run key) become tuples: a frozen config compares and hashes by value
        object.__setattr__(self, "start_from", tuple(tuple(r) for r in self.start_from))


BASE_SEEDS = (101, 202)  # the search's check seeds at --seed 0 (each --seed step shifts both by SEED_STRIDE)
SEED_STRIDE = 1000


def check_seeds(seed: int) -> tuple[int, int]:
    """The input seeds the search checks candidates on, driven by `SearchConfig.seed` (`run --seed`)."""
    return (BASE_SEEDS[0] + SEED_STRIDE * seed, BASE_SEEDS[1] + SEED_STRIDE * seed)
