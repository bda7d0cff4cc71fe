"""The usage page's stacked plot: GPUs allocated over time, one band per key, as inline SVG.
Pure: the report's series in, markup out (every name escaped)."""

from __future__ import annotations

import time
from html import escape

COLOURS = ("#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363", "#9ecae1", "#fdae6b", "#a1d99b", "#bcbddc",
           "#d6616b")
MAX_BANDS = 9  # the rest are one band, "others"


def stacked_svg(keys: list[str], gpus: dict[str, list[float]], start: int, step: int, capacity: float,
                width: int = 760, height: int = 260) -> str:
    """Stacked bands of the average GPUs each key held per bucket, under the pool's capacity."""
    pad_l, pad_r, pad_t, pad_b = 44, 150, 16, 34
    n = max((len(v) for v in gpus.values()), default=0)
    if n == 0 or not keys:
        return "<p class='gpupool-noplot'>Nothing was allocated in this period.</p>"
    shown = keys[:MAX_BANDS]
    bands = {k: gpus[k] for k in shown}
    rest = keys[MAX_BANDS:]
    if rest:
        bands["others"] = [sum(gpus[k][i] for k in rest) for i in range(n)]
    top = max(capacity, max(sum(b[i] for b in bands.values()) for i in range(n)), 1e-9)
    w, h = width - pad_l - pad_r, height - pad_t - pad_b

    def x(i: float) -> float:
        return pad_l + i / n * w

    def y(v: float) -> float:
        return pad_t + h - v / top * h

    below = [0.0] * n
    parts = []
    for k, (name, values) in enumerate(bands.items()):
        upper = [below[i] + values[i] for i in range(n)]
        # each bucket is a flat step: two points per bucket, so a bucket's area is its GPU-hours
        pts = [f"{x(i + e):.1f},{y(upper[i]):.1f}" for i in range(n) for e in (0, 1)]
        pts += [f"{x(i + e):.1f},{y(below[i]):.1f}" for i in reversed(range(n)) for e in (1, 0)]
        colour = COLOURS[k % len(COLOURS)]
        parts.append(f"<polygon class='band' data-key='{escape(name, quote=True)}' fill='{colour}' fill-opacity='0.85'"
                     f" stroke='none' points='{' '.join(pts)}'><title>{escape(name)}</title></polygon>")
        parts.append(f"<rect x='{width - pad_r + 10}' y='{pad_t + 16 * k}' width='10' height='10' fill='{colour}'/>"
                     f"<text class='legend' x='{width - pad_r + 24}' y='{pad_t + 16 * k + 9}' font-size='11'>"
                     f"{escape(name[:22])}</text>")
        below = upper
    cap = (f"<line class='capacity' x1='{pad_l}' x2='{pad_l + w}' y1='{y(capacity):.1f}' y2='{y(capacity):.1f}'"
           f" stroke='#000' stroke-dasharray='4 3'/><text x='{pad_l + 4}' y='{y(capacity) - 3:.1f}' font-size='10'>"
           f"capacity {capacity:g} GPUs</text>") if capacity else ""
    ticks = "".join(
        f"<text x='{pad_l - 6}' y='{y(top * f) + 4:.1f}' text-anchor='end' font-size='11'>{top * f:.3g}</text>"
        for f in (0, 0.5, 1))
    fmt = "%H:%M" if n * step <= 2 * 86400 else "%b %d"
    ticks += "".join(
        f"<text class='time-tick' x='{x(n * f):.1f}' y='{height - pad_b + 16}' text-anchor='middle' font-size='11'>"
        f"{time.strftime(fmt, time.localtime(start + n * step * f))}</text>" for f in (0, 0.25, 0.5, 0.75, 1))
    return (f"<svg class='gpupool-usage-plot' width='{width}' height='{height}' role='img'"
            f" aria-label='GPUs allocated over time, stacked'>"
            f"<rect x='{pad_l}' y='{pad_t}' width='{w}' height='{h}' fill='#f7f7f7'/>{''.join(parts)}{cap}{ticks}"
            f"<text x='{pad_l}' y='{height - 4}' font-size='11'>GPUs held on average per"
            f" {step // 60 if step < 3600 else step // 3600} {'min' if step < 3600 else 'h'}</text></svg>")
