"""The node log: stdlib and twisted.logger events in one place and one format, level and connection filter."""

from __future__ import annotations

import io
import logging
import re

import pytest
from twisted.logger import Logger
from twisted.python.failure import Failure

from cluster.runtime.config import LogConfig
from cluster.runtime.node_log import FORMAT, configure
from store.config import ConfigError

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ \S")


@pytest.fixture
def restore_logging():
    """Take configure()'s handler off the root logger again (pytest re-adds its own capture handlers per phase)."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in list(root.handlers):
        if handler.formatter is not None and handler.formatter._fmt == FORMAT:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)


def emit_both(observer):
    """One event through each logging system, as the broker and the authenticator write them."""
    logging.getLogger("twistmq.mqtt.broker").info("client_connected client=%s peer=%s", "c1", "127.0.0.1")
    events = []
    tx_log = Logger(namespace="twistmq.mqtt.auth", observer=events.append)
    tx_log.warn("mqtt.auth.fail client_id={client_id!r} username={username!r}", client_id="c2", username="u")
    tx_log.info("mqtt.auth.ok client_id={client_id!r}", client_id="c3")
    for event in events:
        observer(event)


def test_both_systems_share_one_stream_and_format(restore_logging):
    """A stdlib line and a twisted.logger line land in the same stream with the same layout and logger name."""
    stream = io.StringIO()
    emit_both(configure(LogConfig(), stream))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3 and all(LINE.match(line) for line in lines), lines
    assert " INFO twistmq.mqtt.broker client_connected client=c1" in lines[0]
    assert " WARNING twistmq.mqtt.auth mqtt.auth.fail client_id='c2' username='u'" in lines[1]
    assert " INFO twistmq.mqtt.auth mqtt.auth.ok client_id='c3'" in lines[2]


def test_level_warning_drops_info_lines(restore_logging):
    """[log] level = WARNING keeps warnings and drops INFO connect lines from both systems."""
    stream = io.StringIO()
    emit_both(configure(LogConfig(level="WARNING"), stream))
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "mqtt.auth.fail" in lines[0]


def test_connection_messages_off_drops_only_connect_and_disconnect(restore_logging):
    """connection_messages = false drops client_connected and mqtt.auth.ok but keeps failures and other lines."""
    stream = io.StringIO()
    observer = configure(LogConfig(connection_messages=False), stream)
    emit_both(observer)
    logging.getLogger("twistmq.mqtt.broker").info("client_disconnected client=c1 will=False")
    logging.getLogger("twistmq.mqtt.protocol").info("connect_refused client='c4' user=None peer=1.2.3.4")
    text = stream.getvalue()
    assert "client_connected" not in text and "mqtt.auth.ok" not in text and "client_disconnected" not in text
    assert "mqtt.auth.fail" in text and "connect_refused client='c4'" in text


def test_log_file_receives_the_lines(tmp_path, restore_logging):
    """[log] file: the lines go to that file, appended."""
    path = tmp_path / "node.log"
    path.write_text("earlier line\n")
    emit_both(configure(LogConfig(file=str(path))))
    for handler in logging.getLogger().handlers:
        handler.flush()
    lines = path.read_text().splitlines()
    assert lines[0] == "earlier line" and len(lines) == 4 and "client_connected" in lines[1]


def test_unopenable_log_file_is_a_config_error(tmp_path, restore_logging):
    """A log file in a missing directory is one ConfigError naming log.file and the path."""
    with pytest.raises(ConfigError) as info:
        configure(LogConfig(file=str(tmp_path / "no" / "node.log")))
    assert str(info.value).startswith(f"log.file: cannot open {tmp_path / 'no' / 'node.log'}")


def test_twisted_failure_keeps_its_traceback(restore_logging):
    """An unexpected error logged through twisted.logger still shows where it came from."""
    stream = io.StringIO()
    observer = configure(LogConfig(), stream)
    events = []
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        Logger(namespace="twisted.internet.defer", observer=events.append).failure("Unhandled error", Failure())
    observer(events[0])
    text = stream.getvalue()
    assert " CRITICAL twisted.internet.defer Unhandled error" in text and "RuntimeError: boom" in text
