"""What a workspace needs from the users' Python environment besides an interpreter: Jupyter's
config and data folders, where JupyterLab, gpupool's server extension and its lab extension are
switched on and kept.

Jupyter looks for them under the interpreter's prefix (`<prefix>/etc/jupyter`,
`<prefix>/share/jupyter`). The environment `gpupool up` makes for the accounts of a root hub
(gpupool.host.system_env, a venv of the system's Python) has a prefix of its own, so without them
its servers would start without JupyterLab: `/user/<name>/lab` is a 404. Checked at start.
"""

from __future__ import annotations

import json
import os
import subprocess

# Run with the users' Python: where Jupyter finds its switches and JupyterLab finds its extensions
_PROBE = """
import json, os
from jupyter_core.paths import jupyter_config_path, jupyter_path
def found(rel, paths):
    return any(os.path.exists(os.path.join(p, rel)) for p in paths)
conf = [os.path.join(p, "jupyter_server_config.d") for p in jupyter_config_path()]
print(json.dumps({
    "JupyterLab": found("jupyterlab.json", conf),
    "gpupool's server extension": found("gpupool.json", conf),
    "gpupool's lab extension": found(os.path.join("labextensions", "gpupool-lab", "package.json"), jupyter_path()),
}))
"""


def missing_jupyter(python: str) -> list[str]:
    """What a server started with `python` would lack of JupyterLab and gpupool's extensions, as
    any account sees it (no one's home config); [] when it has everything."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTHON"))}
    env["HOME"] = "/nonexistent"
    try:
        out = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, timeout=120, env=env, cwd="/"
        )
        found = json.loads(out.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return ["Jupyter itself (the probe could not run this Python)"]
    return [name for name, ok in found.items() if not ok]
