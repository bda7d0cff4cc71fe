"""No secret in the hub's log: tokens (in a URL's query, an Authorization header), cookies and
passwords are replaced by "[secret]" in every record that reaches the hub's log handlers.

A filter on each handler of the hub's loggers (JupyterHub's, tornado's access and application logs,
gpupool's own, and the root logger's): a record is rewritten once, before it is formatted, whoever
logged it.
"""

from __future__ import annotations

import logging
import re

HIDDEN = "[secret]"
_QUERY = re.compile(
    r"(?i)([?&;](?:token|access_token|api_token|_xsrf|code|password|passwd|secret|key"
    r"|auth|authorization|session_id)=)[^&\s\"'#]+"
)
_HEADER = re.compile(
    r"(?i)((?:authorization|x-xsrftoken|x-csrftoken)['\"]?\s*[:=]\s*['\"]?"
    r"(?:(?:token|bearer|basic)\s+)?)[^\s'\",}]+"
)
_COOKIE = re.compile(r"(?i)((?:cookie|set-cookie)['\"]?\s*[:=]\s*['\"]?)[^\n'\"}]+")
_PAIR = re.compile(
    r"(?i)(['\"]?(?:password|passwd|api_token|token|secret)['\"]?\s*[:=]\s*['\"]?)"
    r"(?!\[secret\])[^\s'\",}&]{4,}"
)


def redact(text: str) -> str:
    for pattern in (_QUERY, _HEADER, _COOKIE, _PAIR):
        text = pattern.sub(lambda m: m.group(1) + HIDDEN, text)
    return text


class Redact(logging.Filter):
    """Rewrites a record's message with its secrets hidden (args merged in first)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logged as it is
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


LOGGERS = (
    "",
    "JupyterHub",
    "tornado.access",
    "tornado.application",
    "tornado.general",
    "gpupool",
    "gpupool.train",
)


def install(*extra: logging.Logger) -> None:
    """Put the filter on every handler of the hub's loggers (once each)."""
    for logger in [*(logging.getLogger(n) for n in LOGGERS), *extra]:
        for handler in logger.handlers:
            if not any(isinstance(f, Redact) for f in handler.filters):
                handler.addFilter(Redact())
        if not any(isinstance(f, Redact) for f in logger.filters):
            logger.addFilter(Redact())
