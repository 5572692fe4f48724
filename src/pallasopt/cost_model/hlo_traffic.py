"""HBM traffic of a compiled XLA program, read off its optimized HLO text (no TPU needed).

Each top-level instruction of the entry computation reads its operands and writes its results; the ops fused inside
a fusion stay on the core. An array whose layout carries memory space 1 (`S(1)`: VMEM on TPU) is not HBM traffic:
XLA on TPU prefetches small-enough arrays into VMEM with `copy-start` / `copy-done` and its later readers read them
there. That is why XLA's own "bytes accessed" (which counts every operand and result, VMEM ones and the ops inside
fusions too) overstates the HBM traffic: on a v5e XLA's l2 normalization of a 32 MiB bf16 array ran in 0.167 ms
(bench/results/hw-v5e-2026-12-05) where "bytes accessed" (235 MB) / 819 GB/s is 0.287 ms; its HLO reads x twice from
HBM (the norm's reduction and the prefetch into VMEM) and writes the output once: 96 MiB.
"""

from __future__ import annotations

import re

__all__ = ["hbm_traffic_bytes"]

_HEAD = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([\w\-]+)\(")
_ARRAY = re.compile(
    r"(pred|s4|u4|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64|c64|c128|f8\w*)\[([\d,]*)\](\{[^}]*\})?"
)
_OPERAND = re.compile(r"%([\w.\-]+)")
_BITS = {"pred": 8}  # otherwise the digits of the name (s4 -> 4, bf16 -> 16, c64 -> 64), f8 types 8
# No data moves: bookkeeping, aliases and the second half of an asynchronous copy (its start moved the bytes).
_FREE = {
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "copy-done", "after-all", "partition-id",
    "replica-id", "iota", "opt-barrier", "add-dependency",
}  # fmt: skip


def _bits(dtype: str) -> int:
    if dtype in _BITS:
        return _BITS[dtype]
    return 8 if dtype.startswith("f8") else int(re.sub(r"\D", "", dtype))


def _hbm_bytes(type_text: str) -> int:
    """Bytes of the arrays in an HLO type that live in HBM (no `S(n)` memory space other than 0 in the layout)."""
    total = 0
    for dtype, shape, layout in _ARRAY.findall(type_text):
        space = re.search(r"S\((\d+)\)", layout or "")
        if space and space.group(1) != "0":
            continue
        n = 1
        for d in shape.split(","):
            if d:
                n *= int(d)
        total += n * _bits(dtype) // 8
    return total


def _balanced(text: str, start: int) -> int:
    """Index just past the bracket group opening at `text[start]` (parentheses only)."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return len(text)


def _instruction(line: str) -> tuple[str, str, str, str] | None:
    """(name, result type, opcode, operand text) of an HLO instruction line `%n = TYPE opcode(operands), ...`."""
    head = _HEAD.match(line)
    if not head:
        return None
    i = head.end()
    if line[i : i + 1] == "(":
        j = _balanced(line, i)
    else:
        j = line.find(" ", i)
        j = len(line) if j < 0 else j
    op = _OPCODE.match(line, j)
    if not op:
        return None
    k = _balanced(line, op.end() - 1)
    return head.group(1), line[i:j], op.group(1), line[op.end() : k - 1]


def _entry_lines(hlo_text: str) -> list[str]:
    lines = hlo_text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("ENTRY")), None)
    if start is None:
        return []
    out = []
    for line in lines[start + 1 :]:
        if line.startswith("}"):
            break
        out.append(line)
    return out


def hbm_traffic_bytes(hlo_text: str) -> int | None:
    """Bytes the entry computation's top-level instructions read from and write to HBM (None: no entry found).

    Results count once, as written; each operand counts once per instruction that reads it (a fusion that reads an
    array twice inside still reads it once from HBM); VMEM-resident arrays (`S(1)`) and the instructions in `_FREE`
    count nothing. Loops (`while`) count their body once, like XLA's cost analysis."""
    lines = _entry_lines(hlo_text)
    if not lines:
        return None
    types: dict[str, str] = {}
    total = 0
    for line in lines:
        parsed = _instruction(line)
        if parsed is None:
            continue
        name, type_text, opcode, operands = parsed
        types[name] = type_text
        if opcode in _FREE:
            continue
        reads = sum(_hbm_bytes(types.get(op, "")) for op in dict.fromkeys(_OPERAND.findall(operands)))
        if opcode == "copy-start":  # (destination, source, context): the source is the operand, read above
            dest = _ARRAY.search(type_text)
            total += reads + (_hbm_bytes(dest.group(0)) if dest else 0)
            continue
        total += reads + _hbm_bytes(type_text)
    return total
