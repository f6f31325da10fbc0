"""Summarise a py-spy raw profile (``--profile-format raw``): where the broker spends its samples.

    python -m bench.profile_summary bench/out/profile-twistmq-s1-r1-STAMP.txt [--top 25] [--match mqtt_proxy]

Prints the functions with the most samples on top of the stack (self) and in
the stack (inclusive), as shares of all samples. ``--match`` keeps only
frames whose text contains the string (e.g. a package) in the inclusive list.
"""

import argparse
import sys
from collections import Counter


def load(path):
    """``[(frames, count)]`` from py-spy's raw (collapsed stack) output."""
    stacks = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            try:
                stacks.append((stack.split(";"), int(count)))
            except ValueError:
                continue
    return stacks


def summarise(stacks, top=25, match=None):
    """The report text for ``stacks``."""
    total = sum(n for _, n in stacks) or 1
    own, incl = Counter(), Counter()
    for frames, n in stacks:
        own[frames[-1]] += n
        for frame in set(frames):
            if match is None or match in frame:
                incl[frame] += n
    lines = [f"{total} samples", "", "self (top of stack):"]
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(top)]
    lines += ["", "inclusive" + (f" (frames containing {match!r})" if match else "") + ":"]
    lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in incl.most_common(top)]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--match", default=None)
    args = parser.parse_args(argv)
    print(summarise(load(args.profile), args.top, args.match))
    return 0


if __name__ == "__main__":
    sys.exit(main())
