"""Which notebook this kernel runs, as its Jupyter server knows it now (after any rename): the
server's sessions API by kernel id, then the notebook as last saved from its contents API."""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from .client import GPUPoolError

KERNEL_FILE = re.compile(r"kernel-([0-9a-fA-F-]{8,64})\.json$")


def kernel_id_from(connection_file: str) -> str:
    found = KERNEL_FILE.search(os.path.basename(connection_file or ""))
    if not found:
        raise GPUPoolError(f"cannot tell this kernel's id from {connection_file!r}: pass code=... or notebook=...")
    return found.group(1)


def session_path(sessions: Any, kernel_id: str) -> str:
    """The notebook path (relative to the server's root) of the session running `kernel_id`."""
    for s in sessions if isinstance(sessions, list) else []:
        if isinstance(s, dict) and (s.get("kernel") or {}).get("id") == kernel_id and s.get("path"):
            return str(s["path"])
    raise GPUPoolError("no notebook of this server runs this kernel (a console?): pass code=... or notebook=...")


def code_cells(nb: Mapping[str, Any], cells: Iterable[int] | None, leave_out: str = "") -> list[dict]:
    """The notebook's code cells without outputs: the chosen ones (0-based among code cells), and
    never the cell that asked (its source is `leave_out`): a job must not promote itself again."""
    code = [dict(c) for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    if cells is not None:
        wanted = list(cells)
        bad = [i for i in wanted if not 0 <= i < len(code)]
        if bad:
            raise GPUPoolError(f"code cells {bad} do not exist; the notebook has {len(code)}")
        code = [code[i] for i in wanted]

    def source(c: Mapping[str, Any]) -> str:
        s = c.get("source", "")
        return ("".join(s) if isinstance(s, list) else str(s)).strip()

    kept = [{**c, "outputs": [], "execution_count": None} for c in code
            if not (leave_out.strip() and source(c) == leave_out.strip())]
    if not kept:
        raise GPUPoolError("the notebook has no other code cell: save it with the code to promote")
    return kept


def _get(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read().decode())
    except urllib.error.HTTPError as err:
        raise GPUPoolError(f"the Jupyter server refused {url}: HTTP {err.code}", err.code) from None
    except (urllib.error.URLError, ValueError) as err:
        raise GPUPoolError(f"cannot ask the Jupyter server at {url}: {err}") from None


def current_notebook(connection_file: str, env: Mapping[str, str] | None = None) -> tuple[str, dict]:
    """(path, notebook JSON as last saved) of the notebook running this kernel."""
    env = os.environ if env is None else env
    server = env.get("JUPYTERHUB_SERVICE_URL", "")
    token = env.get("JUPYTERHUB_API_TOKEN", "") or env.get("JPY_API_TOKEN", "")
    if not server:
        raise GPUPoolError("this kernel does not run in a JupyterHub server (JUPYTERHUB_SERVICE_URL is not set):"
                           " pass code=... or notebook=...")
    base = server.rstrip("/") + "/"
    path = session_path(_get(base + "api/sessions", token), kernel_id_from(connection_file))
    model = _get(base + "api/contents/" + urllib.parse.quote(path) + "?type=notebook&content=1", token)
    return path, model.get("content") or {}
