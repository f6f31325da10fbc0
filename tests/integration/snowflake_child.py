"""Child process for the snowflake test: lease a worker id from the controllers, print ids, deregister.

Registers as a proxy through the member agent the roles use (``cluster.roles.common.member_agent``,
with the ``[cluster]`` of CONFIG: controllers, zone), waits for its worker id, then makes COUNT
time-first ids in bursts of 2,000 per reactor turn (so some milliseconds run out of sequence
numbers) and prints ``WORKER w`` and one id per line, then stops (deregistering).
Usage: python snowflake_child.py CONFIG NODE_ID COUNT
"""

import dataclasses
import sys

from twisted.internet import reactor, task

from cluster.roles.common import member_agent
from cluster.runtime.config import load_config

BURST = 2000


def main() -> None:
    path, node_id, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg = load_config(path)
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, node_id=node_id))
    agent = member_agent(reactor, cfg, "proxy", [], lambda: True)
    agent.startService()
    made: list[int] = []
    waited = [0]

    def step() -> None:
        ids = agent.ids()
        if ids is None:
            waited[0] += 1
            if waited[0] > 3000:  # 30 s without a worker id
                print("NO_WORKER", flush=True)
                finish()
            return
        for _ in range(min(BURST, count - len(made))):
            made.append(ids.next_id())
        if len(made) >= count:
            sys.stdout.write(f"WORKER {agent.worker}\n" + "".join(f"{i}\n" for i in made))
            sys.stdout.flush()
            finish()

    def finish() -> None:
        if loop.running:
            loop.stop()
        agent.stopService().addBoth(lambda _: reactor.stop())

    loop = task.LoopingCall(step)
    loop.start(0.01)
    reactor.run()


if __name__ == "__main__":
    main()
