"""The JSON of a hibernation, typed once for every process it crosses (stdlib only: the kernel, the
workspace's server and the culler import no hub code):

* the culler, or `%gpupool hibernate`, asks the workspace's server (`POST <server>/gpupool/hibernate`,
  gpupool.widgets.labserver) with a HibernateRequest; the server runs the saver in each kernel
  (gpupool.gpu.hibernate.save_json: one KernelSaved each) and answers a HibernateAnswer;
* what was saved goes to the hub as a SavedSummary: in the culler's report (culler_wire.ReportEvent)
  or, for a user's own hibernation, in a HibernationReport (`POST api/hibernated`); the hub keeps a
  HibernationRecord per server (gpupool.api.hibernation).

`answer_of` and `kernel_saved` read what another process sent: only well-formed parts are kept.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NotRequired, TypedDict

MAX_KERNELS = 1000  # kernels of one server: far over what one user opens
MAX_TEXT = 2000  # an error's or a path's text, as the pages show it
MAX_SKIPPED = 1000  # variables named as not kept, per kernel

# {"cap_bytes", "quota_bytes", "keep_days", "except": [kernel ids], "timeout_s"}, all optional
# ("except" is a Python keyword: the functional form)
HibernateRequest = TypedDict(
    "HibernateRequest",
    {"cap_bytes": int, "quota_bytes": int, "keep_days": int, "except": list[str], "timeout_s": int},
    total=False,
)


class KernelSaved(TypedDict):
    """One kernel's save, as gpupool.gpu.hibernate.save_shell reports it (`id`: added by the server)."""

    ok: bool
    error: NotRequired[str]  # why it was not saved (ok false)
    id: NotRequired[str]
    path: NotRequired[str]
    variables: NotRequired[int]
    skipped: NotRequired[dict[str, str]]  # variable -> why it was not kept
    bytes: NotRequired[int]
    seconds: NotRequired[float]
    kept: NotRequired[str]  # a kernel not woken yet keeps its earlier state: which
    notebook: NotRequired[str]


class HibernateAnswer(TypedDict):
    ok: bool  # every kernel saved
    kernels: NotRequired[list[KernelSaved]]
    bytes: NotRequired[int]
    error: NotRequired[str]  # the whole request failed (no server URL, no answer)


class SavedSummary(TypedDict):
    """What the hub keeps of a hibernation: the saved kernels' bytes, count and notebooks."""

    bytes: int
    kernels: int
    notebooks: list[str]


class HibernationReport(TypedDict):
    """`POST api/hibernated`: a user's own hibernation, recorded as the culler's is."""

    server: str
    hibernated: SavedSummary


class HibernationRecord(SavedSummary):
    """The hub's record of a server's last hibernation (`GET api/hibernated` lists them)."""

    owner: str
    name: str
    by: str  # "culler" or "user"
    at: float


class HibernationListed(HibernationRecord):
    expires: float | None  # when retention deletes the state (None: kept until woken)
    message: NotRequired[str]  # the record in the user's words


class RetentionWarning(TypedDict):
    name: str  # the server
    message: str


class HibernatedList(TypedDict):
    """`GET api/hibernated[?server=NAME]`: the caller's hibernated servers; JupyterLab's status, the
    hibernate-now page and `%gpupool` read it (gpupool.widgets.hibernation, .status)."""

    keep_days: float
    hibernated: list[HibernationListed]
    warnings: list[RetentionWarning]
    available: bool  # may the caller hibernate server NAME now
    off_message: str


def _text(value: object) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) else None


def _count(value: object) -> int | None:
    return value if type(value) is int and 0 <= value < 1 << 62 else None


def kernel_saved(item: object) -> KernelSaved | None:
    """One kernel's report as another process sent it: None when it is no object with `ok`; keys of
    a wrong type are dropped, text is cut."""
    if not isinstance(item, dict) or not isinstance(item.get("ok"), bool):
        return None
    out = KernelSaved(ok=item["ok"])
    if (text := _text(item.get("error"))) is not None:
        out["error"] = text
    if (text := _text(item.get("id"))) is not None:
        out["id"] = text
    if (text := _text(item.get("path"))) is not None:
        out["path"] = text
    if (text := _text(item.get("kept"))) is not None:
        out["kept"] = text
    if (text := _text(item.get("notebook"))) is not None:
        out["notebook"] = text
    if (n := _count(item.get("variables"))) is not None:
        out["variables"] = n
    if (n := _count(item.get("bytes"))) is not None:
        out["bytes"] = n
    seconds = item.get("seconds")
    if isinstance(seconds, int | float) and not isinstance(seconds, bool) and 0 <= seconds < 1e9:
        out["seconds"] = float(seconds)
    skipped = item.get("skipped")
    if isinstance(skipped, dict):
        out["skipped"] = {
            str(k)[:MAX_TEXT]: str(v)[:MAX_TEXT] for k, v in list(skipped.items())[:MAX_SKIPPED]
        }
    return out


def answer_of(body: object) -> HibernateAnswer:
    """A server's answer to a HibernateRequest, checked: an answer that is no object is a failure
    that says so; a kernel's report that is no KernelSaved is a kernel not saved (never left out:
    `%gpupool hibernate` stops the server only when every kernel was saved)."""
    if not isinstance(body, dict):
        return {"ok": False, "error": "its server's answer was not JSON"}
    out = HibernateAnswer(ok=body.get("ok") is True)
    kernels = body.get("kernels")
    if isinstance(kernels, list):
        out["kernels"] = [
            k if k is not None else KernelSaved(ok=False, error="its report could not be read")
            for k in map(kernel_saved, kernels[:MAX_KERNELS])
        ]
    if (n := _count(body.get("bytes"))) is not None:
        out["bytes"] = n
    if (text := _text(body.get("error"))) is not None:
        out["error"] = text
    return out


def saved_summary(kernels: Iterable[KernelSaved]) -> SavedSummary | None:
    """What the hub records of the kernels that were saved; None when none was."""
    saved = [k for k in kernels if k["ok"]]
    if not saved:
        return None
    return {
        "bytes": sum(k.get("bytes", 0) for k in saved),
        "kernels": len(saved),
        "notebooks": sorted({k["notebook"] for k in saved if "notebook" in k}),
    }
