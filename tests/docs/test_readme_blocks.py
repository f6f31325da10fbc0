"""Fast checks of the README's examples: each is marked run, file or skip, and each binds 127.0.0.1 only."""

from __future__ import annotations

import re
import shlex

from tests.docs import readme

LISTENER_FLAGS = ("--mqtt", "--mqtt-tls", "--mqtt-ws", "--native", "--native-udp", "--http")


def _node_args(cmd: str) -> list[str]:
    return shlex.split(cmd, comments=True)[2:]


def _listeners(cmd: str) -> list[tuple[str, str]]:
    args, out = _node_args(cmd), []
    for i, a in enumerate(args):
        flag, eq, value = a.partition("=")
        if flag in LISTENER_FLAGS:
            out.append((flag, value if eq else args[i + 1]))
    return out


def test_every_block_is_marked():
    """Every fenced block says whether the README test runs it, writes it as a file, or skips it (and why)."""
    bad = [f"line {b.line}: {b.kind or 'no marker'}" for b in readme.blocks()
           if b.kind not in readme.KINDS or (b.kind in ("file", "skip") and not b.arg)]
    assert not bad, "README blocks need <!-- readme: run|file PATH|skip (REASON) -->: " + ", ".join(bad)


def test_parser_reads_markers_and_sections():
    """The parser ties a marker to the block right after it only, and records the section."""
    text = ("## A\n<!-- readme: skip (why) -->\n```sh\necho a\n```\n"
            "<!-- readme: run -->\nprose\n```sh\necho b \\\n  c\n```\n## B\n<!-- readme: file /tmp/twistmq/x.py -->\n"
            "```python\nx = 1\n```\n")
    got = readme.blocks(text)
    assert [(b.kind, b.arg, b.section) for b in got] == [("skip", "why", "A"), (None, "", "A"),
                                                         ("file", "/tmp/twistmq/x.py", "B")]
    assert readme.commands(got[1].text) == ["echo b    c"]
    assert readme.steps("a\n./dev run --mqtt x\nb\nc\n") == [("shell", "a\n"), ("node", "./dev run --mqtt x"),
                                                             ("shell", "b\nc\n")]
    assert readme.is_node("/opt/twistmq/bin/twistd -n --pidfile= twistmq node --data-dir d")
    assert not readme.is_node("/opt/twistmq/bin/twistd twistmq --help")


def test_every_node_binds_loopback_listeners_only():
    """Each ./dev run example names its listeners, all on 127.0.0.1, and a data dir under /tmp/twistmq."""
    nodes = [cmd for b in readme.blocks() if b.kind == "run" for kind, cmd in readme.steps(b.text) if kind == "node"]
    assert len(nodes) >= 4
    for cmd in nodes:
        listeners = _listeners(cmd)
        assert listeners, f"{cmd!r} names no listener (the defaults would apply)"
        for flag, value in listeners:
            loopback = value.startswith("127.0.0.1:") if flag == "--native-udp" else ":interface=127.0.0.1" in value
            assert loopback, f"{flag} {value} does not bind 127.0.0.1"
        args = _node_args(cmd)
        assert args[args.index("--data-dir") + 1].startswith(readme.EXAMPLE_DIR + "/")


def test_clients_talk_to_this_machine():
    """mosquitto_pub/sub and curl in the run blocks reach 127.0.0.1 (or localhost) only."""
    for b in readme.blocks():
        if b.kind != "run":
            continue
        for cmd in readme.commands(b.text):
            for host in re.findall(r"(?:^|\s)-h\s+(\S+)", cmd):
                assert host in ("127.0.0.1", "localhost"), cmd
            for url in re.findall(r"curl\s+(?:-\S+\s+)*(\S+)", cmd):
                assert url.startswith(("127.0.0.1", "http://127.0.0.1", "localhost")), cmd


def test_files_and_data_dirs_stay_under_the_example_dir():
    """File blocks are written under /tmp/twistmq, which the README test rewrites to a temp dir."""
    files = [b.arg for b in readme.blocks() if b.kind == "file"]
    assert files and all(f.startswith(readme.EXAMPLE_DIR + "/") for f in files)
