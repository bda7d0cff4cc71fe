"""Run code in a real kernel of a real single-user server, as JupyterLab does: an
execute_request over the kernel's websocket (through the proxy, with the user's token), the
kernel's printed output read back from its stream messages."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect


def run_code(hub: Any, user: str, token: str, kernel_id: str, code: str, timeout: float = 60) -> str:
    """What `code` printed (stdout), once the kernel is idle again; an error raises with its traceback."""
    return asyncio.run(asyncio.wait_for(_run(hub, user, token, kernel_id, code), timeout))


async def _run(hub: Any, user: str, token: str, kernel_id: str, code: str) -> str:
    url = f"ws://127.0.0.1:{hub.port}/user/{user}/api/kernels/{kernel_id}/channels"
    ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    msg_id, session = uuid.uuid4().hex, uuid.uuid4().hex
    ws.write_message(
        json.dumps(
            {
                "header": {
                    "msg_id": msg_id,
                    "msg_type": "execute_request",
                    "username": user,
                    "session": session,
                    "date": "",
                    "version": "5.3",
                },
                "parent_header": {},
                "metadata": {},
                "channel": "shell",
                "content": {
                    "code": code,
                    "silent": False,
                    "store_history": False,
                    "user_expressions": {},
                    "allow_stdin": False,
                    "stop_on_error": True,
                },
            }
        )
    )
    out: list[str] = []
    try:
        while True:
            raw = await ws.read_message()
            if raw is None:
                raise ConnectionError(f"the kernel's websocket closed; printed so far: {''.join(out)!r}")
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["header"]["msg_type"], msg["content"]
            if kind == "stream" and content.get("name") == "stdout":
                out.append(content["text"])
            elif kind == "error":
                raise RuntimeError("\n".join(content.get("traceback", [])) or content.get("evalue", ""))
            elif kind == "status" and content.get("execution_state") == "idle":
                return "".join(out)
    finally:
        ws.close()
