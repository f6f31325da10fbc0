"""The garbage collector's settings for a serving process, applied once start-up is done."""

import gc

# Young-generation collections after this many net allocations, the middle one every 10 young ones, a full
# pass every 10 middle ones (and only when the long-lived heap grew by a quarter, CPython's own rule). The
# default 700 runs a young pass every few dozen messages on the MQTT fan-in path; at 10,000 the node's CPU
# per fan-in message fell by about 15 %, at 50,000 by 2-7 % more (node CPU read from /proc by
# bench/cost_bench.py; fewer passes catch a tick's short-lived objects alive and promote them), and
# bench/stall_bench.py's reactor lateness did not grow (max 10.9 ms against 72 ms at 10,000, one run).
GC_THRESHOLDS = (50_000, 10, 10)


def settle() -> None:
    """Keep everything alive now out of the collector's passes, then collect less often."""
    # What start-up built (modules, recovered state) stays alive: out of the full passes, which stop the
    # reactor for as long as they walk the heap (measured: about half the pause).
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
