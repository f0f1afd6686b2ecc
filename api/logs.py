"""Process-wide logging: readable lines, or one JSON object per line (JIGSAW_LOG_FORMAT).

Code logs context as fields, never only inside the message:
`logger.info("launched", extra={"job_id": 7, "agent_id": 2})`. The JSON format carries
every such field as a key (python-json-logger), so a log collector can filter on a job
or an agent; the text format appends them as `job_id=7 agent_id=2`.
"""

from __future__ import annotations

import logging
from typing import Literal

from pythonjsonlogger.json import JsonFormatter

# Fields a log call may pass in `extra`, shown at the end of text lines in this order.
CONTEXT_FIELDS = ("job_id", "agent_id", "agent_ids", "node", "decision")
_TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class TextFormatter(logging.Formatter):
    """The classic line, plus `key=value` for each context field the record carries."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(
            f"{name}={getattr(record, name)}"
            for name in CONTEXT_FIELDS
            if getattr(record, name, None) is not None
        )
        if not context:
            return line
        # Keep a traceback (after the first line) below the context, not inside it.
        first, newline, rest = line.partition("\n")
        return f"{first} [{context}]{newline}{rest}"


def formatter(fmt: Literal["text", "json"]) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter(
            "{levelname}{name}{message}",
            style="{",
            timestamp="time",  # ISO 8601 in UTC
            rename_fields={"levelname": "level", "name": "logger"},
        )
    return TextFormatter(_TEXT_FORMAT)


def configure_logging(level: str = "info", fmt: Literal["text", "json"] = "text") -> None:
    """Log to stderr at `level` in `fmt`, unless the embedding program set logging up
    (then only the level changes)."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(formatter(fmt))
        root.addHandler(handler)
    root.setLevel(level.upper())
