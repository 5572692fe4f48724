"""`@triton.autotune` configs: the port takes one (its block sizes become tunable module constants)."""

from __future__ import annotations

import libcst as cst

from .exprs import call_arg
from .source import TritonFile, code
from .tile_index import Axis, calls


def autotune_configs(tf: TritonFile, fn: cst.FunctionDef) -> list[dict[str, str]]:
    """The `triton.Config({...})` dicts of an `@triton.autotune(configs=...)` kernel, in source order (following
    calls to the file's own functions, e.g. `get_autotune_config()`), integer values only; [] without autotune."""
    for d in fn.decorators:
        dec = d.decorator
        if isinstance(dec, cst.Call) and code(dec.func).endswith("autotune"):
            configs = call_arg(dec, 0, "configs")
            return [] if configs is None else _configs(tf, configs, set())
    return []


def tpu_config(configs: list[dict[str, str]], layout: dict[str, tuple[Axis, Axis]]) -> tuple[dict[str, str], str]:
    """The first config whose blocks meet the TPU's (8, 128) tiling on every array (sublane rows a multiple of 8,
    lane columns of 128), else the first one; and the note saying which and why."""

    def fits(cfg: dict[str, str]) -> bool:
        for rows, cols in layout.values():
            for size, unit in ((rows.size, 8), (cols.size, 128)):
                value = cfg.get(size)
                if value is None or not value.isdigit() or int(value) % unit:
                    return False
        return True

    for i, cfg in enumerate(configs):
        if fits(cfg):
            why = "the first whose blocks meet the TPU's (8, 128) tiling" if i else "the first"
            return cfg, f"config #{i + 1} of {len(configs)}, {why}"
    return configs[0], f"config #1 of {len(configs)} (none meets the TPU's (8, 128) tiling: the tile pass must fix it)"


def _configs(tf: TritonFile, node: cst.CSTNode, seen: set[str]) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    for c in calls(node):  # source order: outer calls first, then their arguments
        f = code(c.func)
        if f in ("triton.Config", "Config") and c.args and isinstance(c.args[0].value, cst.Dict):
            cfg: dict[str, str] = {}
            for el in c.args[0].value.elements:
                ok = isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString)
                if ok and isinstance(el.value, cst.Integer):
                    cfg[str(el.key.evaluated_value)] = code(el.value)  # type: ignore[attr-defined,union-attr]
            out.append(cfg)
        elif isinstance(c.func, cst.Name) and f in tf.functions and f not in seen:
            seen.add(f)
            found = _configs(tf, tf.functions[f], seen)
            if found:
                return out + found  # the first branch that yields configs (is_cuda() -> the CUDA list)
    return out
