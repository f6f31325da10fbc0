"""The garbage collector's settings for a serving process, applied once start-up is done."""

import gc

from twisted.internet.task import LoopingCall

# Young-generation collections after this many net allocations, the middle one every 10 young ones, a full
# pass every 10 middle ones. The default 700 runs a young pass every few dozen messages on the MQTT fan-in
# path, catching a tick's short-lived objects alive and promoting them; fewer passes cost less CPU per message
# without longer reactor stalls (bench/cost_bench.py, bench/stall_bench.py; figures in docs/tuning.md).
GC_THRESHOLDS = (50_000, 10, 10)
BACKSTOP_INTERVAL = 1.0  # seconds: a process with no store drains still collects this often when a pass is due


def settle() -> None:
    """Keep everything alive now out of the collector's passes, then collect less often."""
    # What start-up built (modules, recovered state) stays alive: out of the full passes, which stop the
    # reactor for as long as they walk the heap (measured: about half the pause).
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


class TickCollector:
    """``TickCollector(clock)``: the collector's passes at the end of a store drain, not in the middle of a batch.

    A fan-in tick holds thousands of PUBLISHes alive at once (parsed, then
    encoded, dispatched and delivered in one drain) and every one of them is
    dead when the drain returns. CPython's own trigger fires on allocation, so
    its passes land inside the batch and walk all of it, then promote it to
    be walked again. With automatic collection off, ``collect_due`` (called by
    the store after each drain, and by a backstop timer for the times no
    drain runs) makes the pass CPython would have made, at a point where only
    what lives on is left to walk: 12 % of a QoS 0 fan-in's time went to
    passes that found nothing (measured with gc.callbacks), 4 % after.
    """

    def __init__(self, clock, thresholds: tuple[int, int, int] = GC_THRESHOLDS,
                 interval: float = BACKSTOP_INTERVAL) -> None:
        self.thresholds = thresholds
        self.interval = interval
        self.passes = [0, 0, 0]  # passes made here, per generation (stats, tests)
        self._loop = LoopingCall(self.collect_due)
        self._loop.clock = clock
        self._enabled_before = None

    def start(self) -> None:
        """Freeze what start-up built, then take the collector's timing over."""
        settle()  # the thresholds are still read by anything that asks; the passes are made here
        gc.set_threshold(*self.thresholds)
        self._enabled_before = gc.isenabled()
        gc.disable()
        self._loop.start(self.interval, now=False)

    def stop(self) -> None:
        """Hand the timing back to CPython (shutdown, and in-process tests, keep collecting)."""
        if self._loop.running:
            self._loop.stop()
        if self._enabled_before:
            gc.enable()
        self._enabled_before = None

    def collect_due(self) -> int | None:
        """Make the pass CPython's allocation trigger would have made by now, if any; return its generation."""
        if self._enabled_before is None:
            return None  # not started (or stopped): CPython collects by itself
        young, middle, old = gc.get_count()
        t_young, t_middle, t_old = self.thresholds
        if young <= t_young:
            return None
        # CPython's order: the oldest generation whose count passed its threshold. Its extra rule for full
        # passes (only when the long-lived heap grew by a quarter) reads counters Python cannot see: a full
        # pass here comes every t_middle * t_old young ones, which the frozen start-up heap keeps short.
        generation = 2 if old > t_old else 1 if middle > t_middle else 0
        gc.collect(generation)
        self.passes[generation] += 1
        return generation
