"""Pictures of a DAG: Mermaid text, Graphviz DOT, a standalone SVG and a one-file HTML page.

Everything here works from a neutral list of `DagNode`s (label, name, state, deps), so the CLI
builds it from a plan or step records and the dashboard builds it from a manifest, and neither
needs the other. States are shown as colours (`STATE_COLORS`). The SVG layout is our own and
plain: one column per depth (longest path from a source), nodes in a column ordered by the mean
row of their upstreams to keep edges short, cubic edges between columns. No I/O, no external
JavaScript, no Graphviz binary.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "STATE_COLORS",
    "DagNode",
    "layout",
    "state_color",
    "to_dot",
    "to_html",
    "to_mermaid",
    "to_svg",
]


@dataclass(frozen=True)
class DagNode:
    """One step as a picture needs it."""

    label: str
    """`name-<hash>`: the node's key; `deps` refer to other nodes by it."""
    name: str
    state: str
    """A plan or run state (CACHED, RUN, SUCCEEDED, ...) or a status event (SUCCESS, RUNNING, ...)."""
    deps: tuple[str, ...] = ()
    detail: str = ""
    """Shown on hover in SVG/HTML (e.g. the output path or the plan's reason)."""
    soft_deps: tuple[str, ...] = ()
    """Upstreams read with `output_of(..., blocking=False)`: in identity, not waited for (drawn dashed)."""

    @property
    def inputs(self) -> tuple[str, ...]:
        """Every upstream, blocking first: what the layout follows."""
        return (*self.deps, *(d for d in self.soft_deps if d not in self.deps))

    def edges(self) -> list[tuple[str, bool]]:
        """(upstream, dashed) for each edge into this node."""
        return [(d, False) for d in self.deps] + [(d, True) for d in self.soft_deps if d not in self.deps]


# (fill, border) per state. Plan states and `.status` events share colours where they mean the same.
STATE_COLORS: Mapping[str, tuple[str, str]] = {
    "SUCCESS": ("#c8e6c9", "#2e7d32"),
    "SUCCEEDED": ("#c8e6c9", "#2e7d32"),
    "CACHED": ("#e8f5e9", "#66bb6a"),
    "RUNNING": ("#fff59d", "#f9a825"),
    "RUN": ("#fff8e1", "#ffb300"),
    "WAIT": ("#e0f7fa", "#00838f"),
    "FAILED": ("#ffcdd2", "#c62828"),
    "CORRUPT": ("#ffcdd2", "#c62828"),
    "BLOCKED": ("#fce4ec", "#ad1457"),
    "STALE": ("#ffe0b2", "#e65100"),
    "PREEMPTED": ("#ffe0b2", "#e65100"),
    "CANCELLED": ("#f3e5f5", "#8e24aa"),
    "SKIPPED": ("#eeeeee", "#9e9e9e"),
    "NOT STARTED": ("#ffffff", "#9e9e9e"),
}
_UNKNOWN = ("#ffffff", "#616161")


def state_color(state: str) -> tuple[str, str]:
    """(fill, border) colours of `state`; unknown states are white with a grey border."""
    return STATE_COLORS.get(state, _UNKNOWN)


def _check(nodes: Sequence[DagNode]) -> dict[str, DagNode]:
    by_label: dict[str, DagNode] = {}
    for node in nodes:
        if node.label in by_label:
            raise ValueError(f"two nodes share the label {node.label!r}")
        by_label[node.label] = node
    for node in nodes:
        for dep in node.inputs:
            if dep not in by_label:
                raise ValueError(f"node {node.label!r} depends on {dep!r}, which is not in the node list")
    return by_label


# -- Mermaid and DOT --------------------------------------------------------------------------------


def _class_name(state: str) -> str:
    return "s_" + "".join(c if c.isalnum() else "_" for c in state)


def to_mermaid(nodes: Sequence[DagNode]) -> str:
    """A Mermaid `flowchart LR`: one node per step (name and state), one `classDef` per state."""
    by_label = _check(nodes)
    ids = {label: f"n{i}" for i, label in enumerate(by_label)}
    lines = ["flowchart LR"]
    for node in nodes:
        text = f"{node.name}<br/>{node.state}".replace('"', "#quot;")
        lines.append(f'    {ids[node.label]}["{text}"]')
    for node in nodes:
        # A non-blocking input (`blocking=False`) is a dotted arrow.
        lines.extend(
            f"    {ids[dep]} {'-.->' if soft else '-->'} {ids[node.label]}" for dep, soft in node.edges()
        )
    for state in dict.fromkeys(n.state for n in nodes):
        fill, stroke = state_color(state)
        lines.append(f"    classDef {_class_name(state)} fill:{fill},stroke:{stroke},color:#000")
    for state in dict.fromkeys(n.state for n in nodes):
        members = ",".join(ids[n.label] for n in nodes if n.state == state)
        lines.append(f"    class {members} {_class_name(state)}")
    return "\n".join(lines) + "\n"


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(nodes: Sequence[DagNode]) -> str:
    """A Graphviz `digraph` (left to right), each node filled with its state's colour."""
    _check(nodes)
    lines = [
        "digraph drydock {",
        "  rankdir=LR;",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11];',
        '  edge [color="#757575"];',
    ]
    for node in nodes:
        fill, stroke = state_color(node.state)
        attrs = {
            "label": f"{node.name}\n{node.state}",
            "fillcolor": fill,
            "color": stroke,
            "tooltip": node.label,
        }
        body = ", ".join(f"{k}={_dot_quote(v)}" for k, v in attrs.items())
        lines.append(f"  {_dot_quote(node.label)} [{body}];")
    for node in nodes:
        lines.extend(
            f"  {_dot_quote(dep)} -> {_dot_quote(node.label)}{' [style=dashed]' if soft else ''};"
            for dep, soft in node.edges()
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- layout and SVG -----------------------------------------------------------------------------------

NODE_W = 230
NODE_H = 44
COL_GAP = 70
ROW_GAP = 16
MARGIN = 20


def layout(nodes: Sequence[DagNode]) -> dict[str, tuple[int, int]]:
    """(column, row) of every node: column = longest path from a node without deps.

    Nodes arrive in topological order from plans and manifests; any order works here.
    """
    by_label = _check(nodes)
    depth: dict[str, int] = {}
    for label in by_label:  # iterative longest path, safe for deep chains
        stack = [label]
        while stack:
            current = stack[-1]
            if current in depth:
                stack.pop()
                continue
            pending = [d for d in by_label[current].inputs if d not in depth]
            if pending:
                if any(p in stack for p in pending):
                    raise ValueError(f"the nodes form a cycle through {current!r}")
                stack.extend(pending)
                continue
            depth[current] = 1 + max((depth[d] for d in by_label[current].inputs), default=-1)
            stack.pop()
    columns: dict[int, list[str]] = {}
    for label in by_label:
        columns.setdefault(depth[label], []).append(label)
    position: dict[str, tuple[int, int]] = {}
    for col in sorted(columns):
        # Barycentre of the upstream rows keeps a node near what feeds it; ties keep input order.
        def key(item: tuple[int, str]) -> tuple[float, int]:
            index, label = item
            rows = [position[d][1] for d in by_label[label].inputs]
            return (sum(rows) / len(rows) if rows else float(index), index)

        ordered = sorted(enumerate(columns[col]), key=key)
        for row, (_index, label) in enumerate(ordered):
            position[label] = (col, row)
    return position


def _xy(col: int, row: int) -> tuple[int, int]:
    return MARGIN + col * (NODE_W + COL_GAP), MARGIN + row * (NODE_H + ROW_GAP)


def _fit(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def to_svg(nodes: Sequence[DagNode]) -> str:
    """A standalone SVG document of the DAG (well-formed XML, no scripts, no external resources)."""
    by_label = _check(nodes)
    position = layout(nodes)
    cols = 1 + max((c for c, _r in position.values()), default=0)
    rows = 1 + max((r for _c, r in position.values()), default=0)
    width = 2 * MARGIN + cols * NODE_W + (cols - 1) * COL_GAP
    height = 2 * MARGIN + rows * NODE_H + rows * ROW_GAP  # a lane for long edges under the last row
    esc = html.escape
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#757575"/>'
        "</marker></defs>",
        '<g class="edges" fill="none" stroke="#9e9e9e" stroke-width="1.3">',
    ]
    for node in nodes:
        x2, y2 = _xy(*position[node.label])
        for dep, soft in node.edges():
            x1, y1 = _xy(*position[dep])
            sx, sy, ex, ey = x1 + NODE_W, y1 + NODE_H // 2, x2, y2 + NODE_H // 2
            if position[node.label][0] - position[dep][0] == 1:
                bend = COL_GAP // 2
                d = f"M {sx} {sy} C {sx + bend} {sy}, {ex - bend} {ey}, {ex} {ey}"
            else:
                # Skipping columns: run along the gap under the lower of the two rows, so the
                # edge does not pass behind the nodes of the columns in between.
                lane = max(y1, y2) + NODE_H + ROW_GAP // 2
                h = COL_GAP // 2
                d = (
                    f"M {sx} {sy} C {sx + h} {sy}, {sx + h} {lane}, {sx + COL_GAP} {lane} "
                    f"L {ex - COL_GAP} {lane} C {ex - h} {lane}, {ex - h} {ey}, {ex} {ey}"
                )
            dash = ' stroke-dasharray="5 4" class="soft"' if soft else ""
            kind = " (non-blocking)" if soft else ""
            out.append(
                f'<path d="{d}"{dash} marker-end="url(#arrow)">'
                f"<title>{esc(dep)} → {esc(node.label)}{kind}</title></path>"
            )
    out.append("</g>")
    out.append('<g class="nodes">')
    for label, node in by_label.items():
        x, y = _xy(*position[label])
        fill, stroke = state_color(node.state)
        tip = label + (f"\n{node.detail}" if node.detail else "") + f"\nstate: {node.state}"
        out.append(
            f'<g class="node" data-label="{esc(label)}" data-state="{esc(node.state)}">'
            f"<title>{esc(tip)}</title>"
            f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="6" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="1.5"/>'
            f'<text x="{x + 8}" y="{y + 18}" font-weight="bold">{esc(_fit(node.name, 32))}</text>'
            f'<text x="{x + 8}" y="{y + 35}" fill="#424242">{esc(node.state)}  ·  '
            f"{esc(label.rsplit('-', 1)[-1])}</text></g>"
        )
    out.append("</g></svg>")
    return "\n".join(out) + "\n"


_PAGE_CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 24px; color: #212121; }
h1 { font-size: 18px; margin: 0 0 12px 0; }
.legend { display: flex; flex-wrap: wrap; gap: 10px; margin-bottom: 16px; font-size: 12px; }
.legend span { display: inline-flex; align-items: center; gap: 4px; }
.legend i { display: inline-block; width: 14px; height: 14px; border-radius: 3px; border: 1.5px solid; }
.dag { overflow: auto; border: 1px solid #e0e0e0; border-radius: 6px; padding: 8px; }
"""


def _legend(states: Iterable[str]) -> str:
    items = []
    for state in states:
        fill, stroke = state_color(state)
        items.append(
            f'<span class="legend-item" data-state="{html.escape(state)}">'
            f'<i style="background:{fill};border-color:{stroke}"></i>{html.escape(state)}</span>'
        )
    return '<div class="legend">' + "".join(items) + "</div>"


def to_html(nodes: Sequence[DagNode], title: str = "Drydock DAG") -> str:
    """One self-contained HTML page: a title, a legend of the states present, and the SVG."""
    counts = Counter(node.state for node in nodes)
    summary = ", ".join(f"{n} {s.lower()}" for s, n in counts.items())
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/>'
        f"<title>{html.escape(title)}</title><style>{_PAGE_CSS}</style></head><body>\n"
        f"<h1>{html.escape(title)}</h1>\n"
        f'<p class="summary">{len(nodes)} steps: {html.escape(summary)}</p>\n'
        f"{_legend(counts)}\n"
        f'<div class="dag">\n{to_svg(nodes)}</div>\n</body></html>\n'
    )
