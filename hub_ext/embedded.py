"""Helpers for the embedded hub's config (kept out of the config file so they are testable)."""

from __future__ import annotations

import os
import secrets
import shutil

from traitlets.config import Config, PyFileConfigLoader


def demo_password(state_dir: str) -> str:
    """A random password kept in the state folder, so `make up` can print it."""
    path = os.path.join(state_dir, "demo-password")
    if env := os.environ.get("GPUPOOL_DEMO_PASSWORD"):
        return env
    if not os.path.exists(path):
        os.makedirs(state_dir, exist_ok=True)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(secrets.token_urlsafe(9))
    with open(path) as f:
        return f.read().strip()


def load_user_config(c: Config, path: str) -> None:
    """Merge an admin's gpupool config file into `c`; a broken file stops the hub with
    the file and the error, not a half-configured pool."""
    if not path:
        return
    if not os.path.isfile(path):
        raise SystemExit(f"gpupool: config file not found: {path}")
    loader = PyFileConfigLoader(os.path.basename(path), os.path.dirname(os.path.abspath(path)))
    try:
        c.merge(loader.load_config())
    except Exception as err:  # noqa: BLE001 - any error in the admin's file is reported the same way
        raise SystemExit(f"gpupool: cannot load {path}: {err}") from None


def chp_command() -> str:
    """configurable-http-proxy: on PATH, or the one `make` installed in ./node_modules."""
    found = os.environ.get("GPUPOOL_CHP") or shutil.which("configurable-http-proxy")
    if found:
        return found
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for root in (os.getcwd(), repo):
        candidate = os.path.join(root, "node_modules", ".bin", "configurable-http-proxy")
        if os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit("gpupool: configurable-http-proxy not found: run `make up` (installs it with npm)"
                     " or `npm install -g configurable-http-proxy`")
