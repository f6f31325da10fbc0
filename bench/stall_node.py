"""Run ``twistd -n twistmq node`` from any checkout with a reactor-lateness probe added (for stall_bench).

    python bench/stall_node.py --repo PATH --samples FILE [--probe-ms 10] -- NODE ARGS...

Puts ``PATH`` first on ``sys.path`` (so its ``mqtt_proxy`` and its
``twisted/plugins`` win over any other checkout), schedules a probe on the
reactor every ``--probe-ms`` and records how late each one ran (actual minus
expected time), then runs twistd in this process exactly as ``./dev run``
would. Once the reactor stops the samples go to ``FILE`` as JSON ``[[unix_time, lateness_s],
...]``. The probe lives here, not in the node, so a checkout that predates
the node's own lag gauge is measured the same way.
"""

import argparse
import json
import os
import sys
import time


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: stall_node.py --repo PATH --samples FILE [--probe-ms MS] -- NODE ARGS")
    cut = argv.index("--")
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", required=True)
    parser.add_argument("--samples", required=True)
    parser.add_argument("--probe-ms", type=float, default=10.0)
    args = parser.parse_args(argv[:cut])
    repo = os.path.abspath(args.repo)
    sys.path.insert(0, repo)  # before anything imports twisted.plugins: its __path__ is built from sys.path

    from twisted.internet import reactor  # this process is a composition root of its own
    from twisted.scripts import twistd

    interval = args.probe_ms / 1000.0
    samples = []

    def probe(expected):
        now = time.monotonic()
        samples.append((time.time(), now - expected))
        reactor.callLater(interval, probe, now + interval)

    reactor.callWhenRunning(lambda: reactor.callLater(interval, probe, time.monotonic() + interval))

    def dump():
        with open(args.samples, "w") as f:
            json.dump(samples, f)

    # twistd re-raises the SIGTERM that stopped it once the reactor is done, so atexit would not run.
    reactor.addSystemEventTrigger("after", "shutdown", dump)
    sys.argv = ["twistd", "-n", "--pidfile=", "twistmq", "node"] + argv[cut + 1:]
    twistd.run()


if __name__ == "__main__":
    main()
