"""The timer wheel: a fixed ring of slots, each pointing at a chain in the timer log.

Slot ``i`` serves every time ``t`` with ``(t // precision_ms) % slot_count == i``;
it remembers which of those times it currently holds, so a slot whose stored
time is not the one asked for counts as empty (the wheel has wrapped since).
The wheel lives in memory (``slot_count`` x 28 bytes) and is saved as a whole,
atomically, by ``save()`` (or ``snapshot()`` now, a copy, and ``write_snapshot()``
later, on another thread); the previous snapshot is kept next to it so that
recovery can fall back to it (see ``store.timer``).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from crc32c import crc32c
from store.files import fsync_dir

# time // precision (i64), first_pos (i64), last_pos (i64), num (u32)
SLOT = struct.Struct(">qqqI")
WHEEL_FILE = "wheel"
PREVIOUS_SUFFIX = ".prev"
_MAGIC = 0x71AE_3EE1
_VERSION = 1
_NO_TIME = -(1 << 63)
# magic, version, slot_count, precision_ms, log_pos, read_time (_NO_TIME: none), tail_crc,
# crc32c (of the header before it, then the slots that follow the header)
_HEADER = struct.Struct(">IHIIqqII")


class WheelFileError(Exception):
    """A wheel snapshot is missing, truncated, corrupt or of another geometry."""


@dataclass(frozen=True, slots=True)
class Slot:
    """A slot as read for one time: empty slots have ``num == 0`` and positions -1."""

    time_ms: int  # normalised: a multiple of the precision
    first_pos: int
    last_pos: int
    num: int


@dataclass(frozen=True, slots=True)
class WheelSnapshot:
    """A loaded snapshot: the wheel and the timer state it was taken at."""

    wheel: "TimerWheel"
    log_pos: int  # timer-log end when saved: every unit before it is chained in
    read_time_ms: int | None  # the timer's read pointer when saved
    tail_crc: int  # CRC32C of the last unit before log_pos: tells a log rewritten since apart
    path: str


@dataclass(frozen=True, slots=True)
class WheelImage:
    """A wheel as ``snapshot()`` copied it: the header (without its CRC) and the slots."""

    head: bytes
    slots: bytes

    def crc(self) -> int:
        return crc32c(self.slots, crc32c(self.head))

    def encode(self) -> bytes:
        """The snapshot file's bytes."""
        return self.head + self.crc().to_bytes(4, "big") + self.slots


class TimerWheel:
    """``slot_count`` slots of ``precision_ms`` each; covers ``slot_count * precision_ms`` ms.

    Times are normalised by flooring to the precision; the caller decides which
    multiple of the precision an entry belongs to.
    """

    def __init__(self, slot_count: int, precision_ms: int = 100) -> None:
        if slot_count < 2:
            raise ValueError(f"slot_count must be >= 2, got {slot_count}")
        if precision_ms < 1:
            raise ValueError(f"precision_ms must be >= 1, got {precision_ms}")
        self.slot_count = slot_count
        self.precision_ms = precision_ms
        self._slots = bytearray(slot_count * SLOT.size)

    @property
    def window_ms(self) -> int:
        """The span of time the wheel can hold without two times sharing a slot."""
        return self.slot_count * self.precision_ms

    def normalise(self, time_ms: int) -> int:
        """``time_ms`` floored to the precision."""
        return time_ms - time_ms % self.precision_ms

    def get_slot(self, time_ms: int) -> Slot:
        """The slot for ``time_ms``: empty unless it holds exactly that (normalised) time."""
        tick = time_ms // self.precision_ms
        stored, first, last, num = SLOT.unpack_from(self._slots, (tick % self.slot_count) * SLOT.size)
        if stored != tick or num == 0:
            return Slot(tick * self.precision_ms, -1, -1, 0)
        return Slot(tick * self.precision_ms, first, last, num)

    def get_chain(self, time_ms: int) -> tuple[int, int, int]:
        """``(first_pos, last_pos, num)`` of ``get_slot(time_ms)`` without building a ``Slot``."""
        tick = time_ms // self.precision_ms
        stored, first, last, num = SLOT.unpack_from(self._slots, (tick % self.slot_count) * SLOT.size)
        if stored != tick or num == 0:
            return -1, -1, 0
        return first, last, num

    def put_slot(self, time_ms: int, first_pos: int, last_pos: int, num: int) -> None:
        """Make the slot for ``time_ms`` hold that time with the given chain."""
        tick = time_ms // self.precision_ms
        SLOT.pack_into(self._slots, (tick % self.slot_count) * SLOT.size, tick, first_pos, last_pos, num)

    def reset_slot(self, time_ms: int) -> None:
        """Empty the slot for ``time_ms`` once it has been consumed (no-op if it holds another time)."""
        tick = time_ms // self.precision_ms
        off = (tick % self.slot_count) * SLOT.size
        if SLOT.unpack_from(self._slots, off)[0] == tick:
            SLOT.pack_into(self._slots, off, 0, -1, -1, 0)

    # -- persistence -----------------------------------------------------------------

    def save(self, directory: str, log_pos: int, read_time_ms: int | None, tail_crc: int = 0) -> str:
        """Write a snapshot atomically (temp file, fsync, rename), keeping the previous one."""
        return write_snapshot(directory, self.snapshot(log_pos, read_time_ms, tail_crc))

    def snapshot(self, log_pos: int, read_time_ms: int | None, tail_crc: int = 0) -> "WheelImage":
        """A snapshot of the wheel as it is now (a copy: the wheel may change after).

        Only the copy of the slots is made here (on the reactor, a checkpoint at
        a time); the CRC and the file's bytes are made by ``write_snapshot`` on
        the thread that writes them: joining the 4 MB of a default wheel into a
        new buffer took tens of ms of the reactor's turn.
        """
        head = _HEADER.pack(_MAGIC, _VERSION, self.slot_count, self.precision_ms, log_pos,
                            _NO_TIME if read_time_ms is None else read_time_ms, tail_crc, 0)
        return WheelImage(head[:-4], bytes(self._slots))

    @classmethod
    def load(cls, path: str, slot_count: int, precision_ms: int) -> WheelSnapshot:
        """Read a snapshot; raise ``WheelFileError`` if it is unusable for this geometry."""
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise WheelFileError(f"{path}: missing") from None
        if len(data) < _HEADER.size:
            raise WheelFileError(f"{path}: {len(data)} bytes, shorter than the header")
        magic, version, count, precision, log_pos, read_time, tail_crc, crc = _HEADER.unpack_from(data)
        if magic != _MAGIC or version != _VERSION:
            raise WheelFileError(f"{path}: bad magic {magic:#x} or version {version}")
        if (count, precision) != (slot_count, precision_ms):
            raise WheelFileError(f"{path}: geometry {count} x {precision} ms, expected {slot_count} x {precision_ms} ms")
        if len(data) != _HEADER.size + count * SLOT.size:
            raise WheelFileError(f"{path}: {len(data)} bytes, expected {_HEADER.size + count * SLOT.size}")
        body = memoryview(data)[_HEADER.size:]
        if crc32c(body, crc32c(data[:_HEADER.size - 4])) != crc:
            raise WheelFileError(f"{path}: CRC32C mismatch")
        wheel = cls(slot_count, precision_ms)
        wheel._slots[:] = body
        return WheelSnapshot(wheel, log_pos, None if read_time == _NO_TIME else read_time, tail_crc, path)


def write_snapshot(directory: str, image: WheelImage) -> str:
    """Write ``TimerWheel.snapshot()`` atomically (temp file, fsync, rename), keeping the previous one.

    Touches no wheel, so it may run on a worker thread.
    """
    path = os.path.join(directory, WHEEL_FILE)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(image.head + image.crc().to_bytes(4, "big"))
        f.write(image.slots)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(path):
        os.replace(path, path + PREVIOUS_SUFFIX)
    os.replace(tmp, path)
    fsync_dir(directory)
    return path
