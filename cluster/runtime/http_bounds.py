"""Bounds on an HTTP request while it arrives: a deadline, a body cap, and the API token before the body.

twisted.web reads a request's body whole (spooled to a temporary file past
100 KB) before any resource sees it, and its idle timeout restarts with every
byte: a wrong token could send 200 MB to disk, and one byte every five seconds
kept a connection open for good. ``BoundedSite`` makes ``BoundedRequest``
objects, which use the hooks ``twisted.web.http`` calls while a request is
still arriving:

- ``__init__`` (the request line came in): the whole request (headers and
  body) must arrive within ``request_timeout`` seconds, else 408 and close;
- ``gotLength`` (every header is in, no body byte read yet): ``gate(path,
  request)`` may refuse (the admin API's 401/403), then a declared
  ``Content-Length`` over ``max_body`` is 413, before a body byte is read;
- ``handleContentChunk``: a chunked body is counted as it comes, 413 past
  ``max_body``; the body is kept in memory (it is at most ``max_body``);
- ``requestReceived``: the request is whole, the deadline is off.

A refusal writes its response and closes the connection; what the client still
sends is dropped unread. The one Twisted internal used, the request's path
before the request is whole, is read through ``mqtt_proxy.twisted_internals``
(every such use is there, with a test that fails if Twisted changes them).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

from twisted.web import server
from twisted.web.http import RESPONSES

from mqtt_proxy.twisted_internals import request_target



@dataclass(frozen=True)
class Refusal:
    """An answer given before a request is whole: HTTP ``status`` and ``{"code": code, "message": message}``."""

    status: int
    code: str
    message: str
    headers: dict = field(default_factory=dict)


def response_bytes(refusal: Refusal) -> bytes:
    """The whole HTTP/1.1 response of a refusal, closing the connection."""
    body = json.dumps({"code": refusal.code, "message": refusal.message}, separators=(",", ":")).encode("utf-8")
    phrase = RESPONSES.get(refusal.status, b"Error")
    lines = [b"HTTP/1.1 %d %s" % (refusal.status, phrase), b"Content-Type: application/json",
             b"Content-Length: %d" % len(body), b"Connection: close"]
    lines += [name.encode("latin-1") + b": " + value.encode("latin-1") for name, value in refusal.headers.items()]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


class BoundedSite(server.Site):
    """A Site whose requests obey ``max_body`` (bytes), ``request_timeout`` (seconds) and ``gate``.

    ``gate(path, request)`` is asked, once the headers are in and before the body, about every request
    that has a body; it returns a ``Refusal`` or None. ``path`` is None if it cannot be known.
    """

    def __init__(self, root, *, max_body: int, request_timeout: float, gate=None, reactor=None) -> None:
        super().__init__(root, requestFactory=BoundedRequest, reactor=reactor)
        self.max_body = max_body
        self.request_timeout = request_timeout
        self.gate = gate
        self.noisy = False


class BoundedRequest(server.Request):
    """A Request that refuses, before reading it, a body too big, too slow or without the API's token."""

    def __init__(self, channel, *args, **kw) -> None:
        super().__init__(channel, *args, **kw)
        self._refused = False
        self._body_bytes = 0
        site = channel.site
        self._deadline = site.reactor.callLater(site.request_timeout, self._too_slow, site.request_timeout)

    def gotLength(self, length) -> None:
        self.content = io.BytesIO()
        if length == 0:
            return  # no body: the resource does its own checks
        site = self.channel.site
        if site.gate is not None:  # first: a client without the token learns nothing more
            refusal = site.gate(request_target(self.channel), self)
            if refusal is not None:
                self._refuse(refusal)
                return
        if length is not None and length > site.max_body:
            self._refuse(Refusal(413, "too_large", f"the body ({length} bytes) exceeds {site.max_body} bytes"))

    def handleContentChunk(self, data: bytes) -> None:
        if self._refused:
            return
        self._body_bytes += len(data)
        limit = self.channel.site.max_body
        if self._body_bytes > limit:
            self._refuse(Refusal(413, "too_large", f"the body exceeds {limit} bytes"))
            return
        self.content.write(data)

    def requestReceived(self, command, path, version) -> None:
        self._stop_deadline()
        if self._refused:
            return  # answered already; the connection is closing
        super().requestReceived(command, path, version)

    def connectionLost(self, reason) -> None:
        self._stop_deadline()
        super().connectionLost(reason)

    def _too_slow(self, seconds: float) -> None:
        self._deadline = None
        if self.channel is not None and not self._refused:
            self._refuse(Refusal(408, "request_timeout", f"the request did not arrive whole within {seconds:g} s"))

    def _stop_deadline(self) -> None:
        if self._deadline is not None and self._deadline.active():
            self._deadline.cancel()
        self._deadline = None

    def _refuse(self, refusal: Refusal) -> None:
        self._refused = True
        self._stop_deadline()
        self.content = io.BytesIO()
        self.requestHeaders.removeHeader(b"expect")  # no "100 Continue" after the refusal
        channel = self.channel
        if channel is None or channel.transport is None:
            return
        channel.transport.write(response_bytes(refusal))
        channel.loseConnection()
