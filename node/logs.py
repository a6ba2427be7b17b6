"""How a node process logs: the level, text or JSON lines, and a rotated file.

Set by the environment (a launcher passes it on to its nodes):

- `SMS_LOG_LEVEL`: DEBUG, INFO (the default), WARNING, ERROR. Routine steps log at INFO;
  WARNING means something an operator may have to look at.
- `SMS_LOG_FORMAT`: `text` (the default: `time node LEVEL logger: message`) or `json`,
  one JSON object per line with `timestamp` (ISO 8601, UTC), `level`, `logger`, `node`,
  `message`, and `exc_info` for a traceback (python-json-logger).
- `SMS_LOG_FILE`: a file to log to instead of standard error, rotated at
  `LOG_FILE_BYTES_MAX` with `LOG_FILE_BACKUPS` old files kept (FILE.1 the newest).
  `sms up` logs each node to DIR/logs/NODE.log this way; what a process writes to its
  standard error outside logging (a crash) goes to DIR/logs/NODE.out.

A bad value stops the process at start with a one-line message naming the variable.
"""

from __future__ import annotations

import logging
import logging.handlers
import os

from sms import limits

ENV_LEVEL = "SMS_LOG_LEVEL"
ENV_FORMAT = "SMS_LOG_FORMAT"
ENV_FILE = "SMS_LOG_FILE"
FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class LogConfigError(ValueError):
    """A logging setting that cannot be used (named in the message)."""


def settings(env=None) -> tuple[str, str, str]:
    """(level, format, file) from the environment, checked."""
    env = os.environ if env is None else env
    level = env.get(ENV_LEVEL, "INFO").strip().upper() or "INFO"
    if level not in LEVELS:
        raise LogConfigError(f"${ENV_LEVEL} is {env.get(ENV_LEVEL)!r}; expected one of {', '.join(LEVELS)}")
    fmt = env.get(ENV_FORMAT, "text").strip().lower() or "text"
    if fmt not in FORMATS:
        raise LogConfigError(f"${ENV_FORMAT} is {env.get(ENV_FORMAT)!r}; expected one of {', '.join(FORMATS)}")
    path = env.get(ENV_FILE, "").strip()
    if path:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise LogConfigError(f"${ENV_FILE} is {path!r}, but its directory {parent!r} does not exist")
    return level, fmt, path


def formatter(fmt: str, node: str) -> logging.Formatter:
    if fmt == "json":
        from pythonjsonlogger.json import JsonFormatter
        return JsonFormatter(["levelname", "name", "message"], rename_fields={"levelname": "level", "name": "logger"},
                             static_fields={"node": node}, timestamp=True)
    return logging.Formatter(f"%(asctime)s {node} %(levelname)s %(name)s: %(message)s")


def configure(node: str, env=None) -> None:
    """The root logger of this process, as the environment says (raises LogConfigError)."""
    level, fmt, path = settings(env)
    if path:
        handler: logging.Handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=limits.LOG_FILE_BYTES_MAX, backupCount=limits.LOG_FILE_BACKUPS, encoding="utf-8")
    else:
        handler = logging.StreamHandler()
    handler.setFormatter(formatter(fmt, node))
    logging.basicConfig(level=level, handlers=[handler], force=True)
