"""Where a root hub keeps its state when its clone is private (gpupool.host.system_env)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from gpupool.host.system_env import default_state, install_key


def test_a_root_hub_in_a_private_folder_keeps_its_state_in_the_system_state_folder() -> None:
    # not pytest's tmp_path: its parents are 0700 themselves
    with tempfile.TemporaryDirectory() as top:
        Path(top).chmod(0o755)
        home = Path(top) / "root-home"
        clone = home / "gpupool"
        clone.mkdir(parents=True)
        home.chmod(0o700)
        system = f"{top}/var-lib"
        assert default_state(str(clone), euid=0, state_root=system) == f"{system}/{install_key()}/state"
        # not root: there are no accounts to reach it; a folder they can pass through: ./state as before
        assert default_state(str(clone), euid=1000, state_root=system) == f"{clone}/state"
        home.chmod(0o755)
        assert default_state(str(clone), euid=0, state_root=system) == f"{clone}/state"


def test_a_root_hub_that_cannot_isolate_refuses_to_start_and_says_why(tmp_path: Path, monkeypatch) -> None:
    from gpupool.wiring.cli import refuse_root_without_accounts

    if os.geteuid() != 0:
        pytest.skip("only a root hub switches accounts")
    monkeypatch.delenv("GPUPOOL_SPAWNER", raising=False)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(SystemExit) as refused:
        refuse_root_without_accounts(str(private / "state"))  # homes the accounts cannot reach
    assert "will not run workspaces as root" in str(refused.value)
    assert "other accounts may not pass through" in str(refused.value)
    monkeypatch.setenv("GPUPOOL_SPAWNER", "gpupool-simple")  # an admin's choice of one shared account
    refuse_root_without_accounts(str(private / "state"))
