"""Logging: stdlib loggers everywhere, rendered as human text or one JSON object per line.

Components log with ``logging.getLogger("icespool.<part>")`` and pass fields through
``extra={...}``; structlog's ProcessorFormatter turns the record plus its extras into either a
``key=value`` line or a JSON object, so both formats carry the same fields.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = ["LOGGER_NAME", "configure_logging"]

LOGGER_NAME = "icespool"

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
# Attributes every LogRecord has; anything else on a record came from extra={...}.
# "message" and "asctime" are added by other formatters (pytest's, a syslog handler's) that
# may see the record first, and are not fields.
_RECORD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}
# Marks the handler we installed, so reconfiguring replaces it instead of adding another.
_HANDLER_MARK = "_icespool_handler"


def _add_extras(_logger: WrappedLogger, _name: str, event_dict: EventDict) -> EventDict:
    """Copy the fields a caller passed with ``extra={...}`` into the event dict."""
    record = event_dict.get("_record")
    if isinstance(record, logging.LogRecord):
        for key, value in record.__dict__.items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                event_dict.setdefault(key, value)
    return event_dict


def configure_logging(
    level: str = "info",
    fmt: Literal["text", "json"] = "text",
    *,
    stream: TextIO | None = None,
) -> None:
    """Send all stdlib logging to ``stream`` (stderr) at ``level`` in format ``fmt``.

    Safe to call again (tests, CLI overrides): the previous icespool handler is replaced.
    """
    try:
        numeric_level = _LEVELS[level.lower()]
    except KeyError:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(_LEVELS)}") from None
    if fmt not in ("text", "json"):
        raise ValueError(f"unknown log format {fmt!r}; use 'text' or 'json'")

    shared: list[Processor] = [
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        _add_extras,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Processor
    final: list[Processor]
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(sort_keys=False)
        final = [
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ]
    else:
        # Plain tracebacks: the default rich formatter prints local variables, which can
        # hold secrets, and colours make no sense in journald or a file.
        renderer = structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
        final = [structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer]

    formatter = structlog.stdlib.ProcessorFormatter(foreign_pre_chain=shared, processors=final)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)
    setattr(handler, _HANDLER_MARK, True)

    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(numeric_level)

    # structlog-native loggers (if any component uses them) go through the same handler.
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared[:2],
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
