"""DAG pictures: Mermaid structure, DOT parsed by pydot, SVG and HTML parsed, states as colours."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

import pydot
import pytest

from pipeline.observe.dag_render import DagNode, layout, state_color, to_dot, to_html, to_mermaid, to_svg

SVG = "{http://www.w3.org/2000/svg}"

# A diamond plus a side branch, in several states; one name with characters that need escaping.
NODES = [
    DagNode("raw/a-000000000001", "raw/a", "SUCCESS"),
    DagNode("tok/b-000000000002", "tok/b", "RUNNING", ("raw/a-000000000001",), "/p/tok/b-000000000002"),
    DagNode("tok/c-000000000003", "tok/c", "FAILED", ("raw/a-000000000001",)),
    DagNode("train/d-000000000004", "train/d", "NOT STARTED", ("tok/b-000000000002", "tok/c-000000000003")),
    DagNode('odd/"q"<&>-000000000005', 'odd/"q"<&>', "CACHED"),
]


def test_mermaid_has_every_node_edge_and_state_class():
    text = to_mermaid(NODES)
    lines = text.splitlines()
    assert lines[0] == "flowchart LR"
    node_lines = [line.strip() for line in lines if re.fullmatch(r"\s+n\d+\[\".*\"\]", line)]
    assert len(node_lines) == len(NODES)
    assert 'n0["raw/a<br/>SUCCESS"]' in node_lines
    assert all('"' not in line[line.index('["') + 2 : -2] for line in node_lines)  # quotes escaped
    edges = {tuple(line.split(" --> ")) for line in (x.strip() for x in lines) if " --> " in line}
    assert edges == {("n0", "n1"), ("n0", "n2"), ("n1", "n3"), ("n2", "n3")}
    fill, stroke = state_color("FAILED")
    assert f"classDef s_FAILED fill:{fill},stroke:{stroke},color:#000" in text
    assert "    class n3 s_NOT_STARTED" in lines and "    class n1 s_RUNNING" in lines


def test_dot_parses_with_pydot_and_carries_state_colours():
    (graph,) = pydot.graph_from_dot_data(to_dot(NODES))
    names = {n.get_name().strip('"') for n in graph.get_nodes() if n.get_name() not in ("node", "edge")}
    assert names == {n.label.replace('"', '\\"') for n in NODES}
    edges = {(e.get_source().strip('"'), e.get_destination().strip('"')) for e in graph.get_edges()}
    assert ("tok/b-000000000002", "train/d-000000000004") in edges and len(edges) == 4
    running = graph.get_node('"tok/b-000000000002"')[0]
    assert running.get("fillcolor").strip('"') == state_color("RUNNING")[0]
    assert running.get("label").strip('"') == "tok/b\\nRUNNING"


def test_layout_puts_each_node_right_of_its_upstreams():
    pos = layout(NODES)
    for node in NODES:
        for dep in node.deps:
            assert pos[dep][0] < pos[node.label][0]
    assert pos["train/d-000000000004"][0] == 2
    assert len(set(pos.values())) == len(NODES)  # no two nodes in one cell


def test_layout_survives_a_deep_chain():
    chain = [DagNode("s-0", "s", "SUCCESS")]
    chain += [DagNode(f"s-{i}", "s", "SUCCESS", (f"s-{i - 1}",)) for i in range(1, 3000)]
    assert layout(list(reversed(chain)))["s-2999"] == (2999, 0)


def test_svg_is_well_formed_with_a_coloured_box_per_node():
    root = ET.fromstring(to_svg(NODES))
    assert root.tag == f"{SVG}svg"
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "node"]
    assert {g.get("data-label") for g in groups} == {n.label for n in NODES}
    for g in groups:
        rect = g.find(f"{SVG}rect")
        assert rect is not None and rect.get("fill") == state_color(g.get("data-state"))[0]
    paths = [p for p in root.iter(f"{SVG}path") if p.get("marker-end")]
    assert len(paths) == 4
    assert "script" not in to_svg(NODES)


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href") and value and not value.startswith("#"):
                self.external.append(value)


def test_html_is_one_self_contained_page_with_svg_and_legend():
    page = to_html(NODES, title="tiny <run>")
    parser = _Collector()
    parser.feed(page)
    assert parser.tags.count("svg") == 1 and "script" not in parser.tags
    assert parser.external == []  # nothing fetched from elsewhere
    assert "<title>tiny &lt;run&gt;</title>" in page
    svg = page[page.index("<svg") : page.index("</svg>") + len("</svg>")]
    assert ET.fromstring(svg).tag == f"{SVG}svg"
    legend = re.findall(r'class="legend-item" data-state="([^"]+)"', page)
    assert sorted(legend) == sorted({n.state for n in NODES})


def test_bad_node_lists_are_refused():
    with pytest.raises(ValueError, match="not in the node list"):
        to_mermaid([DagNode("a-1", "a", "SUCCESS", ("ghost",))])
    with pytest.raises(ValueError, match="share the label"):
        to_dot([DagNode("a-1", "a", "SUCCESS"), DagNode("a-1", "a", "FAILED")])
    with pytest.raises(ValueError, match="cycle"):
        layout([DagNode("a", "a", "RUN", ("b",)), DagNode("b", "b", "RUN", ("a",))])


# A training and an evaluation that follows it (`output_of(train, blocking=False)`).
FOLLOW = [
    DagNode("data-000000000001", "data", "SUCCESS"),
    DagNode("train-000000000002", "train", "RUNNING", ("data-000000000001",)),
    DagNode(
        "eval-000000000003", "eval", "RUNNING", ("data-000000000001",), soft_deps=("train-000000000002",)
    ),
]


def test_a_non_blocking_edge_is_drawn_dashed_in_every_format():
    mermaid = to_mermaid(FOLLOW)
    assert "    n1 -.-> n2" in mermaid.splitlines() and "    n0 --> n2" in mermaid.splitlines()
    (graph,) = pydot.graph_from_dot_data(to_dot(FOLLOW))
    styles = {
        (e.get_source().strip('"'), e.get_destination().strip('"')): e.get("style") for e in graph.get_edges()
    }
    assert styles[("train-000000000002", "eval-000000000003")] == "dashed"
    assert styles[("data-000000000001", "eval-000000000003")] is None
    paths = ET.fromstring(to_svg(FOLLOW)).findall(f".//{SVG}path")
    dashed = [p for p in paths if p.get("stroke-dasharray")]
    assert len(dashed) == 1 and "non-blocking" in dashed[0].find(f"{SVG}title").text
    assert 'stroke-dasharray="5 4"' in to_html(FOLLOW)
    # The follower sits right of what it follows.
    position = layout(FOLLOW)
    assert position["eval-000000000003"][0] > position["train-000000000002"][0]
