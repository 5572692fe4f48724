"""The registered passes, in one explicit tuple, and the `-p` pipeline spec parser."""

from __future__ import annotations

import re
from typing import Any

from ..errors import UsageError
from .accumulate import AccumulateInScratchPass
from .base import Pass
from .coarsen import CoarsenPass
from .cost_estimate import CostEstimatePass
from .deep_pipeline import PipelinePass
from .dimension_semantics import DimensionSemanticsPass
from .dma_overlap import DmaOverlapPass
from .epilogue import EpiloguePass
from .fold_last_step import FoldLastStepPass
from .fuse import FusePass
from .gather_widen import GatherWidenPass
from .grid_order import GridOrderPass
from .lane_dense import LaneDensePass
from .lane_dense_stats import LaneDenseStatsPass
from .layout import LayoutPass
from .llm_rewrite import LLMRewritePass
from .multi_buffer import MultiBufferPass
from .online_softmax import OnlineSoftmaxPass
from .pad_in_kernel import PadInKernelPass
from .reshape_in_kernel import ReshapeInKernelPass
from .sigmoid_tanh import SigmoidTanhPass
from .single_buffer import SingleBufferPass
from .skip_masked_blocks import SkipMaskedBlocksPass
from .skip_masked_chunks import SkipMaskedChunksPass
from .skip_masked_groups import SkipMaskedGroupsPass
from .smem_partials import SmemPartialsPass
from .split_k import SplitKPass
from .stage_masked import StageMaskedPass
from .stream_chunks import StreamChunksPass
from .tile import TilePass
from .vmem_limit import VmemLimitPass

PASSES: tuple[type[Pass], ...] = (
    TilePass,
    DimensionSemanticsPass,
    VmemLimitPass,
    SingleBufferPass,
    GridOrderPass,
    AccumulateInScratchPass,
    DmaOverlapPass,
    MultiBufferPass,
    GatherWidenPass,
    PipelinePass,
    SkipMaskedBlocksPass,
    SkipMaskedChunksPass,
    SkipMaskedGroupsPass,
    StageMaskedPass,
    StreamChunksPass,
    OnlineSoftmaxPass,
    SplitKPass,
    FusePass,
    EpiloguePass,
    FoldLastStepPass,
    SigmoidTanhPass,
    LayoutPass,
    PadInKernelPass,
    ReshapeInKernelPass,
    CoarsenPass,
    SmemPartialsPass,
    LaneDensePass,
    LaneDenseStatsPass,
    CostEstimatePass,
    LLMRewritePass,
)


def by_name() -> dict[str, type[Pass]]:
    return {p.name: p for p in PASSES}


def describe(p: type[Pass]) -> dict[str, Any]:
    import dataclasses

    return {
        "name": p.name,
        "summary": p.summary(),
        "params": {f.name: str(f.type) for f in dataclasses.fields(p)},
    }


_ITEM = re.compile(r"\s*([a-z][a-z0-9-]*)\s*(\{([^{}]*)\})?\s*(,|$)")


def parse_pipeline(text: str) -> tuple[Pass, ...]:
    """Parse `"tile{call=0,bm=256},dimension-semantics"` into pass instances; `UsageError` on a bad spec."""
    registry = by_name()
    passes: list[Pass] = []
    pos = 0
    text = text.strip()
    if not text:
        raise UsageError("empty pass pipeline", hint='write e.g. -p "tile{bm=256},dimension-semantics"')
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if not m or m.end() == pos:
            raise UsageError(
                f"malformed pass pipeline at character {pos + 1}: {text[pos : pos + 30]!r}",
                hint="the form is name{key=value,...},name2",
            )
        name, body = m.group(1), m.group(3)
        if name not in registry:
            raise UsageError(f"unknown pass {name!r}", hint=f"known passes: {', '.join(sorted(registry)) or 'none'}")
        params: dict[str, str] = {}
        for item in (body or "").split(","):
            if not item.strip():
                continue
            if "=" not in item:
                raise UsageError(f"pass {name!r}: parameter {item.strip()!r} needs a value (key=value)")
            k, v = item.split("=", 1)
            params[k.strip()] = v.strip()
        passes.append(registry[name].from_params(params))
        pos = m.end()
    return tuple(passes)
