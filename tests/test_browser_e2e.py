"""A user logs in, picks a fraction on the spawn form, lands in JupyterLab and reads the
GPU environment inside a running kernel — in a real headless Chromium."""

from __future__ import annotations

import pytest

from tests.browser import browser_page, login, shot
from tests.hubtools import PASSWORD, Hub
from tests.support.wait import until

pytestmark = [pytest.mark.browser, pytest.mark.hub]


def wait_kernel_idle(hub: Hub, user: str, timeout: float = 90) -> None:
    """JupyterLab accepts typing before the kernel is ready; wait until it is idle and connected."""
    token = hub.user_token(user)

    def kernels() -> list:
        return hub.api("GET", f"/user/{user}/api/kernels", token=token)

    until(
        lambda: (k := kernels()) and k[0]["execution_state"] == "idle" and k[0]["connections"] > 0,
        "the kernel idle and connected",
        timeout=timeout,
        every=0.5,
        detail=kernels,
    )


def test_spawn_form_to_jupyterlab_kernel_sees_its_gpu_share(make_hub) -> None:
    hub: Hub = make_hub().start()
    with browser_page("e2e-spawn") as page:
        login(page, hub.url, "grace", PASSWORD)
        page.goto(f"{hub.url}/hub/spawn")
        form = page.locator(".gpupool-form")
        form.wait_for()
        assert "Your build quota: 1 GPU" in form.inner_text()
        assert "virtual" in form.inner_text()
        page.check('input[name="gpus"][value="0.25"]')
        shot(page, "e2e-1-spawn-form")
        page.click('#spawn_form button[type="submit"]')

        page.wait_for_url("**/user/grace/lab**", timeout=120_000)
        page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click(timeout=60_000)
        editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
        editor.wait_for(timeout=60_000)
        wait_kernel_idle(hub, "grace")
        shot(page, "e2e-2-jupyterlab")
        editor.click()
        page.keyboard.type(
            "import os; print('share', os.environ['GPUPOOL_GPU_FRACTION'],"
            " os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUPOOL_GPU_MEMORY_MIB'])"
        )
        page.keyboard.press("Shift+Enter")
        output = page.locator(".jp-OutputArea-output").first
        output.wait_for(timeout=60_000)
        shot(page, "e2e-3-kernel-output")
        gpu = next(s["gpu"] for s in hub.allocations() if s["owner"] == "grace")
        assert output.inner_text().strip() == f"share 0.25 {gpu} {4096 - 500}"  # less its CUDA context


def test_a_tampered_spawn_form_shows_the_refusal_and_starts_nothing(make_hub) -> None:
    hub: Hub = make_hub().start()
    hub.spawn("hopper", "0.5", server="exp1")
    with browser_page("e2e-refusal") as page:
        login(page, hub.url, "hopper", PASSWORD)
        page.goto(f"{hub.url}/hub/spawn/hopper/exp2")
        one_gpu = page.locator('input[name="gpus"][value="1"]')
        assert one_gpu.is_disabled()  # over the quota left: offered, but greyed out
        # tamper: re-enable the option in the page and submit it anyway
        one_gpu.evaluate("el => { el.disabled = false; el.checked = true; }")
        page.click('#spawn_form button[type="submit"]')
        error = page.locator(".spawn-error-msg")
        error.wait_for(timeout=30_000)
        shot(page, "e2e-4-refusal")
        assert "your build quota is 1 GPU and server 'exp1' holds 0.5 GPU" in error.inner_text()
        assert "stop it or choose a smaller fraction" in error.inner_text()
        # the re-rendered form counts every server and keeps the size that does not fit disabled
        assert "in use: 0.5 GPU; workspaces 1 of 2" in page.inner_text(".gpupool-quota")
        assert page.locator('input[name="gpus"][value="1"]').is_disabled()
    assert [(s["name"], s["milli"]) for s in hub.allocations()] == [("exp1", 500)]
    assert "exp2" not in hub.api("GET", "/hub/api/users/hopper")["servers"]
