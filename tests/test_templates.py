"""gpupool's own pages and fragments come from Jinja templates that escape every name: a user,
server, group, node pool or usage key chosen to be markup shows as text, never runs."""

from __future__ import annotations

from gpupool.admin.stacked import stacked_svg
from gpupool.hub.templating import TEMPLATES, render
from gpupool.pool import Holding
from gpupool.spawner.form import render_form

HOSTILE = "<script>alert('x')</script>\"'><img src=x onerror=alert(1)>"
ESCAPED = (
    "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;&quot;&#x27;&gt;&lt;img src=x onerror=alert(1)&gt;"
)


def assert_inert(html: str, times: int) -> None:
    assert "<script" not in html and "<img" not in html, html
    assert html.count(ESCAPED) == times, html


def test_the_spawn_form_escapes_server_pool_and_note_text() -> None:
    html = render_form(
        [(1000, True)], [Holding(HOSTILE, 500)], 2000, virtual=False, pools=["ws", HOSTILE], notes=[HOSTILE]
    )
    # the note, the held server's label, the pool list, the pool's value and its label
    assert_inert(html, 5)
    assert f'<input type="radio" name="pool" value="{ESCAPED}">' in html  # the attribute is not broken out of


def test_the_extend_page_escapes_the_server_name_warning_and_error() -> None:
    asked = render(
        "gpupool-extend.html", home="/hub/home", server=HOSTILE, warning=HOSTILE, error=None, xsrf="t"
    )
    assert_inert(asked, 3)  # the heading, the warning and the form's hidden field
    refused = render(
        "gpupool-extend.html", home="/hub/home", server=HOSTILE, warning="", error=HOSTILE, xsrf="t"
    )
    assert_inert(refused, 1)
    assert "<h1>Not extended</h1>" in refused and "gpupool-extend" not in refused


def test_the_usage_plot_escapes_each_key() -> None:
    svg = stacked_svg([HOSTILE, "ann"], {HOSTILE: [1.0, 2.0], "ann": [0.5, 0.5]}, 1_700_000_000, 600, 4)
    assert "<script" not in svg and "<img" not in svg
    assert f"data-key='{ESCAPED}'" in svg and f"<title>{ESCAPED}</title>" in svg


def test_gpupool_templates_mark_no_value_safe() -> None:
    # the hub renders the pages it serves (home, admin, usage) with its own autoescaping environment;
    # gpupool's own environment must escape what it renders too, whatever the template's name
    for template in TEMPLATES.glob("gpupool-*.html"):
        if template.name in ("gpupool-admin.html", "gpupool-usage.html"):
            continue  # extend the hub's page.html: rendered by JupyterHub
        src = template.read_text()
        assert "| safe" not in src and "|safe" not in src, f"{template.name} marks a value safe"
