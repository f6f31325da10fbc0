"""The load generator's event loop: raw non-blocking sockets on epoll, no client library.

A ``Conn`` is one MQTT client connection. Outgoing bytes go into ``Conn.out``
(a bytearray: deleting the sent prefix is O(1) in CPython) and are written in
big batches; a ``refill`` hook lets publishers stream pre-encoded packets in
as the socket drains. Incoming bytes are parsed by ``Loop._on_data``, which
handles PUBLISH and PUBACK inline (the hot path: count, de-duplicate, ack,
timestamp) and hands every other packet to ``Loop._on_control``.

Packets are built with the project's codec (``mqtt_proxy.codec``) before the
clock starts; the broker's CONNACK/SUBACK are decoded with its ``MQTTParser``.
Only the receive hot path does not use it: building a ``Publish`` object per
delivery would make the generator slower than the brokers it measures, so
``_on_data`` reads the few header bytes it needs in place.

Every wait here is bounded by a deadline; 127.0.0.1 only.
"""

import errno
import select
import socket
import struct
import time

from mqtt_proxy.codec import (
    MQTT_3_1_1, ConnAck, Disconnect, MQTTParser, ProtocolError, SubAck, encode, encode_publish,
)

HOST = "127.0.0.1"
RECV_SIZE = 1 << 18
_unpack_ii = struct.Struct(">II").unpack_from
_unpack_q = struct.Struct(">q").unpack_from
_LINGER0 = struct.pack("ii", 1, 0)
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT
_ERR = select.EPOLLERR | select.EPOLLHUP
DISCONNECT_PACKET = encode(Disconnect(), MQTT_3_1_1)
_PUBACK_B0, _PUBACK_B1 = b"\x40", b"\x02"
_CONNACK_OK, _CONNACK_OK_SESSION = b"\x20\x02\x00\x00", b"\x20\x02\x01\x00"


class Conn:
    """One client connection and the counters its scenario reads."""

    __slots__ = (
        "sock", "fd", "name", "out", "inbuf", "mask", "connecting", "closed",
        "connect_packet", "sub_packets", "subacks_pending", "ready", "session_present",
        "refill", "seen", "stride", "uniq", "dups", "bad", "lat", "acks",
        "sent", "limit", "window", "stream", "plen",
    )

    def __init__(self, name):
        self.name = name
        self.sock = None
        self.fd = -1
        self.out = bytearray()
        self.inbuf = b""
        self.mask = 0
        self.connecting = False
        self.closed = False
        self.connect_packet = b""
        self.sub_packets = []
        self.subacks_pending = 0
        self.ready = False
        self.session_present = False
        self.refill = None
        self.seen = None          # bytearray: one byte per (publisher, seq) expected
        self.stride = 0           # messages per publisher, to index ``seen``
        self.uniq = self.dups = self.bad = 0
        self.lat = None           # list of latencies in ns, when timestamps are measured
        self.acks = 0             # PUBACKs received (publishers)
        self.sent = 0             # packets handed to ``out`` (publishers)
        self.limit = 0            # packets to send in total (publishers)
        self.window = 0           # QoS 1 in-flight window; 0 = QoS 0, unbounded
        self.stream = None        # memoryview over the pre-encoded packets
        self.plen = 0             # length of one pre-encoded packet

    def expect(self, publishers, per_publisher):
        """Make this connection a subscriber that tracks every (publisher, seq)."""
        self.stride = per_publisher
        self.seen = bytearray(publishers * per_publisher)


class BrokerError(Exception):
    """The broker refused or dropped a connection the scenario needs."""


class Loop:
    """A level-triggered epoll loop over many ``Conn``s."""

    def __init__(self, port):
        self.port = port
        self.ep = select.epoll()
        self.conns = {}
        self.errors = []
        self.last_rx = 0.0        # monotonic time of the last read that delivered a PUBLISH
        self.last_ack = 0.0       # monotonic time of the last read that brought a PUBACK
        self.ready_count = 0
        self.delivered = 0        # unique PUBLISHes received, all subscribers
        self.acked = 0            # PUBACKs received, all publishers
        # Minimum seconds between polls (0: poll at once). Waiting a little lets each recv and send carry
        # many packets instead of one or two, which keeps one generator process ahead of the broker
        # (syscalls, not parsing, are its main cost). No broker notices while its socket buffers have
        # room and, for QoS 1, while the period is far shorter than the time its in-flight window lasts.
        # Never used for the latency scenario.
        self.batch = 0.0
        self.rbuf = bytearray(RECV_SIZE)
        self.send_deadline = float("inf")
        self.broker_pid = None    # for the CPU and RSS figures, when known

    # -- connections -------------------------------------------------------

    def open(self, conn):
        """Start a non-blocking connect; CONNECT (and SUBSCRIBEs) follow once connected."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sock, conn.fd = sock, sock.fileno()
        self.conns[conn.fd] = conn
        rc = sock.connect_ex((HOST, self.port))
        conn.out += conn.connect_packet
        if rc == 0:
            self.ep.register(conn.fd, _IN)
            conn.mask = _IN
            self.flush(conn)
        elif rc in (errno.EINPROGRESS, errno.EAGAIN):
            conn.connecting = True
            self.ep.register(conn.fd, _OUT)
            conn.mask = _OUT
        else:
            raise BrokerError(f"connect to {HOST}:{self.port} failed: {errno.errorcode.get(rc, rc)}")

    def open_many(self, conns, deadline, window=100):
        """Open ``conns`` with at most ``window`` handshakes in progress; True if all got ready."""
        base, opened, total = self.ready_count, 0, len(conns)
        while True:
            ready = self.ready_count - base
            while opened < total and opened - ready < window:
                self.open(conns[opened])
                opened += 1
            if ready >= total:
                return True
            if self.errors:
                return False
            if not self.poll_until(lambda: self.ready_count - base > ready or self.errors, deadline):
                return False

    def close(self, conn, graceful=True):
        """Close ``conn``: DISCONNECT first when ``graceful``, else a reset (no TIME_WAIT)."""
        if conn.closed:
            return
        conn.closed = True
        try:
            self.ep.unregister(conn.fd)
        except (OSError, ValueError):
            pass
        self.conns.pop(conn.fd, None)
        try:
            if graceful:
                conn.sock.setblocking(True)
                conn.sock.settimeout(1.0)
                conn.sock.sendall(bytes(conn.out) + DISCONNECT_PACKET)
            else:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER0)
        except OSError:
            pass
        conn.sock.close()

    def close_all(self):
        """Reset every open connection (fast teardown; the broker is stopped next)."""
        for conn in list(self.conns.values()):
            self.close(conn, graceful=False)
        self.ep.close()

    # -- writing -----------------------------------------------------------

    def write(self, conn, data):
        """Queue ``data`` and try to send it now."""
        conn.out += data
        self.flush(conn)

    def flush(self, conn):
        """Send as much of ``conn.out`` as the socket takes, refilling from the stream."""
        if conn.connecting or conn.closed:
            return
        out = conn.out
        while True:
            if conn.refill is not None and len(out) < 65536:
                conn.refill(self, conn)
            if not out:
                break
            try:
                n = conn.sock.send(out)
            except BlockingIOError:
                break
            except OSError as e:
                self._lost(conn, f"send: {e}")
                return
            del out[:n]
            if out:
                break
        want = _IN | _OUT if out else _IN
        if want != conn.mask:
            conn.mask = want
            self.ep.modify(conn.fd, want)

    # -- reading -----------------------------------------------------------

    def poll_until(self, done, deadline, every=0.05):
        """Run the loop until ``done()`` or ``deadline``; return ``done()``'s last value.

        With ``self.batch`` > 0 the loop polls at most once per ``batch``
        seconds, so each read brings many packets (see ``Loop.batch``).
        """
        ep, conns, batch = self.ep, self.conns, self.batch
        rbuf = self.rbuf
        rview = memoryview(rbuf)
        last_poll = 0.0
        while True:
            if done():
                return True
            now = time.monotonic()
            if now >= deadline:
                return False
            if batch:
                wait = last_poll + batch - now
                if wait > 0:
                    time.sleep(min(wait, deadline - now))
                    now = time.monotonic()
                last_poll = now
            delivered, acked = self.delivered, self.acked
            dirty = []
            for fd, ev in ep.poll(min(deadline - now, every)):
                conn = conns.get(fd)
                if conn is None:
                    continue
                if ev & (_IN | _ERR):
                    try:
                        # recv_into a buffer allocated once: sock.recv(256 KiB) would allocate (and
                        # shrink) 256 KiB per call, which costs more than the syscall itself.
                        n = conn.sock.recv_into(rbuf)
                    except BlockingIOError:
                        n = -1
                    except OSError as e:
                        self._lost(conn, f"recv: {e}")
                        continue
                    if n >= 0:
                        if not n:
                            self._lost(conn, "closed by broker")
                            continue
                        data = rview[:n].tobytes()
                        if conn.inbuf:
                            data = conn.inbuf + data
                        i = self._on_data(conn, data)
                        conn.inbuf = data[i:] if i < len(data) else b""
                        if conn.out or conn.refill is not None:
                            dirty.append(conn)  # flushed once, after every event of this poll
                            continue
                if ev & _OUT and not conn.closed:
                    if conn.connecting:
                        err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                        if err:
                            self._lost(conn, f"connect: {errno.errorcode.get(err, err)}")
                            continue
                        conn.connecting = False
                    dirty.append(conn)
            for conn in dirty:
                self.flush(conn)
            if self.delivered != delivered:
                self.last_rx = time.monotonic()
            if self.acked != acked:
                self.last_ack = time.monotonic()

    def _lost(self, conn, why):
        if not conn.closed:
            self.errors.append(f"{conn.name}: {why}")
            self.close(conn, graceful=False)

    def _on_data(self, conn, data):
        """Parse complete packets from ``data``; return the number of bytes consumed."""
        i, n = 0, len(data)
        if conn.window and data[0] == 0x40 and n >= 8:
            # A QoS 1 publisher's reads are runs of PUBACKs (40 02 id id): count a whole run at C speed.
            m = n >> 2
            if data[0:m << 2:4] == _PUBACK_B0 * m and data[1:m << 2:4] == _PUBACK_B1 * m:
                conn.acks += m
                self.acked += m
                i = m << 2
                if i == n:
                    return i
        seen, stride, lat, out = conn.seen, conn.stride, conn.lat, conn.out
        nseen = len(seen) if seen is not None else 0
        now_ns = time.monotonic_ns() if lat is not None else 0
        uniq = dups = bad = acks = 0
        while n - i >= 2:
            b0 = data[i]
            rl = data[i + 1]
            j = i + 2
            if rl & 0x80:
                rl, mult, complete = rl & 0x7F, 128, False
                while j < n:
                    byte = data[j]
                    j += 1
                    rl += (byte & 0x7F) * mult
                    mult <<= 7
                    if not byte & 0x80:
                        complete = True
                        break
                if not complete:
                    break
            end = j + rl
            if end > n:
                break
            kind = b0 >> 4
            if kind == 3:
                p = j + 2 + ((data[j] << 8) | data[j + 1])
                if b0 & 6:
                    out += b"\x40\x02"
                    out += data[p:p + 2]
                    p += 2
                if end - p >= 8:
                    pub, seq = _unpack_ii(data, p)
                    k = pub * stride + seq
                    if 0 <= seq < stride and k < nseen:
                        if seen[k]:
                            dups += 1
                        else:
                            seen[k] = 1
                            uniq += 1
                            if lat is not None and end - p >= 16:
                                lat.append(now_ns - _unpack_q(data, p + 8)[0])
                    else:
                        bad += 1
                else:
                    bad += 1
            elif kind == 4:
                acks += 1
            else:
                self._on_control(conn, data[i:end])
            i = end
        if uniq or dups or bad:
            conn.uniq += uniq
            conn.dups += dups
            conn.bad += bad
            self.delivered += uniq
        if acks:
            conn.acks += acks
            self.acked += acks
        return i

    def _on_control(self, conn, packet):
        """Any packet but PUBLISH and PUBACK (CONNACK, SUBACK, ...): decoded by the project's codec.

        An accepting 3.1.1 CONNACK (4 fixed bytes) skips the parser: with 10,000 connections to
        open, building a parser per handshake made the generator the limit of Mosquitto's connect rate.
        """
        if packet == _CONNACK_OK or packet == _CONNACK_OK_SESSION:
            conn.session_present = packet[2] == 1
            if conn.sub_packets:
                conn.subacks_pending = len(conn.sub_packets)
                conn.out += b"".join(conn.sub_packets)
            else:
                self._set_ready(conn)
            return
        try:
            decoded = MQTTParser(server_side=False, protocol_level=MQTT_3_1_1).feed(packet)
        except ProtocolError as e:
            self.errors.append(f"{conn.name}: malformed packet from the broker ({e}): {packet[:32].hex()}")
            return
        for p in decoded:
            if type(p) is ConnAck:
                if p.reason_code != 0:
                    self.errors.append(f"{conn.name}: CONNACK refused (return code {int(p.reason_code)})")
                    return
                conn.session_present = p.session_present
                if conn.sub_packets:
                    conn.subacks_pending = len(conn.sub_packets)
                    conn.out += b"".join(conn.sub_packets)
                else:
                    self._set_ready(conn)
            elif type(p) is SubAck:
                if any(code >= 0x80 for code in p.reason_codes):
                    self.errors.append(f"{conn.name}: SUBACK refused a filter")
                conn.subacks_pending -= 1
                if conn.subacks_pending == 0:
                    self._set_ready(conn)

    def _set_ready(self, conn):
        if not conn.ready:
            conn.ready = True
            self.ready_count += 1


def pre_encode(topic, publisher, count, qos, first_packet_id=1, payload=16):
    """Encode ``count`` PUBLISHes from ``publisher`` (payload: publisher, seq, 0, then zeros to ``payload`` bytes).

    The fixed header and topic come from the project's ``encode_publish``; only
    the packet id and payload change from one packet to the next, so they are
    packed straight behind that head (the same bytes, without a call per packet).
    Returns ``(stream, packet_length)``; every packet has the same length, so
    packet ``i`` is ``stream[i * packet_length:(i + 1) * packet_length]``.
    """
    payload = max(16, payload)
    sample = encode_publish(topic, bytes(payload), qos, packet_id=1 if qos else None)
    head = sample[:len(sample) - payload - (2 if qos else 0)]
    pad = bytes(payload - 16)
    pack = struct.Struct(">HIIq" if qos else ">IIq").pack
    if qos:
        body = [head + pack((first_packet_id + i - 1) % 65535 + 1, publisher, i, 0) + pad for i in range(count)]
    else:
        body = [head + pack(publisher, i, 0) + pad for i in range(count)]
    return memoryview(b"".join(body)), len(sample)


def stream_refill(loop, conn):
    """``Conn.refill`` for publishers: top up ``out`` within the window and the send deadline."""
    if conn.sent >= conn.limit or time.monotonic() >= loop.send_deadline:
        return
    room = conn.limit - conn.sent
    if conn.window:
        free = conn.acks + conn.window - conn.sent
        if free < room and free < conn.window >> 2:
            return  # top the window up in quarters: fewer, larger writes for the generator and the broker
        room = min(room, free)
    else:
        room = min(room, 8192)
    if room > 0:
        plen = conn.plen
        conn.out += conn.stream[conn.sent * plen:(conn.sent + room) * plen]
        conn.sent += room
