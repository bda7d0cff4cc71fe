"""Where a root hub keeps its state when its clone is private (gpupool.host.system_env)."""

from __future__ import annotations

import tempfile
from pathlib import Path

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
