"""gpupool's code as other accounts can read it, for root's tests that run jobs as `nobody` or
`daemon`.

A job's account runs the runner's wrapper (gpupool/runners/wrap.py) and gets the hub's PYTHONPATH.
From a checkout every account can reach (every folder above it searchable by others), that is the
checkout itself. From a clone in a private folder (root's home is 0700) the accounts can read none
of it, and the test would see jobs fail for a reason no hub has: a root `gpupool up` from such a
clone puts the users' environment under the system prefix (gpupool.host.system_env.ensure,
/opt/gpupool/<install key>) and takes the wrapper from there (GPUPOOL_USER_PACKAGE). These tests do
the same, with the same functions, so they run wherever the clone lives. The copy is kept by install
key, as the hub's is: a second build with the same code costs a hash of gpupool's files.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
SYSTEM_PYTHON = "/usr/bin/python3"  # readable by every account, unlike an interpreter under /root


def why_no_accounts(*names: str) -> str:
    """Why jobs cannot run here as the accounts `names` ("" when they can): the only reasons to
    skip. A private checkout is none of them (see users_code)."""
    if os.geteuid() != 0:
        return "needs root: only root runs a job as another account"
    for name in names:
        try:
            pwd.getpwnam(name)
        except KeyError:
            return f"needs the {name} account"
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"needs {SYSTEM_PYTHON}, which every account can run"
    return ""


def users_code(monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make jobs started from now on (in this test) take gpupool's files from a place their accounts
    can read: the checkout when they can reach it, else the users' environment in the system prefix,
    built or reused as `gpupool up` does. Returns the folder put on the jobs' PYTHONPATH.
    Where that environment cannot be made: a skip with the reason, a failure under CI=true."""
    from gpupool.host.accounts import unreachable

    if not unreachable([str(REPO)]):
        monkeypatch.setenv("PYTHONPATH", str(REPO))
        return REPO
    import gpupool.runners.local as local
    from gpupool.host.system_env import SystemEnvError, ensure
    from gpupool.wiring.cli import users_package

    try:
        package = Path(users_package(ensure()))
    except SystemEnvError as err:
        why = f"the checkout is private and the users' environment cannot be installed: {err}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    # the runner read GPUPOOL_USER_PACKAGE when it was imported (long before this test): its
    # wrapper path is set as a root `gpupool up` sets it before the import (jobs_wrapper_as_up)
    monkeypatch.setattr(local, "WRAPPER", str(package / "runners" / "wrap.py"))
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    assert not unreachable([local.WRAPPER]), unreachable([local.WRAPPER])
    return package.parent
