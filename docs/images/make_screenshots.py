"""The README's screenshots of the first hour, taken from the hub `make up` starts as root.

    sudo .venv/bin/python docs/images/make_screenshots.py     # as root, from the repository

It runs `gpupool up --demo-culling` (tests/hubtools.Hub: make up's own command, accounts per
user, `jupyter-<name>`, the demo's culler service), drives Debian's Chromium with Playwright through
the log-in page, the spawn form, JupyterLab (as the user's own account) and a train job, then waits,
in real time as a user would (about 10 minutes), for the demo's culler to park the GPU, warn, and
stop the server, and writes:

    first-hour-form.png  the spawn form            first-hour-lab.png  JupyterLab as jupyter-<name>
    train-magic.png      %gpupool and %%train      demo-parked.png     the parked GPU, Resume
    demo-warning.png     the warning with Extend   home-stopped.png    the home page says why

The accounts it made are removed at the end.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

from tests.browser import browser_page, login  # noqa: E402
from tests.hubtools import PASSWORD, Hub  # noqa: E402
from tests.test_browser_e2e import wait_kernel_idle  # noqa: E402
from tests.test_browser_promote import run_cell  # noqa: E402

CONFIG = """
c.TrainPool.tick_s = 0.5
c.GPUParking.virtual_fixed_s = 0.05
c.GPUParking.virtual_per_gib_s = 0.0
"""
USER = "maya"


def save(page, name: str) -> None:
    page.wait_for_timeout(700)  # notifications finish sliding in
    page.screenshot(path=str(HERE / f"{name}.png"))
    print("wrote", HERE / f"{name}.png")


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit(
            "run as root: the screenshots show the hub make up starts as root (accounts per user)"
        )
    top = Path(tempfile.mkdtemp(prefix="gpupool-shots-"))
    hub = Hub(state=top / "state", extra_config=CONFIG, up_args=["--demo-culling"], account_prefix="jupyter-")
    hub.start()
    try:
        shoot(hub)
    finally:
        hub.cleanup()
        shutil.rmtree(top, ignore_errors=True)


def shoot(hub: Hub) -> None:
    with browser_page("screenshots") as page:
        login(page, hub.url, USER, PASSWORD)
        page.goto(f"{hub.url}/hub/spawn")
        page.locator(".gpupool-form").wait_for()
        page.check('input[name="gpus"][value="0.25"]')
        save(page, "first-hour-form")
        page.click('#spawn_form button[type="submit"]')
        page.wait_for_url(f"**/user/{USER}/lab**", timeout=120_000)
        page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click(timeout=60_000)
        page.locator(".jp-Notebook .jp-Cell .cm-content").first.wait_for(timeout=60_000)
        wait_kernel_idle(hub, USER)
        run_cell(page, 0, "%load_ext gpupool\n%gpupool")
        page.get_by_text("0.25 GPU = 4,096 MiB").first.wait_for(timeout=60_000)
        run_cell(page, 1, "!whoami")
        page.locator(".jp-OutputArea-output").filter(has_text=f"jupyter-{USER}").first.wait_for(
            timeout=30_000
        )
        page.wait_for_function(
            "document.querySelector('.gpupool-StatusItem')?.textContent.startsWith('GPU 0.25')",
            timeout=60_000,
        )
        save(page, "first-hour-lab")
        run_cell(
            page,
            2,
            "%%train --project default --gpus 1 --name squares -p n=12\n"
            "for i in range(n): print('step', i, 'loss', round(1 / (i + 1), 3))\n"
            "print('\\x1b[32mdone:\\x1b[0m sum of squares', sum(i * i for i in range(n)))",
        )
        monitor = page.locator(".jp-OutputArea-output").filter(has_text="Executed notebook").last
        monitor.wait_for(timeout=120_000)
        page.locator(".gpupool-log").last.scroll_into_view_if_needed()
        save(page, "train-magic")

        # the demo's culler, in real time: nobody said the GPU is busy, so 2 minutes after the
        # spawn it is parked
        parked = page.locator(".Toastify__toast").filter(has_text="parked")
        parked.wait_for(timeout=240_000)
        save(page, "demo-parked")
        parked.get_by_role("button", name="Resume").click()
        parked.wait_for(state="detached", timeout=60_000)
        hub.api(
            "POST",
            "/services/gpupool/api/demo/gpu-use",
            {"server": "", "busy": True},
            token=hub.user_token(USER),
        )
        # 4 minutes before the end of the 8-minute demo session, the culler warns
        page.locator(".Toastify__toast").filter(has_text="will stop in").wait_for(timeout=300_000)
        save(page, "demo-warning")
        hub.api(
            "POST",
            "/services/gpupool/api/demo/gpu-use",
            {"server": "", "busy": False},
            token=hub.user_token(USER),
        )
        deadline = time.monotonic() + 600  # not extended: stopped at the end of the session
        while hub.api("GET", f"/hub/api/users/{USER}")["servers"]:
            assert time.monotonic() < deadline, hub.tail()
            time.sleep(5)
        page.goto(f"{hub.url}/hub/home")
        page.locator(".gpupool-stopped").wait_for(timeout=30_000)
        save(page, "home-stopped")


if __name__ == "__main__":
    main()
