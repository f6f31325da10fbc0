"""Topic-matching benchmark: per-publish CPU of the topic-filter trie under adversarial filter sets.

Run: ``.venv/bin/python -m bench.topic_match_bench [--filters 100000] [--publishes 2000]``.

Each row stores up to ``--filters`` filters of one kind in a ``TopicTrie`` (the
one the light-queue resolver asks once per publish), first with the shape cap
the broker runs with (``[store] max_filter_shapes``), then, for comparison,
with no cap (``--uncapped-filters`` of them: an uncapped adversarial trie is
slow to even build), and times ``match`` over a varying set of topics built to
walk as much of the trie as possible (the resolver's per-topic cache cannot
help: every topic differs). Filter kinds:

- ``mixed``: 32 levels, each ``+`` or the literal ``a`` at random, ending in a
  literal no topic has: every prefix agrees with the topic ``a/a/.../a`` and
  nothing matches (the walk of issue 26: 50 ms a publish at 10,000 filters);
- ``mixed-matching``: the same without the last level, so every filter matches;
- ``plus-tail``: ``+/+/.../+/x<i>``, 32 levels: one long ``+`` chain, a wide last level;
- ``literal``: distinct 4-level literal filters, the usual IoT set;
- ``hash-ladder``: ``a/a/.../#`` at every depth over distinct first levels.

Prints a markdown table: filters stored (and refused by the cap), shapes, and
CPU microseconds per publish (process time, mean and worst batch of 100).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from lightqueue.topic_trie import FilterShapeLimit, TopicTrie
from store.config import StoreConfig

LEVELS = 32


def mixed(n: int, rng: random.Random, tail: bool = True) -> list[str]:
    out = []
    for i in range(n):
        levels = ["+" if rng.random() < 0.5 else "a" for _ in range(LEVELS - 1)]
        out.append("/".join(levels + ([f"z{i}"] if tail else ["a"])))
    return out


def filter_sets(n: int, rng: random.Random) -> dict[str, tuple[list[str], list[str]]]:
    """kind -> (filters, topics to publish to)."""
    deep = "/".join(["a"] * LEVELS)
    varying = [deep[:-1] + f"v{i}" for i in range(50)] + [deep]
    return {
        "mixed": (mixed(n, rng), varying),
        "mixed-matching": (mixed(n, rng, tail=False), [deep]),
        "plus-tail": (["/".join(["+"] * (LEVELS - 1) + [f"x{i}"]) for i in range(n)],
                      ["/".join(["t"] * (LEVELS - 1) + [f"x{i}"]) for i in range(0, n, max(1, n // 50))]),
        "literal": ([f"site{i % 100}/dev{i}/sensor/temp" for i in range(n)],
                    [f"site{i % 100}/dev{i}/sensor/temp" for i in range(0, n, max(1, n // 50))]),
        "hash-ladder": ([f"r{i % 1000}/" + "/".join(["a"] * (i % LEVELS)) + "/#" for i in range(n)],
                        [f"r{i}/" + "/".join(["a"] * (LEVELS - 1)) for i in range(50)]),
    }


def build(filters: list[str], max_shapes: int) -> tuple[TopicTrie, int, float]:
    trie = TopicTrie(max_shapes)
    refused = 0
    t0 = time.process_time()
    for f in filters:
        try:
            trie.add(f)
        except FilterShapeLimit:
            refused += 1
    return trie, refused, time.process_time() - t0


def time_match(trie: TopicTrie, topics: list[str], publishes: int) -> tuple[float, float, int]:
    """(mean µs per match, worst batch-of-100 mean µs, matches returned by the last)."""
    batch = 100
    worst = 0.0
    total = 0.0
    done = 0
    found = 0
    while done < publishes:
        t0 = time.process_time()
        for i in range(batch):
            found = len(trie.match(topics[(done + i) % len(topics)]))
        spent = time.process_time() - t0
        total += spent
        worst = max(worst, spent / batch)
        done += batch
    return total / done * 1e6, worst * 1e6, found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--filters", type=int, default=100_000, help="filters per set (capped trie)")
    p.add_argument("--uncapped-filters", type=int, default=10_000, help="filters per set without the cap")
    p.add_argument("--publishes", type=int, default=2000, help="matches timed per row")
    p.add_argument("--max-shapes", type=int, default=StoreConfig().max_filter_shapes,
                   help="the cap (default: the shipped [store] max_filter_shapes)")
    p.add_argument("--seed", type=int, default=26)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    print(f"Topic matching, {LEVELS}-level adversarial filter sets; CPU per publish (process time), "
          f"{args.publishes} publishes per row, Python {sys.version.split()[0]}\n")
    print("| set | cap (max_filter_shapes) | filters offered | stored | refused | shapes | build s "
          "| µs/publish mean | µs/publish worst 100 | matches |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind, (filters, topics) in filter_sets(args.filters, rng).items():
        for cap, offered in ((args.max_shapes, filters), (0, filters[:args.uncapped_filters])):
            trie, refused, built = build(offered, cap)
            mean, worst, found = time_match(trie, topics, args.publishes)
            print(f"| {kind} | {cap or 'none'} | {len(offered)} | {len(trie)} | {refused} | {trie.shapes} "
                  f"| {built:.2f} | {mean:.1f} | {worst:.1f} | {found} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
