"""A root hub run from a clone in a private folder (root's home is 0700) still isolates its users.

The clone here is a real one as far as the accounts can tell: a 0700 folder holding gpupool's code
and a virtualenv (hard links of this checkout's, its editable install pointed at the copied code),
which the `jupyter-<name>` accounts cannot read. `gpupool up` must install the users' environment
in the system prefix (/opt/gpupool/<install key>) and run every workspace as its user's account
from there — before, it ran them as root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.hubtools import REPO, Hub, why_no_accounts

pytestmark = pytest.mark.hub

SOURCES = ("hub_ext", "spawner", "idle_culler", "widgets")


def private_clone(top: Path) -> Path:
    """A clone of gpupool inside the 0700 folder `top`: its venv's python."""
    top.mkdir(mode=0o700)
    clone = top / "gpupool"
    clone.mkdir()
    # hard links: the packages cost no copy; the files are the same, the folders are the clone's
    subprocess.run(["cp", "-a", "--link", str(REPO / ".venv"), str(clone / ".venv")], check=True)
    for name in SOURCES:
        shutil.copytree(
            REPO / name, clone / name, ignore=shutil.ignore_patterns("__pycache__", "node_modules")
        )
    for finder in (clone / ".venv").glob("lib/python*/site-packages/__editable___gpupool*finder.py"):
        text = finder.read_text()
        for name in SOURCES:
            text = text.replace(repr(str(REPO / name)), repr(str(clone / name)))
        finder.unlink()  # a hard link: write a file of the clone's own
        finder.write_text(text)
    return clone / ".venv" / "bin" / "python"


def test_a_clone_in_a_private_folder_runs_workspaces_as_accounts_from_the_system_prefix(
    tmp_path: Path,
) -> None:
    if why_no_accounts():
        pytest.skip(why_no_accounts())
    python = private_clone(tmp_path / "root-home")
    from gpupool.host.accounts import unreachable
    from gpupool.host.system_env import ROOT, install_key

    assert "other accounts may not pass through" in unreachable([str(python.parent.parent)])
    prefix = Path(ROOT) / install_key(str(python.parent.parent))
    hub = Hub(state=tmp_path / "state", python=str(python))
    try:
        hub.start()  # raises when the banner says users are not isolated (the old code: as root)
        hub.spawn("ada", "0.25")
        share = next(s for s in hub.allocations() if s["owner"] == "ada")
        proc = Path(f"/proc/{share['pid']}")
        uid = next(
            int(line.split()[1])
            for line in (proc / "status").read_text().splitlines()
            if line.startswith("Uid:")
        )
        assert uid == hub.account("ada").pw_uid != 0
        cmdline = (proc / "cmdline").read_bytes().decode().split("\0")
        assert cmdline[0].startswith(f"{prefix}/env/bin/"), cmdline
        env = dict(v.split("=", 1) for v in (proc / "environ").read_bytes().decode().split("\0") if "=" in v)
        assert env["PYTHONPATH"].startswith(f"{prefix}/"), env["PYTHONPATH"]  # the start-up hook
        # nothing the workspace runs or maps comes from the clone
        clone = str(tmp_path / "root-home")
        assert clone not in " ".join(cmdline)
        assert [k for k, v in env.items() if clone in v] == []
        assert clone not in (proc / "maps").read_text()
        hub_env = (Path(f"/proc/{hub.hub_pid()}") / "environ").read_bytes().split(b"\0")
        assert f"GPUPOOL_USER_PACKAGE={prefix}/site-packages/gpupool".encode() in hub_env  # wrap.py's
        assert (prefix / "site-packages" / "gpupool" / "runners" / "wrap.py").is_file()
        # the accounts read the prefix and cannot change it
        account = hub.account("ada")
        as_ada = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups"]
        for target in (
            prefix / "site-packages" / "gpupool" / "x",
            prefix / "env" / "bin" / "x",
            prefix / "y",
        ):
            done = subprocess.run([*as_ada, "touch", str(target)], capture_output=True, text=True)
            assert done.returncode != 0 and "Permission denied" in done.stderr, (target, done)
        st = os.stat(prefix / "site-packages" / "gpupool" / "__init__.py")
        assert st.st_uid == 0 and not st.st_mode & 0o022
        hub.stop_server("ada")
        hub.cleanup()
        # a change of the clone's code reaches the prefix at the next start
        wrap = tmp_path / "root-home" / "gpupool" / "hub_ext" / "runners" / "wrap.py"
        wrap.write_text(wrap.read_text() + "# changed\n")
        code = "from gpupool.host.system_env import ensure; print(ensure())"
        done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=300)
        assert done.stdout.strip() == str(prefix), done.stderr
        assert (
            (prefix / "site-packages" / "gpupool" / "runners" / "wrap.py").read_text().endswith("# changed\n")
        )
    finally:
        hub.cleanup()
        shutil.rmtree(prefix, ignore_errors=True)
        (prefix.parent / f".{prefix.name}.lock").unlink(missing_ok=True)
