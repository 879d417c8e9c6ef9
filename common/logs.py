"""Structured logs: one JSON object per line on stderr, extra fields carried through."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

# attributes every LogRecord has; anything else was passed with `extra=` and is logged as a field
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(
            (key, value) for key, value in record.__dict__.items() if key not in _STANDARD and key[0] != "_"
        )
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def setup_logging(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def flush_logs() -> None:
    """Before an os._exit: what the handlers and the standard streams hold goes out."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    sys.stdout.flush()
