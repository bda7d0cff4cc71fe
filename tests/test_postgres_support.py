"""The tests' PostgreSQL server dies with the test run, however the run dies: a CI timeout or a
`kill -9` of pytest must not leave a postmaster running (and its folder in /tmp) on the machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.postgres import unavailable
from tests.support.wait import until

pytestmark = pytest.mark.skipif(bool(unavailable()), reason=unavailable() or "ok")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie of another parent counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[-1].split()[0] != "Z"


def test_a_killed_test_run_leaves_no_postgres_server_behind() -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from tests.support.postgres import PostgresServer
        s = PostgresServer()
        s.start()
        print(s.data, s.root, flush=True)
        time.sleep(600)  # killed by the test long before
        """
    )
    run = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent
    )
    assert run.stdout is not None
    data, root = run.stdout.readline().split()
    pid = int(Path(data, "postmaster.pid").read_text().split()[0])
    assert _alive(pid)
    run.send_signal(signal.SIGKILL)  # no finalizer, no atexit: only the kernel closes its files
    run.wait()
    until(lambda: not _alive(pid), "the postmaster to stop once its starter was killed", timeout=60)
    until(lambda: not Path(root).exists(), "the server's folder to be removed", timeout=30)
