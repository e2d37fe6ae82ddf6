"""The edge graph as inline SVG: one page per ``graph_view.layout`` page, nodes coloured by the error they add,
delegate partitions boxed, culprits outlined. Interaction (page buttons, click a node to see its row) is in the
report's inline script (``_assets.JS``), which reads the node table from the ``<script id="edata">`` JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgetorch.devtools.graph_view import EdgeGraph, Layout

from ._charts import _e

NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 148, 22, 14, 22, 14
PART_COLOUR = "#1971c2"


@dataclass
class NodeStyle:
    """How one node is drawn: fill colour, tooltip, whether it is a culprit, its gap-table row (or None)."""

    fill: str
    tip: str
    culprit: bool = False
    row: int | None = None
    rank: int = 0  # 0: not compared / no error; higher draws attention first (page buttons)
    label: str = ""  # the node's text (default: the edge op)


def _label(op: str, width: int = 21) -> str:
    return op if len(op) <= width else op[:width - 1] + "…"


def _xy(lay: Layout, nid: str) -> tuple[float, float, int]:
    p = lay.placed[nid]
    width = lay.widths[p.page]
    row_len = lay.row_len[(p.page, p.layer)]
    x = PAD + (width - row_len) * (NODE_W + GAP_X) / 2 + p.slot * (NODE_W + GAP_X)
    return x, PAD + 12 + p.layer * (NODE_H + GAP_Y), p.page


def _edge(x1: float, y1: float, x2: float, y2: float, span: int) -> str:
    bend = 0.0 if span <= 1 else min(60.0, 14.0 * span ** 0.5)
    d = max(8.0, (y2 - y1) / 2)
    return (f'<path d="M{x1:.0f},{y1:.0f} C{x1 + bend:.0f},{y1 + d:.0f} {x2 + bend:.0f},{y2 - d:.0f} '
            f'{x2:.0f},{y2:.0f}"/>')


def _page_svg(graph: EdgeGraph, lay: Layout, k: int, styles: dict[str, NodeStyle], part_row: dict[str, int]
              ) -> str:
    nodes = graph.by_id()
    ids = lay.pages[k]
    w = 2 * PAD + max(lay.widths[k], 1) * (NODE_W + GAP_X)
    h = 2 * PAD + 12 + lay.heights[k] * (NODE_H + GAP_Y)
    parts = [f'<svg class="graph" width="{w:.0f}" height="{h:.0f}" viewBox="0 0 {w:.0f} {h:.0f}" '
             'xmlns="http://www.w3.org/2000/svg" role="img">', _boxes(graph, lay, k, part_row)]
    edges, stubs = [], []
    for nid in ids:
        x2, y2, _ = _xy(lay, nid)
        for src in nodes[nid].inputs:
            if src not in lay.placed:
                continue
            x1, y1, page = _xy(lay, src)
            if page == k:
                span = lay.placed[nid].layer - lay.placed[src].layer
                edges.append(_edge(x1 + NODE_W / 2, y1 + NODE_H, x2 + NODE_W / 2, y2, span))
            else:
                stubs.append(f'<g class="stub" data-go="{_e(src)}"><line x1="{x2 + NODE_W / 2:.0f}" '
                             f'y1="{y2 - 10:.0f}" x2="{x2 + NODE_W / 2:.0f}" y2="{y2:.0f}"/><title>input from '
                             f'{_e(nodes[src].op)} on page {page + 1} (click to go)</title></g>')
    parts.append('<g class="edges">' + "".join(edges) + "</g>" + "".join(stubs))
    parts += [_node_svg(nid, nodes[nid].op, nodes[nid].kind, *_xy(lay, nid)[:2], styles.get(nid)) for nid in ids]
    parts.append("</svg>")
    return "".join(parts)


def _node_svg(nid: str, op: str, kind: str, x: float, y: float, style: NodeStyle | None) -> str:
    fill = style.fill if style else ("#f1f3f5" if kind != "op" else "#ffffff")
    cls = "gn" + (" culprit" if style and style.culprit else "") + ("" if style and style.row is not None
                                                                   else " norow")
    row = f' data-row="{style.row}"' if style and style.row is not None else ""
    tip = style.tip if style else f"{op} ({'not compared' if kind == 'op' else kind})"
    mark = (f'<text class="star" x="{NODE_W - 4}" y="{NODE_H - 6}" text-anchor="end">★</text>'
            if style and style.culprit else "")
    rx = 11 if kind != "op" else 3
    return (f'<g class="{cls}" id="gn-{_e(nid)}" data-id="{_e(nid)}"{row} transform="translate({x:.0f},{y:.0f})">'
            f'<rect width="{NODE_W}" height="{NODE_H}" rx="{rx}" fill="{fill}"/>'
            f'<text x="6" y="{NODE_H - 7}">{_e(_label(style.label if style and style.label else op))}</text>{mark}'
            f'<title>{_e(tip)}</title></g>')


def _boxes(graph: EdgeGraph, lay: Layout, k: int, part_row: dict[str, int]) -> str:
    out = []
    on_page = [n for n in graph.nodes if n.partition and lay.placed.get(n.id) and lay.placed[n.id].page == k]
    for pid in dict.fromkeys(n.partition for n in on_page):
        xs = [_xy(lay, n.id)[:2] for n in on_page if n.partition == pid]
        x0, y0 = min(x for x, _ in xs) - 6, min(y for _, y in xs) - 16
        x1, y1 = max(x for x, _ in xs) + NODE_W + 6, max(y for _, y in xs) + NODE_H + 6
        row = part_row.get(pid or "")
        data = f' data-row="{row}"' if row is not None else ""
        out.append(f'<g class="gp"{data} data-part="{_e(pid)}"><rect x="{x0:.0f}" y="{y0:.0f}" '
                   f'width="{x1 - x0:.0f}" height="{y1 - y0:.0f}" rx="6"/><text x="{x0 + 6:.0f}" '
                   f'y="{y0 + 11:.0f}">{_e(pid)} (delegate)</text><title>delegate partition {_e(pid)}: click for '
                   f'its DELEGATE_CALL row</title></g>')
    return "".join(out)


def graph_html(graph: EdgeGraph, lay: Layout, styles: dict[str, NodeStyle], part_row: dict[str, int],
               legend: str) -> str:
    """The graph section: legend, page buttons (coloured by the worst node of each page), the SVG pages (the
    page of the first culprit shown first) and the node panel."""
    worst = [max((styles[n].rank for n in page if n in styles), default=0) for page in lay.pages]
    fills = [next((styles[n].fill for n in page if n in styles and styles[n].rank == worst[k]), "#fff")
             for k, page in enumerate(lay.pages)]
    first = next((lay.placed[n].page for n, s in styles.items() if s.culprit and n in lay.placed), 0)
    out = [legend]
    if len(lay.pages) > 1:
        out.append('<div class="pages" role="tablist">pages: ' + "".join(
            f'<button class="pg{" on" if k == first else ""}" data-page="{k}" title="{len(p)} nodes">{k + 1}'
            f'<i style="background:{fills[k]}"></i></button>' for k, p in enumerate(lay.pages)) + "</div>")
    out.append('<div class="gbox"><div class="gwrap">')
    for k in range(len(lay.pages)):
        hidden = "" if k == first else " hidden"
        out.append(f'<div class="gpage" data-page="{k}"{hidden}>{_page_svg(graph, lay, k, styles, part_row)}</div>')
    out.append('</div><div id="nodeinfo" class="panel">Click a node to see its row, source line and stack trace; '
               "click a row's # to find it in the graph.</div></div>")
    return "".join(out)
