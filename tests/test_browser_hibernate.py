"""Hibernation as a user lives it in JupyterLab, across a `make up` restart: a notebook's variable is
computed, "Hibernate now" saves it and stops the server, the hub is stopped and started again (as
Ctrl-C and `make up` do), and after the next start the notebook's next cell finds the variable,
with the kernel's note of what came back."""

from __future__ import annotations

import json

import pytest

from tests.browser import browser_page, login, shot
from tests.hubtools import PASSWORD, Hub
from tests.support.wait import until
from tests.test_culler_hub import CONFIG

pytestmark = [pytest.mark.browser, pytest.mark.hub]

CELLS = [
    "import numpy as np\nx = np.arange(1_000_000, dtype=np.float64)\nprint('computed', x.sum())",
    "print('after the restart', x.sum())",
]


def notebook() -> dict:
    return {
        "type": "notebook",
        "content": {
            "cells": [
                {"cell_type": "code", "source": src, "metadata": {}, "outputs": [], "execution_count": None}
                for src in CELLS
            ],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        },
    }


def run_cell(page, index: int, expect: str) -> str:
    """Run cell `index` as a user does (click into it, Shift+Enter); its output once it says `expect`."""
    # the notebook's kernel connected and idle first: a Shift+Enter before that runs nothing
    page.locator("#jp-main-statusbar").get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    output = cell.locator(".jp-OutputArea-output").filter(has_text=expect)
    output.first.wait_for(timeout=120_000)
    return cell.locator(".jp-OutputArea").inner_text()


def test_a_hibernated_notebook_gets_its_variables_back_after_a_make_up_restart(make_hub) -> None:
    # hibernation on for everyone (c.IdleCuller.hibernate): "Hibernate now" is offered and accepted
    hub: Hub = make_hub(CONFIG + "c.IdleCuller.hibernate = True\n", env={"GPUPOOL_CULLER": "0"}).start()
    hub.spawn("nora", "0.25")
    hub.api("PUT", "/user/nora/api/contents/work.ipynb", notebook(), token=hub.user_token("nora"))
    expected = float(sum(range(1_000_000)))
    with browser_page("lab-hibernate-restart") as page:
        login(page, hub.url, "nora", PASSWORD)
        page.goto(f"{hub.url}/user/nora/lab/tree/work.ipynb")
        assert f"computed {expected}" in run_cell(page, 0, "computed")
        item = page.locator("#jp-main-statusbar .gpupool-StatusItem")
        item.wait_for(timeout=60_000)
        item.click()
        page.locator(".jp-Dialog").get_by_role("button", name="Hibernate").click()
        page.locator(".Toastify__toast").filter(has_text="Hibernated 1 kernel").wait_for(timeout=120_000)
        until(lambda: not hub.allocations(), "the share freed by Hibernate now", timeout=60)
        shot(page, "lab-hibernate-1-saved")

        hub.stop()  # Ctrl-C on `make up`
        hub.start()  # and `make up` again, on the same state
        [row] = hub.api("GET", "/services/gpupool/api/admin/hibernated")["hibernated"]
        assert (row["owner"], row["kernels"]) == ("nora", 1), row  # the record survived the restart
        hub.spawn("nora", "0.25")
        page.goto(f"{hub.url}/user/nora/lab/tree/work.ipynb")  # the hub's cookie outlives its restart
        out = run_cell(page, 1, "after the restart")
        shot(page, "lab-hibernate-2-woken")
    # the kernel says what came back before the cell's own output, and the value is the one computed
    assert "gpupool: restored" in out and f"after the restart {expected}" in out, out
    assert out.index("gpupool: restored") < out.index("after the restart"), out
    assert json.dumps(out).count("Traceback") == 0, out
