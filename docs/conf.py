"""Sphinx configuration of the docs site (`make docs`): the Markdown in docs/ read with MyST, the
README as the first page and the test harness's README as a page of its own. Warnings are errors
(`-W` in the Makefile), so a link to a page or a heading that does not exist, or a page in no
table of contents, fails the build."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

DOCS = Path(__file__).resolve().parent
REPO = DOCS.parent

project = "gpupool"
author = "gpupool contributors"
release = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
copyright = "gpupool contributors (BSD-3-Clause)"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "sample-trace"]
# GitHub's heading anchors (README.md#one-hub-for-...) resolve as they do on GitHub
myst_heading_anchors = 6
html_theme = "alabaster"
html_title = f"gpupool {release}"

# pages of the site that show a file outside docs/ (their stubs in docs/ only point to it): the
# file's text is read as the page's, with its links re-expressed from docs/, so the same Markdown
# reads right on GitHub and here
PAGES = {"index": "README.md", "harness": "tests/cluster/README.md"}
SITE = {path: page + ".md" for page, path in PAGES.items()}
TOC = """

```{toctree}
:hidden:

usage
configuration
options
culling
placement
training
benchmarks
kubernetes
chart-values
security
harness
```
"""
LINK = re.compile(r"(\]\()([^)\s]+)\)")


def relink(text: str, origin: Path) -> str:
    """Each relative link in `text` (a file at `origin`) as a link from docs/: a page the site
    shows under another name (README.md: index) by that name."""

    def fix(match: re.Match) -> str:
        target = match.group(2)
        if re.match(r"[a-z]+:|#", target):
            return match.group(0)
        path, hash_, anchor = target.partition("#")
        resolved = (origin.parent / path).resolve()
        try:
            new = SITE[resolved.relative_to(REPO).as_posix()]
        except (KeyError, ValueError):
            new = os.path.relpath(resolved, DOCS)
        return f"{match.group(1)}{new}{hash_}{anchor})"

    return LINK.sub(fix, text)


def _read(app, docname: str, source: list[str]) -> None:
    if docname in PAGES:
        origin = REPO / PAGES[docname]
        source[0] = origin.read_text() + (TOC if docname == "index" else "")
    else:
        origin = DOCS / f"{docname}.md"
    source[0] = relink(source[0], origin)


def setup(app) -> None:
    app.connect("source-read", _read)
