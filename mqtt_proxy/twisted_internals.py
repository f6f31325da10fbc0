"""Every use of Twisted's transport internals, in one place (tests/integration/test_twisted_internals.py
fails if Twisted changes them).

- ``send``: a small write goes out at once when nothing is queued in the
  transport, for both ends of the native protocol. One in-flight request per
  connection is the common native pattern, so every request and reply is one
  small write. Through ``transport.write`` each costs registering the socket for
  writing, a poll round and unregistering it again (two ``epoll_ctl`` calls and
  a wake-up), a fair share of a request. When the transport is a plain TCP
  connection with nothing buffered (``dataBuffer``, ``_tempDataLen``),
  ``socket.send`` goes out directly; whatever the socket does not take goes to
  Twisted's buffer.
- ``share_log_strings``: Twisted formats two strings per connection for its own
  log lines and repr (``logstr``, ``repstr``: 164 bytes of an idle MQTT
  connection); one shared string serves them. The session number is only shown
  in them (an int of its own past 256), and the peer's host string is interned
  (clients behind one NAT or load balancer share it): 87 bytes more.
- ``share_transport_keys``: CPython keeps an object's attributes in a small
  array beside it while their names are in its class's shared key table; a
  name that is not makes a dict of its own for that object (832 bytes for a TCP
  transport). The table takes at most 30 names and stops growing after about
  30 objects of the class, before an accepted connection writes (``offset``,
  ``dataBuffer``) when clients come many at once: each idle MQTT connection's
  transport then had its own dict (RSS 2,650 B per idle connection; a node
  whose first client came and went alone, like ``./dev bench``'s readiness
  probe, did not show it). One bare
  ``tcp.Server`` given the names Twisted and this package set on an open server
  transport, before the first connection, puts them all in the table.
- ``SharedBufferServer`` (``read_into_shared_buffer``): Twisted's ``doRead``
  is ``socket.recv(bufferSize)``, and ``bufferSize`` is also the write
  buffer's pause threshold, which the MQTT protocol raises to
  ``max_queued_bytes`` (1 MiB). CPython allocates the whole size for each read
  and shrinks it to what came: past glibc's mmap threshold that is an mmap, a
  page fault, an mremap and a munmap per read, 12 µs for a 40-byte CONNECT
  (a third of a connect storm's time). This transport reads into one buffer
  shared by every connection (the reactor reads one socket at a time) and
  copies what came; the listening port builds it instead of ``tcp.Server``.
- ``raise_send_limit``: ``SEND_LIMIT`` (128 KiB) is what one send may take from
  the transport's buffer per reactor pass.
- ``read_datagrams_up_to``: a UDP port reads ``maxPacketSize`` bytes of a
  datagram (8,192 by default) and drops the rest without a word.
- ``request_target``: an HTTP channel's ``_path``, the request target, known
  before the body is read (``gotLength``), so a request can be refused from its
  headers.
"""

from __future__ import annotations

import sys

from twisted.internet import main, tcp


def can_send_directly(transport) -> bool:
    """A plain TCP transport with Twisted's write buffer (not TLS, not a test double)."""
    return isinstance(transport, tcp.Connection) and hasattr(transport, "_tempDataLen") \
        and hasattr(transport, "socket")


def send(transport, data: bytes, direct: bool) -> None:
    """Write ``data``: straight to the socket when ``direct`` and nothing is queued, else ``transport.write``."""
    t = transport
    if direct and not t.dataBuffer and not t._tempDataLen and t.connected and not t.disconnecting and not t.TLS:
        try:
            sent = t.socket.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            sent = 0  # the transport finds the error itself on its next read or write
        if sent == len(data):
            return
        data = data[sent:]
    t.write(data)


def share_log_strings(transport, name: str) -> None:
    """Let a TCP server transport use one shared string for its log prefix and repr, and for its peer's host."""
    if isinstance(transport, tcp.Server):
        transport.logstr = transport.repstr = name
        transport.sessionno = 0
        client = transport.client
        host = client[0]
        if type(host) is str:
            shared = sys.intern(host)
            if shared is not host:
                transport.client = (shared,) + tuple(client[1:])
                transport.hostname = shared


class SharedBufferServer(tcp.Server):
    """``tcp.Server`` whose reads go through one buffer shared by every connection (see the module doc)."""

    def doRead(self):
        size = min(self.bufferSize, READ_LIMIT)
        view = _read_buffer(size)
        try:
            n = self.socket.recv_into(view, size)
        except OSError as se:
            if se.args[0] == tcp.EWOULDBLOCK:
                return None
            return main.CONNECTION_LOST
        return self._dataReceived(view[:n].tobytes())


READ_LIMIT = 1 << 20
"""Bytes one read takes at most (a larger ``max_queued_bytes`` would make the shared buffer, which is
zero-filled when made, that large)."""
_buffer = [memoryview(bytearray(1 << 16))]


def _read_buffer(size: int) -> memoryview:
    """The shared read buffer, at least ``size`` bytes (grown once to the largest read asked)."""
    view = _buffer[0]
    if len(view) < size:
        view = _buffer[0] = memoryview(bytearray(size))
    return view


def read_into_shared_buffer(port) -> None:
    """Make a listening TCP port build ``SharedBufferServer`` transports (no-op for other ports)."""
    if isinstance(port, tcp.Port) and port.transport is tcp.Server:
        port.transport = SharedBufferServer


# The attributes a tcp.Server instance gets while it is open (Twisted's abstract.FileDescriptor,
# _ConsumerMixin, tcp.Connection and tcp.Server; ``_addressType`` on IPv6 only), then ours. Each name costs
# every transport a slot (8 bytes), so the ones set only while closing (``disconnecting``, ``_aborting``,
# ...) are left out: a closing transport may make its dict then.
TRANSPORT_KEYS = (
    "reactor", "_tempDataBuffer", "_tempDataLen", "socket", "fileno", "protocol", "server", "client", "sessionno",
    "hostname", "logstr", "repstr", "connected", "_addressType", "producer", "streamingProducer", "producerPaused",
    "dataBuffer", "offset",
    "bufferSize", "SEND_LIMIT",  # set by mqtt_proxy.protocol
)
_shared = [False]


def share_transport_keys() -> None:
    """Put every attribute name of a TCP server transport in ``tcp.Server``'s shared key table (once).

    Call before the first connection is accepted: the table stops taking names
    once a few dozen transports were made.
    """
    if _shared[0]:
        return
    _shared[0] = True
    for cls in (tcp.Server, SharedBufferServer):  # each class has its own key table
        blank = cls.__new__(cls)  # never initialised nor used: only its attribute names matter
        for name in TRANSPORT_KEYS:
            setattr(blank, name, None)


def raise_send_limit(transport, size: int) -> None:
    """Let one send of a TCP transport take up to ``size`` bytes of its buffer (no-op elsewhere)."""
    if getattr(transport, "SEND_LIMIT", size) < size:
        transport.SEND_LIMIT = size


def read_datagrams_up_to(transport, size: int) -> None:
    """Let a UDP port read datagrams of up to ``size`` bytes whole."""
    transport.maxPacketSize = size


def request_target(channel) -> bytes | None:
    """The target of the request an HTTP channel is reading (None before its request line)."""
    return getattr(channel, "_path", None)
