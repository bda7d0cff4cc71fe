"""Widget refreshes that are not user activity.

A widget that reads the API again by itself (`WorkspaceStatus`, `JobMonitor`) sends its new values
to the browser as comm messages on the kernel's IOPub channel, and the Jupyter server counts IOPub
messages as kernel activity; the hub then sees someone at work, and the idle culler never finds
Jupyter quiet (each warning the widget showed moved the stop again). The server counts a message
unless both its type and its parent's type are in `MappingKernelManager.untracked_message_types`:
updates sent inside `background()` get a parent of type `gpupool_refresh`, and gpupool's server
extension adds that type and `comm_msg` to the list. A comm message sent while a cell runs (its
parent an execute request) still counts, and so does every message a click in a widget causes (the
kernel reports itself busy for it).

What travels through the hub's proxy is counted there too: with the notebook open in a browser
tab, the proxy sees the updates. `%gpupool` therefore refreshes in the browser instead (gpupool's
JupyterLab extension, only while the tab is visible); these threads are for widgets in code.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

REFRESH = "gpupool_refresh"  # the parent message type of a background refresh
UNTRACKED = ("comm_msg", REFRESH)  # what gpupool's server extension adds to untracked_message_types


def _parent_var() -> ContextVar[Any] | None:
    """The kernel's current-parent variable (ipykernel >= 7 keeps it per context, so a thread
    may have its own); None outside a kernel or with a kernel that keeps it otherwise."""
    try:
        from ipykernel.kernelbase import Kernel
    except ImportError:
        return None
    if not Kernel.initialized():
        return None
    var = getattr(Kernel.instance(), "_shell_parent", None)
    return var if isinstance(var, ContextVar) else None


def refresh_parent() -> dict[str, Any]:
    header = {
        "msg_id": uuid.uuid4().hex,
        "msg_type": REFRESH,
        "session": "gpupool",
        "username": "gpupool",
        "date": dt.datetime.now(dt.UTC).isoformat(),
        "version": "5.3",
    }
    return {
        "header": header,
        "msg_id": header["msg_id"],
        "msg_type": REFRESH,
        "parent_header": {},
        "metadata": {},
        "content": {},
    }


@contextmanager
def background() -> Iterator[None]:
    """Messages this thread sends inside the block are not user activity. Call it only in a
    thread of your own: the parent it sets holds for the current context alone."""
    var = _parent_var()
    if var is None:
        yield
        return
    token = var.set(refresh_parent())
    try:
        yield
    finally:
        var.reset(token)


def untrack(kernel_manager: Any) -> None:
    """Let a Jupyter server's kernel manager ignore background refreshes (server extension)."""
    types = getattr(kernel_manager, "untracked_message_types", None)
    if isinstance(types, list | tuple):
        kernel_manager.untracked_message_types = [*types, *(t for t in UNTRACKED if t not in types)]
