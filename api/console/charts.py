"""Server-rendered SVG charts (no JavaScript): usage per time bucket against a budget."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape


def _fmt(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:.1f}M"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:g}" if v == int(v) else f"{v:.2f}"


def bar_chart(points: Sequence[tuple[str, float]], *, title: str, unit: str = "",
              budget: float | None = None, cumulative: bool = False, width: int = 560, height: int = 150) -> Markup:
    """Bars per bucket; with ``cumulative`` a running-total line, and a red budget line if given."""
    pad_l, pad_b, pad_t = 44, 18, 16
    inner_w, inner_h = width - pad_l - 6, height - pad_b - pad_t
    values = [max(0.0, v) for _, v in points]
    running, total = [], 0.0
    for v in values:
        total += v
        running.append(total)
    top = max([*values, *(running if cumulative else []), budget or 0.0, 1.0])
    n = max(1, len(points))
    slot = inner_w / n
    parts = [f'<svg class="chart" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>',
             f'<text x="{pad_l}" y="11" class="chart-title">{escape(title)}</text>',
             f'<line x1="{pad_l}" y1="{pad_t + inner_h}" x2="{width - 6}" y2="{pad_t + inner_h}" class="axis"/>',
             f'<text x="{pad_l - 4}" y="{pad_t + 8}" text-anchor="end" class="tick">{_fmt(top)}{escape(unit)}</text>',
             f'<text x="{pad_l - 4}" y="{pad_t + inner_h}" text-anchor="end" class="tick">0</text>']

    def y(v: float) -> float:
        return pad_t + inner_h - inner_h * (v / top)

    for i, ((label, _), v) in enumerate(zip(points, values, strict=True)):
        x = pad_l + i * slot
        h = inner_h * (v / top)
        parts.append(f'<rect x="{x + slot * 0.1:.1f}" y="{y(v):.1f}" width="{max(1.0, slot * 0.8):.1f}" '
                     f'height="{h:.1f}" class="bar"><title>{escape(label)}: {_fmt(v)}{escape(unit)}</title></rect>')
    if points:
        step = max(1, n // 6)
        for i in range(0, n, step):
            parts.append(f'<text x="{pad_l + i * slot + slot / 2:.1f}" y="{height - 4}" text-anchor="middle" '
                         f'class="tick">{escape(points[i][0])}</text>')
    if cumulative and points:
        path = " ".join(f"{pad_l + i * slot + slot / 2:.1f},{y(v):.1f}" for i, v in enumerate(running))
        parts.append(f'<polyline points="{path}" class="running"><title>running total {_fmt(total)}</title></polyline>')
    if budget is not None:
        parts.append(f'<line x1="{pad_l}" y1="{y(budget):.1f}" x2="{width - 6}" y2="{y(budget):.1f}" class="budget"/>'
                     f'<text x="{width - 8}" y="{y(budget) - 3:.1f}" text-anchor="end" class="budget-label">'
                     f'budget {_fmt(budget)}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
