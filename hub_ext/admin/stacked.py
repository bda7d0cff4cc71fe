"""The usage page's stacked plot: GPUs allocated over time, one band per key, as inline SVG.
Pure: the report's series in, markup out: templates/gpupool-usage-plot.html, which escapes every name."""

from __future__ import annotations

import time

from gpupool.hub.templating import render

COLOURS = (
    "#3182bd",
    "#e6550d",
    "#31a354",
    "#756bb1",
    "#636363",
    "#9ecae1",
    "#fdae6b",
    "#a1d99b",
    "#bcbddc",
    "#d6616b",
)
MAX_BANDS = 9  # the rest are one band, "others"


def stacked_svg(
    keys: list[str],
    gpus: dict[str, list[float]],
    start: int,
    step: int,
    capacity: float,
    width: int = 760,
    height: int = 260,
) -> str:
    """Stacked bands of the average GPUs each key held per bucket, under the pool's capacity
    (templates/gpupool-usage-plot.html draws them)."""
    pad_l, pad_r, pad_t, pad_b = 44, 150, 16, 34
    n = max((len(v) for v in gpus.values()), default=0)
    if n == 0 or not keys:
        return render("gpupool-usage-plot.html", bands=[])
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
    drawn = []
    for k, (name, values) in enumerate(bands.items()):
        upper = [below[i] + values[i] for i in range(n)]
        # each bucket is a flat step: two points per bucket, so a bucket's area is its GPU-hours
        pts = [f"{x(i + e):.1f},{y(upper[i]):.1f}" for i in range(n) for e in (0, 1)]
        pts += [f"{x(i + e):.1f},{y(below[i]):.1f}" for i in reversed(range(n)) for e in (1, 0)]
        drawn.append({"name": name, "colour": COLOURS[k % len(COLOURS)], "points": " ".join(pts)})
        below = upper
    fmt = "%H:%M" if n * step <= 2 * 86400 else "%b %d"
    return render(
        "gpupool-usage-plot.html",
        bands=drawn,
        width=width,
        height=height,
        left=pad_l,
        top=pad_t,
        bottom=pad_b,
        w=w,
        h=h,
        legend_x=width - pad_r + 10,
        capacity=f"{capacity:g}" if capacity else "",
        capacity_y=f"{y(capacity):.1f}",
        capacity_label_y=f"{y(capacity) - 3:.1f}",
        y_ticks=[(f"{y(top * f) + 4:.1f}", f"{top * f:.3g}") for f in (0, 0.5, 1)],
        x_ticks=[
            (f"{x(n * f):.1f}", time.strftime(fmt, time.localtime(start + n * step * f)))
            for f in (0, 0.25, 0.5, 0.75, 1)
        ],
        per=f"{step // 60} min" if step < 3600 else f"{step // 3600} h",
    )
