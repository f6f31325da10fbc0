"""The README's fenced blocks and their markers, for the tests that run them.

A fenced block is classified by an HTML comment on the last non-blank line
before it:

- ``<!-- readme: run -->``: shell commands run top to bottom by
  ``test_readme.py``; a ``./dev run`` command starts a node in the background
  (it stays up until the next ``##`` section), every other line runs in one
  ``bash -e -o pipefail`` script per stretch of lines;
- ``<!-- readme: file PATH -->``: written to PATH before the blocks after it run;
- ``<!-- readme: install -->``: the Install section's commands, run by
  ``test_install.py`` (not by ``test_readme.py``) against a wheel installed in a
  fresh virtual environment outside the checkout; a ``twistd -n ... twistmq node``
  command starts a node in the background, as ``./dev run`` does;
- ``<!-- readme: skip (REASON) -->``: not run, and REASON says why.

Every block must carry one (``test_readme_blocks.py`` checks), so a new
example is either run or explicitly left out.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")

MARKER = re.compile(r"^<!--\s*readme:\s*(\w+)\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)\s*$")
KINDS = ("run", "file", "skip", "install")
EXAMPLE_DIR = "/tmp/twistmq"  # every example writes under here (rewritten to a temp dir by the tests)


@dataclass(frozen=True)
class Block:
    """One fenced block of the README."""

    kind: str | None  # "run", "file", "skip", or None when unmarked
    arg: str  # the file's path, or the reason for skipping
    lang: str
    text: str
    section: str  # the "## " heading the block is under
    line: int  # 1-based line of the opening fence


def blocks(text: str | None = None) -> list[Block]:
    """Every fenced block of ``text`` (the README by default), in order."""
    if text is None:
        with open(README, encoding="utf-8") as f:
            text = f.read()
    lines = text.splitlines()
    out: list[Block] = []
    section, marker, i = "", None, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        m = MARKER.match(line)
        f = FENCE.match(line)
        if m:
            marker = (m.group(1), m.group(2).strip().removeprefix("(").removesuffix(")"))
        elif f:
            fence, start, body = f.group(1), i, []
            i += 1
            while i < len(lines) and not lines[i].startswith(fence):
                body.append(lines[i])
                i += 1
            kind, arg = marker or (None, "")
            out.append(Block(kind, arg, f.group(2), "\n".join(body) + "\n", section, start + 1))
            marker = None
        elif line.strip():
            marker = None  # a marker applies only to the block right after it
        i += 1
    return out


def commands(script: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, blank lines dropped."""
    out, current = [], ""
    for line in script.splitlines():
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        if current.strip():
            out.append(current.strip())
        current = ""
    if current.strip():
        out.append(current.strip())
    return out


def is_node(command: str) -> bool:
    """A command that starts a node (runs until stopped): ``./dev run``, or an installed ``twistd -n`` one."""
    if command.startswith("./dev run ") or command == "./dev run":
        return True
    words = command.split()
    return bool(words) and words[0].endswith("/twistd") and "-n" in words and "twistmq" in words


def steps(script: str) -> list[tuple[str, str]]:
    """A run block as ("node", command) and ("shell", lines) steps, in order."""
    out: list[tuple[str, str]] = []
    shell: list[str] = []
    for cmd in commands(script):
        if is_node(cmd):
            if shell:
                out.append(("shell", "\n".join(shell) + "\n"))
                shell = []
            out.append(("node", cmd))
        else:
            shell.append(cmd)
    if shell:
        out.append(("shell", "\n".join(shell) + "\n"))
    return out


def file_block(name: str) -> Block:
    """The ``file`` block whose path ends with ``name``."""
    found = [b for b in blocks() if b.kind == "file" and os.path.basename(b.arg) == name]
    if len(found) != 1:
        raise LookupError(f"README.md has {len(found)} file blocks named {name}")
    return found[0]
