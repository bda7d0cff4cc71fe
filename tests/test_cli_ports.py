"""`gpupool up` (and so `make up ARGS=...`): every port is an option, with its environment
variable as the default, and reaches the hub's config through that variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.wiring.cli import accounts_note, build_parser, port_env
from gpupool.wiring.embedded import isolation


def test_ports_are_options_that_reach_the_embedded_config(monkeypatch) -> None:
    monkeypatch.setenv("GPUPOOL_API_PORT", "9095")
    args = build_parser().parse_args(
        ["up", "--port", "9000", "--hub-port", "9081", "--proxy-api-port", "9001"]
    )
    assert port_env(args) == {
        "GPUPOOL_PORT": "9000",
        "GPUPOOL_HUB_PORT": "9081",
        "GPUPOOL_PROXY_API_PORT": "9001",
        "GPUPOOL_API_PORT": "9095",
    }
    assert port_env(build_parser().parse_args(["up"]))["GPUPOOL_HUB_PORT"] == "8081"


@pytest.mark.parametrize("bad", ["0", "70000", "80a", "-1"])
def test_a_port_out_of_range_is_refused(bad: str, capsys) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", f"--api-port={bad}"])
    assert "not a port number" in capsys.readouterr().err


def test_up_says_plainly_whose_account_users_run_as(tmp_path: Path) -> None:
    assert "users share it" in accounts_note(1000, *isolation(str(tmp_path), euid=1000, spawner=""))
    assert "jupyter-<name>" in accounts_note(0, "accounts", "")
    # root, but the admin picked the shared spawner: said plainly, with the reason
    note = accounts_note(0, *isolation(str(tmp_path), euid=0, spawner="gpupool-simple"))
    assert "NOT isolated" in note and "GPUPOOL_SPAWNER" in note
    # root, but other accounts cannot reach the state folder: no accounts, and it says why
    hidden = tmp_path / "hidden"
    (hidden / "state").mkdir(parents=True)
    hidden.chmod(0o700)
    mode, why = isolation(str(hidden / "state"), euid=0, spawner="")
    assert mode == "shared" and "other accounts may not pass through" in why


def test_up_takes_the_users_python_environment(monkeypatch, tmp_path: Path) -> None:
    """--user-env (or $GPUPOOL_USER_ENV): where workspaces and jobs find Python and JupyterHub."""
    from gpupool.wiring.embedded import singleuser_command, user_python

    assert build_parser().parse_args(["up", "--user-env", "/opt/users"]).user_env == "/opt/users"
    monkeypatch.setenv("GPUPOOL_USER_ENV", str(tmp_path / "env"))
    assert build_parser().parse_args(["up"]).user_env == str(tmp_path / "env")
    assert user_python() == str(tmp_path / "env" / "bin" / "python")
    assert singleuser_command() == str(tmp_path / "env" / "bin" / "jupyterhub-singleuser")
    # an environment no other account can reach is named in the reason, and users share one account
    (tmp_path / "env" / "bin").mkdir(parents=True)
    (tmp_path / "env" / "bin" / "python").write_text("")
    tmp_path.chmod(0o700)
    mode, why = isolation(str(tmp_path), euid=0, spawner="")
    assert mode == "shared" and "--user-env" in why


def test_the_demo_banner_says_the_limits_the_admins_config_sets(tmp_path: Path) -> None:
    """`gpupool up --demo-culling --config site.py` with longer sessions: before, the banner
    still said "end at 8 min" whatever the config set."""
    from gpupool.wiring.cli import banner, check_config

    site = tmp_path / "site.py"
    site.write_text("c.IdleCuller.max_age_s = 1200\nc.IdleCuller.park_after_s = 300\n")
    said = banner(8000, "pw", "apw", str(tmp_path), True, "", check_config(str(site)))
    assert "parked after 5 min" in said and "warned at 16 min and end at 20 min" in said, said
    assert "end at 8 min" in banner(8000, "pw", "apw", str(tmp_path), True)  # the demo's own
