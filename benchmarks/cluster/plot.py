"""A line chart as SVG text: no plotting library needed to draw the benchmark's week."""

from __future__ import annotations

from html import escape

COLOURS = ("#888888", "#1f77b4", "#d62728", "#2ca02c")


def svg_lines(
    series: dict[str, list[float]],
    title: str,
    xlabel: str,
    width: int = 900,
    height: int = 400,
    ymax: float = 100.0,
) -> str:
    left, right, top = 50, 20, 40
    bottom = 50 + 16 * len(series)  # one legend line per series
    w, h = width - left - right, height - top - bottom
    n = max((len(v) for v in series.values()), default=1)

    def xy(i: int, v: float) -> str:
        return f"{left + w * i / max(n - 1, 1):.1f},{top + h * (1 - min(v, ymax) / ymax):.1f}"

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif"'
        ' font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14">{escape(title)}</text>',
    ]
    for y in range(0, int(ymax) + 1, 20):
        py = top + h * (1 - y / ymax)
        parts.append(f'<line x1="{left}" y1="{py:.1f}" x2="{left + w}" y2="{py:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - 8}" y="{py + 4:.1f}" text-anchor="end">{y}</text>')
    for day in range(0, n // 24 + 1):
        px = left + w * day * 24 / max(n - 1, 1)
        parts.append(f'<line x1="{px:.1f}" y1="{top}" x2="{px:.1f}" y2="{top + h}" stroke="#eee"/>')
        parts.append(f'<text x="{px:.1f}" y="{top + h + 16}" text-anchor="middle">{day * 24}</text>')
    parts.append(f'<text x="{left + w / 2}" y="{top + h + 34}" text-anchor="middle">{escape(xlabel)}</text>')
    for k, (label, values) in enumerate(series.items()):
        colour = COLOURS[k % len(COLOURS)]
        points = " ".join(xy(i, v) for i, v in enumerate(values))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{points}"/>')
        ly = top + h + 44 + 16 * k
        parts.append(f'<rect x="{left}" y="{ly - 6}" width="12" height="4" fill="{colour}"/>')
        parts.append(f'<text x="{left + 16}" y="{ly}">{escape(label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
