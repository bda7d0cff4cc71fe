"""Shared fixtures. Hub fixtures start a real JupyterHub + configurable-http-proxy."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hubtools import REPO, Hub
from tests.support.postgres import PostgresServer, store_url_fixture
from tests.support.postgres import unavailable as postgres_unavailable

ARTIFACTS = REPO / "test-artifacts"


def chp_available() -> bool:
    return (REPO / "node_modules" / ".bin" / "configurable-http-proxy").exists() or bool(
        shutil.which("configurable-http-proxy")
    )


def require_chp() -> None:
    if not chp_available():
        if os.environ.get("CI"):
            pytest.fail("configurable-http-proxy is missing in CI: run `make venv`")
        pytest.skip("configurable-http-proxy not installed (run `make venv`)")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """One hub per test module, with 4 virtual GPUs and default quotas."""
    require_chp()
    h = Hub(state=tmp_path_factory.mktemp("hub"))
    h.start()
    yield h
    h.cleanup()


@pytest.fixture
def make_hub(tmp_path: Path) -> Iterator:
    """Factory for hubs with their own config; all are stopped at the end of the test."""
    require_chp()
    hubs: list[Hub] = []

    def make(extra_config: str = "", **kw) -> Hub:
        h = Hub(state=tmp_path / f"hub{len(hubs)}", extra_config=extra_config, **kw)
        hubs.append(h)
        return h

    yield make
    for h in hubs:
        h.cleanup()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole run (Debian's package); each test makes its database."""
    why = postgres_unavailable()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI runs the store's tests on PostgreSQL too")
        pytest.skip(why)
    server = PostgresServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """gpupool's database as either of the hub databases it supports: a SQLite file or PostgreSQL."""
    return store_url_fixture(request, tmp_path)


def pytest_sessionfinish(session, exitstatus):
    """Every gpupool module was loaded once, under its gpupool name, through the whole run."""
    roots = tuple(str(REPO / f) + os.sep for f in ("hub_ext", "spawner", "idle_culler", "widgets"))
    import sys

    by_file: dict[str, list[str]] = {}
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if f and f.startswith(roots):
            by_file.setdefault(f, []).append(name)
    bad = {f: n for f, n in by_file.items() if len(n) > 1 or not n[0].startswith("gpupool")}
    if bad:
        session.config.get_terminal_writer().line(f"modules loaded under a second name: {bad}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
