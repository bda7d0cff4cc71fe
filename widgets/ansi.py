"""A job's log as HTML: terminal colours (ANSI SGR codes, as tracebacks and progress bars print
them) become styled spans, every other escape sequence is dropped, and the text is escaped."""

from __future__ import annotations

import re
from html import escape

# CSI sequences (colours, cursor moves, erases) and the few two-character escapes
ESCAPE = re.compile(r"\x1b\[([0-9;?]*)([@-~])|\x1b[@-Z\\-_]")
COLOURS = ["#000", "#c33", "#2a2", "#b80", "#26c", "#a3a", "#1aa", "#bbb"]
BRIGHT = ["#666", "#e55", "#3c3", "#db2", "#48e", "#c5c", "#3cc", "#fff"]


def _style(codes: list[int], state: dict[str, str]) -> None:
    i = 0
    while i < len(codes):
        c = codes[i]
        if c == 0:
            state.clear()
        elif c == 1:
            state["font-weight"] = "bold"
        elif c == 22:
            state.pop("font-weight", None)
        elif 30 <= c <= 37:
            state["color"] = COLOURS[c - 30]
        elif 90 <= c <= 97:
            state["color"] = BRIGHT[c - 90]
        elif c == 39:
            state.pop("color", None)
        elif 40 <= c <= 47:
            state["background"] = COLOURS[c - 40]
        elif 100 <= c <= 107:
            state["background"] = BRIGHT[c - 100]
        elif c == 49:
            state.pop("background", None)
        elif c in (38, 48) and i + 1 < len(codes):  # 256 colours and RGB: skip their arguments
            i += 4 if codes[i + 1] == 2 else 2
        i += 1


def ansi_html(text: str) -> str:
    """`text` with its colours as <span style=...>, safe to put in a page."""
    out: list[str] = []
    state: dict[str, str] = {}
    pos = 0

    def emit(chunk: str) -> None:
        if not chunk:
            return
        body = escape(chunk)
        if state:
            style = ";".join(f"{k}:{v}" for k, v in sorted(state.items()))
            body = f"<span style='{style}'>{body}</span>"
        out.append(body)

    for m in ESCAPE.finditer(text):
        emit(text[pos : m.start()])
        pos = m.end()
        if m.group(2) == "m":
            codes = [int(x) for x in m.group(1).split(";") if x.isdigit()] or [0]
            _style(codes, state)
    emit(text[pos:])
    return "".join(out)


def log_box(lines: list[str], height: str = "14em") -> str:
    """The log tail in a scrolling box (class gpupool-log). gpupool's JupyterLab extension keeps
    it scrolled to its last line as lines come, unless the reader scrolled up: a failure's error
    is in view, not below the fold."""
    body = ansi_html("\n".join(lines)) or "<i style='color:#777'>no output yet</i>"
    return (
        f"<div class='gpupool-log' style='max-height:{height};overflow:auto;"
        "border:1px solid var(--jp-border-color2,#ccc);padding:4px'>"
        f"<pre style='margin:0;white-space:pre-wrap;font-size:90%'>{body}</pre></div>"
    )
