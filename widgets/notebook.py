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

from gpupool.widgets.client import GPUPoolError

KERNEL_FILE = re.compile(r"kernel-([0-9a-fA-F-]{8,64})\.json$")


def kernel_id_from(connection_file: str) -> str:
    found = KERNEL_FILE.search(os.path.basename(connection_file or ""))
    if not found:
        raise GPUPoolError(
            f"cannot tell this kernel's id from {connection_file!r}: pass code=... or notebook=..."
        )
    return found.group(1)


def session_path(sessions: object, kernel_id: str) -> str:
    """The notebook path (relative to the server's root) of the session running `kernel_id`."""
    for s in sessions if isinstance(sessions, list) else []:
        if isinstance(s, dict) and (s.get("kernel") or {}).get("id") == kernel_id and s.get("path"):
            return str(s["path"])
    raise GPUPoolError(
        "no notebook of this server runs this kernel (a console?): pass code=... or notebook=..."
    )


def _source(c: Mapping[str, Any]) -> str:
    s = c.get("source", "")
    return ("".join(s) if isinstance(s, list) else str(s)).strip()


def promoted_cells(
    nb: Mapping[str, Any], cells: Iterable[int] | None, leave_out: str = ""
) -> tuple[list[dict[str, object]], str]:
    """The notebook's code cells a job gets, without outputs, and a line saying which: the chosen
    ones (0-based among code cells, shown 1-based), never the cell that asked (its source is
    `leave_out`) and never a `%%train` cell: a job must not promote itself again, and a %%train
    cell submits a job of its own."""
    code = [dict(c) for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    numbered = list(enumerate(code))
    if cells is not None:
        wanted = list(cells)
        bad = [i for i in wanted if not 0 <= i < len(code)]
        if bad:
            raise GPUPoolError(f"code cells {bad} do not exist; the notebook has {len(code)}")
        numbered = [(i, code[i]) for i in wanted]
    kept, skipped = [], []
    for i, c in numbered:
        if leave_out.strip() and _source(c) == leave_out.strip():
            skipped.append(f"{i + 1} (this cell)")
        elif _source(c).startswith("%%train"):
            skipped.append(f"{i + 1} (%%train: it submits a job of its own)")
        else:
            kept.append((i, {**c, "outputs": [], "execution_count": None}))
    if not kept:
        raise GPUPoolError(
            "the notebook has no other code cell to promote (%%train cells and this one are left"
            " out): save it with the code to promote"
        )
    which = ", ".join(str(i + 1) for i, _ in kept)
    note = f"code cell{'s' if len(kept) > 1 else ''} {which} of {len(code)}, as last saved"
    if skipped:
        note += "; left out: " + ", ".join(skipped)
    return [c for _, c in kept], note


def code_cells(
    nb: Mapping[str, object], cells: Iterable[int] | None, leave_out: str = ""
) -> list[dict[str, object]]:
    """The code cells a job gets (see promoted_cells)."""
    return promoted_cells(nb, cells, leave_out)[0]


def _get(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read().decode())
    except urllib.error.HTTPError as err:
        raise GPUPoolError(f"the Jupyter server refused {url}: HTTP {err.code}", err.code) from None
    except (urllib.error.URLError, ValueError) as err:
        raise GPUPoolError(f"cannot ask the Jupyter server at {url}: {err}") from None


def current_notebook(
    connection_file: str, env: Mapping[str, str] | None = None
) -> tuple[str, dict[str, object]]:
    """(path, notebook JSON as last saved) of the notebook running this kernel."""
    env = os.environ if env is None else env
    server = env.get("JUPYTERHUB_SERVICE_URL", "")
    token = env.get("JUPYTERHUB_API_TOKEN", "") or env.get("JPY_API_TOKEN", "")
    if not server:
        raise GPUPoolError(
            "this kernel does not run in a JupyterHub server (JUPYTERHUB_SERVICE_URL is not set):"
            " pass code=... or notebook=..."
        )
    base = server.rstrip("/") + "/"
    path = session_path(_get(base + "api/sessions", token), kernel_id_from(connection_file))
    model = _get(base + "api/contents/" + urllib.parse.quote(path) + "?type=notebook&content=1", token)
    return path, model.get("content") or {}
