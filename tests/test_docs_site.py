"""The docs site's own logic, without Sphinx (`make docs` builds it, outside `make test`): every
page in docs/ is in its table of contents (a page left out would fail the build), and links in the
README and the harness text still lead to the right page once they are read from docs/."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _conf():
    spec = importlib.util.spec_from_file_location("docs_conf", DOCS / "conf.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_page_is_in_the_table_of_contents():
    conf = _conf()
    listed = {
        line.strip() for line in conf.TOC.splitlines() if line.strip() and not line.startswith(("`", ":"))
    }
    pages = {p.stem for p in DOCS.glob("*.md")} - {"index"}
    assert pages == listed, f"docs/conf.py TOC: missing {pages - listed}, not a page {listed - pages}"


def test_links_are_read_from_docs():
    conf = _conf()
    readme = REPO / "README.md"
    text = (
        "[culling](docs/culling.md#the-arbiter) ![form](docs/images/first-hour-form.png) "
        "[site](https://jupyter.org/) [here](#layout)"
    )
    assert conf.relink(text, readme) == (
        "[culling](culling.md#the-arbiter) ![form](images/first-hour-form.png) "
        "[site](https://jupyter.org/) [here](#layout)"
    )
    # a page that links to the README or the harness text reaches the pages the site shows them as
    assert conf.relink("[a](../README.md#layout) [b](../tests/cluster/README.md)", DOCS / "usage.md") == (
        "[a](index.md#layout) [b](harness.md)"
    )
    harness = REPO / "tests" / "cluster" / "README.md"
    assert conf.relink("[k](../../docs/kubernetes.md)", harness) == "[k](kubernetes.md)"
