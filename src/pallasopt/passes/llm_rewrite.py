"""llm-rewrite: ask a language model to rewrite the kernel along one strategy of our menu; keep only verified code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..cost_model.hardware import Chip
from ..errors import check
from ..ir.kernel_ir import KernelIR
from ..llm.rewrite import rewrite
from ..llm.session import current_session
from ..llm.strategies import STRATEGIES, get_strategy
from .base import Pass

NO_SESSION = "no LLM session: run with --llm and ANTHROPIC_API_KEY set"


@dataclass(frozen=True)
class LLMRewritePass(Pass):
    """Have a language model rewrite the kernel following one strategy (online-softmax, fuse-epilogue, ...).

    Helps where a rewrite goes beyond block sizes and compiler parameters: restructuring the body, fusing, adding
    a scratch accumulator. The reply must keep the oracle and inputs byte-identical, pass static validation, trace
    in a child process and pass the correctness oracle; failures are fed back to the model up to the session's
    `max_attempts`. Runs only inside an LLM session (`pallasopt.llm.llm_session`); replies are cached in the
    kernel database. Parameter: `strategy`, one of the menu in `pallasopt.llm.strategies` (see docs/llm.md).
    """

    name: ClassVar[str] = "llm-rewrite"
    strategy: str = "online-softmax"

    def __post_init__(self) -> None:
        get_strategy(self.strategy)  # ValueError naming the menu; from_params turns it into a UsageError

    @classmethod
    def choices(cls, ir: KernelIR, chip: Chip) -> tuple[Pass, ...]:
        if current_session() is None:
            return ()
        return tuple(cls(strategy=s.name) for s in STRATEGIES if s.applies(ir))

    def apply(self, ir: KernelIR) -> KernelIR:
        session = current_session()
        check(session is not None, NO_SESSION)
        assert session is not None
        strategy = get_strategy(self.strategy)
        check(strategy.applies(ir), f"{strategy.name} does not apply here: it needs {strategy.requires}")
        outcome = rewrite(ir, strategy, session, self.spec())
        check(outcome.ir is not None, f"{strategy.name}: {outcome.reason()}")
        assert outcome.ir is not None
        return outcome.ir
