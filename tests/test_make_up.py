"""`gpupool up` (what `make up` runs): the log-in banner comes last, once the hub answers, and the
start-up log has no deprecation noise; SIGTERM stops the hub with it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.hubtools import REPO, free_port
from tests.support.wait import until

pytestmark = pytest.mark.hub


def test_banner_last_after_the_hub_is_ready_and_no_deprecation_noise(tmp_path: Path) -> None:
    port = free_port()
    env = dict(
        os.environ,
        GPUPOOL_HUB_PORT=str(free_port()),
        GPUPOOL_API_PORT=str(free_port()),
        GPUPOOL_PROXY_API_PORT=str(free_port()),
        GPUPOOL_CULLER="0",
        PATH=f"{REPO / 'node_modules' / '.bin'}{os.pathsep}{Path(sys.executable).parent}"
        f"{os.pathsep}{os.environ.get('PATH', '')}",
    )
    env.pop("GPUPOOL_DEMO_PASSWORD", None)
    # as root the users' accounts pass through to their homes in <state>/home: a state folder they
    # can reach, as `make up`'s ./state is in a shared clone (pytest's own tmp folder is 0700, and
    # gpupool up refuses to run workspaces as root rather than start there)
    top = Path(tempfile.mkdtemp(prefix="gpupool-up-"))
    top.chmod(0o711)
    state = top / "state"
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpupool.wiring.cli",
                "up",
                "--state",
                str(state),
                "--port",
                str(port),
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            return "gpupool: embedded hub ready" in log.read_text()

        until(ready, "make up's banner", timeout=120, detail=log.read_text)
        text = log.read_text()
        assert text.index("JupyterHub is now running") < text.index("gpupool: embedded hub ready")
        password = (state / "demo-password").read_text().strip()
        assert f"log in with any user name and the password: {password}" in text
        assert oct((state / "demo-password").stat().st_mode & 0o777) == "0o600"
        assert "deprecat" not in text.lower(), [line for line in text.splitlines() if "eprecat" in line]
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            shutil.rmtree(top, ignore_errors=True)
    assert proc.returncode is not None
