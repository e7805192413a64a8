"""What a compiled training step will cost on its chips: the collectives in its program, and a
step time and MFU from a roofline.

    collectives(hlo_text) -> {"all-gather": {"count": n, "bytes": b}, ...}
    roofline(flops, hbm_bytes, collective_bytes, chip, devices, hosts_cross) -> seconds by part
    (the chips' figures: `steps.training.estimates.ACCELERATORS`)

**Collectives** are read from the optimized HLO XLA compiled (`Compiled.as_text()`): every
all-gather, reduce-scatter, all-reduce, all-to-all and collective-permute (synchronous or the
`-start` half of an asynchronous one), with the bytes of its result. An op inside a loop's body
runs once per trip: a scan over layers is a `while` whose condition compares its counter with the
layer count (or carries XLA's `known_trip_count`), and its body's collectives count that many
times, nested loops multiplied.

**The roofline** (per device, per step): compute = FLOPs / peak; memory = bytes accessed / HBM
bandwidth; communication = collective bytes / ICI bandwidth (DCN when the program spans slices).
The step time is max(compute, memory) + communication: communication that XLA overlaps with
compute makes the real step faster, so this is a bound from above, and MFU from it a bound from
below. MFU = 6 x active parameters x tokens per step / (devices x peak x step time).

Chip figures are the vendors' published ones (Cloud TPU system architecture pages; NVIDIA's
H100/H200/B200/GB200 datasheets), per chip: dense bf16 FLOP/s, HBM bytes/s, and the chip's
inter-chip bandwidth counted one way across all its links.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from steps.training.estimates import Accelerator

__all__ = ["collectives", "matmul_flops", "roofline", "summarize_costs"]


KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2,
    "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_SHAPE = re.compile(r"\b(pred|[suf]\d+|bf16|f8e4m3fn|f8e5m2|c64|c128)\[([\d,]*)\]")
_COLLECTIVE = re.compile(r"=.*?\b(" + "|".join(KINDS) + r")(-start|-done)?\(")
_LAYOUT = re.compile(r"\{[^{}]*\}")
_WHILE = re.compile(r"\bwhile\(.*?condition=%?([\w.\-]+),\s*body=%?([\w.\-]+)")
_CONSTANT = re.compile(r"\bs32\[\]\S*\s+constant\((\d+)\)")
_TRIPS = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"(\d+)"')
_CALLS = re.compile(
    r"\b(?:to_apply|calls|true_computation|false_computation|branch_computations)=\{?%?([\w.\-]+)"
)


def _bytes_of(result: str) -> int:
    """Bytes of an instruction's result type (a shape or a tuple of shapes)."""
    total = 0
    for dtype, dims in _SHAPE.findall(result):
        count = 1
        for d in dims.split(","):
            if d:
                count *= int(d)
        total += count * _DTYPE_BYTES.get(dtype, 4)
    return total


def _program(hlo: str) -> tuple[dict[str, list[str]], dict[str, float]]:
    """The HLO module's computations (name -> instruction lines) and how often each runs per step:
    from the entry, through calls, fusions and loops (a loop's body once per trip)."""
    bodies: dict[str, list[str]] = {}
    entry = None
    current: str | None = None
    for line in hlo.splitlines():
        stripped = line.strip()
        if current is None:
            # A computation's header: unindented, `[ENTRY] %name (params) -> type {`.
            if (
                line[:1] not in ("", " ", "\t")
                and stripped.endswith("{")
                and not stripped.startswith("HloModule")
            ):
                words = stripped.split()
                is_entry = words[0] == "ENTRY"
                current = words[1 if is_entry else 0].lstrip("%")
                bodies[current] = []
                if is_entry:
                    entry = current
            continue
        if stripped == "}":
            current = None
            continue
        bodies[current].append(stripped)
    runs: dict[str, float] = {}

    def visit(name: str, times: float, depth: int = 0) -> None:
        if name not in bodies or depth > 50:
            return
        runs[name] = runs.get(name, 0.0) + times
        for line in bodies[name]:
            loop = _WHILE.search(line)
            if loop:
                visit(loop.group(2), times * _trips(line, bodies.get(loop.group(1), [])), depth + 1)
            for called in _CALLS.findall(line):
                if not loop or called != loop.group(2):
                    visit(called, times, depth + 1)

    if entry is not None:
        visit(entry, 1.0)
    return bodies, runs


def matmul_flops(hlo: str) -> tuple[float, float]:
    """FLOPs of the program's dots and convolutions per step, (loop bodies once per trip, loop
    bodies once). XLA's `cost_analysis()` counts a loop's body once: for a model whose layers
    are scanned it reports about one layer's FLOPs; the ratio of the two counts here corrects it.
    A dot is 2 x its result's elements x its contracted size; a convolution (XLA's form of many
    batched matmuls) 2 x its result's elements x its kernel's elements per output feature."""
    bodies, runs = _program(hlo)
    with_trips = once = 0.0
    for name, times in runs.items():
        shapes: dict[str, list[int]] = {}
        for line in bodies[name]:
            target, _, rest = line.partition("=")
            label = target.replace("ROOT", "").strip().lstrip("%")
            plain = _LAYOUT.sub("", rest)  # layouts hold parentheses of their own: `{1,0:T(8,128)}`
            head, _, args = plain.partition("(")
            found = _SHAPE.findall(head)
            if len(found) == 1 and not head.strip().startswith("("):
                shapes[label] = [int(d) for d in found[0][1].split(",") if d]
            op = head.split()[-1] if head.split() else ""
            if op not in ("dot", "convolution"):
                continue
            operands = re.findall(r"%([\w.\-]+)", args.split(")", 1)[0])
            result = shapes.get(label)
            if result is None or len(operands) < 2:
                continue
            elements = math.prod(result)
            if op == "dot":
                lhs = shapes.get(operands[0], [])
                dims = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", rest)
                contracted = (
                    math.prod(lhs[int(d)] for d in dims.group(1).split(",") if d) if dims and lhs else 1
                )
            else:
                kernel = shapes.get(operands[1], [])
                labels = re.search(r"dim_labels=[^_]*_([^-]*)->", rest)
                if not kernel or not labels or "o" not in labels.group(1):
                    continue
                contracted = math.prod(kernel) // max(kernel[labels.group(1).index("o")], 1)
            flops = 2.0 * elements * contracted
            with_trips += times * flops
            once += flops
    return with_trips, once


def collectives(hlo: str) -> dict[str, dict[str, float]]:
    """Count and result bytes of each kind of collective the HLO module runs per step (per device),
    loop bodies counted once per trip (see the module docstring)."""
    bodies, runs = _program(hlo)
    out: dict[str, dict[str, float]] = {}
    for name, times in runs.items():
        for line in bodies[name]:
            match = _COLLECTIVE.search(line)
            if match is None or match.group(2) == "-done":
                continue
            # The result type sits between `=` and the op; an async start's is (operand, result):
            # its last shape is the output.
            shapes = _SHAPE.findall(line[line.find("=") + 1 : match.start(1)])
            size = _bytes_of(" ".join(f"{d}[{s}]" for d, s in shapes[-1:])) if shapes else 0
            entry_ = out.setdefault(match.group(1), {"count": 0.0, "bytes": 0.0})
            entry_["count"] += times
            entry_["bytes"] += times * size
    return out


def _trips(line: str, condition: list[str]) -> int:
    """How often a `while` runs: XLA's `known_trip_count` where it kept one, else the bound its
    condition compares the counter with (a scan's `i < n`), else once."""
    known = _TRIPS.search(line)
    if known:
        return int(known.group(1))
    bounds = [int(c) for text in condition for c in _CONSTANT.findall(text)]
    return max(bounds) if len(bounds) == 1 and any("compare(" in text for text in condition) else 1


def roofline(
    flops: float, hbm_bytes: float, collective_bytes: float, chip: Accelerator, *, across_slices: bool = False
) -> dict[str, float]:
    """Per-device seconds of one step: compute, memory, communication and the step (see the
    module docstring)."""
    compute = flops / chip.peak_flops
    memory = hbm_bytes / chip.hbm_bandwidth
    network = chip.dcn_bandwidth if across_slices else chip.ici_bandwidth
    communication = collective_bytes / network
    return {
        "compute": compute,
        "memory": memory,
        "communication": communication,
        "step": max(compute, memory) + communication,
    }


def summarize_costs(cost: Any) -> dict[str, float]:
    """XLA's `cost_analysis()` (a dict, or a list of one dict per program) as flops and bytes."""
    if isinstance(cost, list | tuple):
        cost = cost[0] if cost else {}
    cost = dict(cost or {})
    return {"flops": float(cost.get("flops", 0.0)), "bytes accessed": float(cost.get("bytes accessed", 0.0))}
