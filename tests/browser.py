"""Headless Chromium (Debian's package) driven by Playwright; never a downloaded browser."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str:
    path = os.environ.get("GPUPOOL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        if os.environ.get("CI"):
            pytest.fail("Debian chromium is missing in CI: `make browser` installs it")
        pytest.skip("chromium not installed (apt-get install chromium)")
    return path


@contextmanager
def browser_page(name: str) -> Iterator:
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        try:
            yield page
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / f"{name}-failure.png"))
            raise
        finally:
            browser.close()


def shot(page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def login(page, hub_url: str, user: str, password: str) -> None:
    page.goto(f"{hub_url}/hub/login")
    page.fill("input#username_input", user)
    page.fill("input#password_input", password)
    page.click("#login_submit")
    page.wait_for_url("**/hub/**")
