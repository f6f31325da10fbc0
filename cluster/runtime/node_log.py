"""The node's log: one destination and one format for every event, from the ``[log]`` section.

Two logging systems write events in a node: the stdlib ``logging`` loggers of
this project (``twistmq.*``) and ``twisted.logger`` (twistd itself, Twisted's
own events, ``twistmq.mqtt.auth``). ``configure`` gives the stdlib root logger
one handler (standard error, or ``[log] file``) and returns an observer that
hands every ``twisted.logger`` event to the stdlib logger named after its
namespace; twistd uses that observer instead of its own stdout log (see
``NodeService.setServiceParent``). Standard output is left to the
``twistmq ready`` line.

Every line reads ``DATE TIME LEVEL LOGGER EVENT key=value ...``.
``[log] connection_messages = false`` drops the routine per-client lines
(``CONNECTION_EVENTS``); refusals and failures stay.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys

from twisted.logger import ILogObserver, LogLevel, formatEvent
from zope.interface import implementer

from cluster.runtime.config import LogConfig
from store.config import ConfigError

FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"

CONNECTION_EVENTS = frozenset({"client_connected", "client_disconnected", "mqtt.auth.ok"})
"""Event codes of a client coming and going, dropped by ``[log] connection_messages = false``."""

_LEVELS = {LogLevel.debug: logging.DEBUG, LogLevel.info: logging.INFO, LogLevel.warn: logging.WARNING,
           LogLevel.error: logging.ERROR, LogLevel.critical: logging.CRITICAL}


class WithoutConnectionMessages(logging.Filter):
    """Drops records whose event code (the first word) is one of ``CONNECTION_EVENTS``."""

    def filter(self, record: logging.LogRecord) -> bool:
        # The event code is the format string's first word: no need to format the line to drop it.
        return str(record.msg).split(" ", 1)[0] not in CONNECTION_EVENTS


@implementer(ILogObserver)
class StdlibObserver:
    """A ``twisted.logger`` observer that passes each event to the stdlib logger of its namespace.

    ``drop``: event codes not to pass on (``CONNECTION_EVENTS`` with ``connection_messages = false``),
    dropped before the event is formatted (a connect storm would pay for formatting every line).
    """

    def __init__(self, drop: frozenset = frozenset()) -> None:
        self.drop = drop

    def __call__(self, event: dict) -> None:
        if self.drop and str(event.get("log_format") or "").split(" ", 1)[0] in self.drop:
            return
        namespace = event.get("log_namespace")
        # Events of Twisted's legacy log.msg carry no useful namespace: file them under "twisted".
        logger = logging.getLogger("twisted" if namespace in (None, "log_legacy") else namespace)
        level = _LEVELS.get(event.get("log_level"), logging.INFO)
        if not logger.isEnabledFor(level):
            return
        text = formatEvent(event)
        failure = event.get("log_failure")
        if failure is not None:  # an unexpected error: its traceback is the useful part
            text = f"{text}\n{failure.getTraceback()}"
        logger.log(level, "%s", text)


def configure(config: LogConfig, stream=None) -> StdlibObserver:
    """Point the root logger at ``config.file`` or *stream* (standard error); return the observer for twistd.

    A log file that cannot be opened is a ConfigError naming ``log.file``.
    """
    if config.file:
        try:
            # WatchedFileHandler reopens the file when logrotate moves it away.
            handler: logging.Handler = logging.handlers.WatchedFileHandler(config.file, encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"log.file: cannot open {config.file}: {exc.strerror or exc}") from None
    else:
        # sys.__stderr__: twistd redirects sys.stderr into its log, which would loop back here.
        handler = logging.StreamHandler(stream or sys.__stderr__)
    handler.setFormatter(logging.Formatter(FORMAT))
    if not config.connection_messages:
        handler.addFilter(WithoutConnectionMessages())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(config.level.upper())
    return StdlibObserver(frozenset() if config.connection_messages else CONNECTION_EVENTS)

