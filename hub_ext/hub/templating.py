"""gpupool's own Jinja environment, for the HTML that JupyterHub's does not render: the spawn
form (a spawner's `options_form` is HTML, as in kubespawner), the gpupool service's pages and the
inline SVG plots that the hub's pages include. Pages served by the hub itself (home, admin,
usage) go through JupyterHub's `render_template` with hub_ext/templates on its template_paths.

Every value is escaped unless the code marks it `Markup`: a user, group, server or node pool
name can never become markup.
"""

from __future__ import annotations

from functools import cache
from html import escape
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

TEMPLATES = Path(__file__).parent.parent / "templates"  # package data: gpupool/templates/*.html


def _escaped(value: object) -> object:
    """Escape text as the standard library does (&#x27; for a quote, where markupsafe writes
    &#39;), so pages read the same as when they were written by hand; Markup passes through."""
    return Markup(escape(value)) if isinstance(value, str) and not isinstance(value, Markup) else value


@cache
def environment() -> Environment:
    return Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        finalize=_escaped,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(name: str, **values: object) -> str:
    """One of gpupool's templates, rendered (a hub page that includes it marks it `| safe`)."""
    return environment().get_template(name).render(**values)
