"""Send a small write at once when nothing is queued in the transport, for both ends of the native protocol.

One in-flight request per connection is the common native pattern, so every
request and reply is one small write. Through ``transport.write`` each costs
registering the socket for writing, a poll round and unregistering it again
(two ``epoll_ctl`` calls and a wake-up), a fair share of a request. When the
transport is a plain TCP connection with nothing buffered, ``socket.send`` goes
out directly; whatever the socket does not take goes to Twisted's buffer.
"""

from __future__ import annotations

from twisted.internet import tcp


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
