"""Unit tests of the ACL file: parsing, per-user/per-client/pattern rules, deny, subscribe coverage."""

import pytest
from hypothesis import given, settings, strategies as st

from lightqueue.topic import filter_matches
from mqtt_proxy.auth.acl import ACL, ACLError, filter_covers, filters_overlap, load_acl

SAMPLE = """
# anonymous clients may read public data
topic read public/#
# everybody may write their own device tree and read $SYS uptime
pattern readwrite devices/%c/#
pattern read $SYS/broker/uptime

user alice
topic readwrite alice/#
topic deny alice/secret/#
pattern write audit/%u
topic read shared/+/status

user bob
topic write sensors/#

client sensor-7
topic write sensors/7/#
"""


@pytest.fixture
def acl():
    return ACL.parse(SAMPLE, "sample.acl", client_ids_bound=True)


def test_user_rules(acl):
    """A user gets its section's grants, with read/write/readwrite honoured."""
    assert acl.allowed("alice", "c1", "alice/notes", "write")
    assert acl.allowed("alice", "c1", "alice/notes", "read")
    assert acl.allowed("bob", "c2", "sensors/1/t", "write")
    assert not acl.allowed("bob", "c2", "sensors/1/t", "read")
    assert not acl.allowed("bob", "c2", "alice/notes", "read")


def test_default_deny(acl):
    """Anything not granted is denied once an ACL is configured."""
    assert not acl.allowed("alice", "c1", "elsewhere", "read")
    assert not acl.allowed("carol", "c3", "alice/notes", "write")


def test_deny_wins(acl):
    """A deny rule beats a broader grant."""
    assert not acl.allowed("alice", "c1", "alice/secret/key", "read")
    assert not acl.allowed("alice", "c1", "alice/secret", "write")


def test_anonymous_top_level_topics(acl):
    """Top-level topic rules apply to anonymous clients only."""
    assert acl.allowed(None, "anon", "public/news", "read")
    assert not acl.allowed(None, "anon", "public/news", "write")
    assert not acl.allowed("alice", "c1", "public/news", "read")


def test_patterns_substitute_user_and_client(acl):
    """%c and %u are replaced by the client id and the username."""
    assert acl.allowed(None, "dev-1", "devices/dev-1/temp", "write")
    assert acl.allowed("bob", "dev-2", "devices/dev-2/temp", "read")
    assert not acl.allowed("bob", "dev-2", "devices/dev-1/temp", "read")
    assert acl.allowed("alice", "c1", "audit/alice", "write")
    assert not acl.allowed("alice", "c1", "audit/bob", "write")


@pytest.mark.parametrize("client_id", ["#", "+", "a/b", ""])
def test_pattern_injection_refused(acl, client_id):
    """A client id holding a wildcard or separator does not widen a pattern."""
    assert not acl.allowed(None, client_id, "devices/x/y", "write")
    assert not acl.allowed(None, client_id, "devices/#", "write")


def test_pattern_with_user_needs_username(acl):
    """%u rules never apply to anonymous clients."""
    assert not acl.allowed(None, "c1", "audit/", "write")


def test_client_section(acl):
    """Client sections apply by client id, whoever the user is."""
    assert acl.allowed("bob", "sensor-7", "sensors/7/t", "write")
    assert acl.allowed(None, "sensor-7", "sensors/7/t", "write")
    assert not acl.allowed(None, "sensor-8", "sensors/7/t", "write")


def test_sys_needs_explicit_rule(acl):
    """$SYS topics are only reachable through rules naming $SYS (MQTT-4.7.2-1)."""
    wide = ACL.parse("pattern readwrite #\n")
    assert not wide.allowed("u", "c", "$SYS/broker/uptime", "read")
    assert wide.allowed("u", "c", "any/topic", "read")
    assert acl.allowed("bob", "c", "$SYS/broker/uptime", "read")


def test_subscribe_needs_covering_read_grant(acl):
    """A subscription is allowed only when a read grant covers the whole filter."""
    client = acl.for_client("alice", "c1")
    assert client.can_subscribe("alice/notes/+")
    assert client.can_subscribe("shared/x/status")
    assert client.can_subscribe("shared/+/status")
    assert not client.can_subscribe("shared/#")
    assert not client.can_subscribe("#")
    assert not client.can_subscribe("audit/alice")  # write-only grant


def test_subscribe_refused_when_overlapping_deny(acl):
    """A filter that could match a denied topic is refused; a disjoint one is fine."""
    client = acl.for_client("alice", "c1")
    assert not client.can_subscribe("alice/#")
    assert not client.can_subscribe("alice/+/key")
    assert client.can_subscribe("alice/public/#")
    assert not client.can_subscribe("alice/secret/key")


def test_subscribe_sys(acl):
    """Subscribing to $SYS needs a rule naming $SYS; '#' alone does not give it."""
    assert acl.can_subscribe("bob", "c", "$SYS/broker/uptime")
    assert not acl.can_subscribe("bob", "c", "$SYS/#")
    assert not ACL.parse("pattern read #\n").can_subscribe("u", "c", "$SYS/broker/uptime")


def test_allow_all_when_unconfigured():
    """No ACL file: everything is allowed."""
    acl = load_acl("")
    assert not acl.configured
    assert acl.allowed(None, "c", "x/y", "write")
    assert acl.for_client("u", "c").can_subscribe("#")


def test_access_must_be_read_or_write(acl):
    """allowed() refuses other access words."""
    with pytest.raises(ValueError):
        acl.allowed("alice", "c", "alice/x", "readwrite")


def test_access_defaults_to_readwrite():
    """A rule without an access word grants read and write."""
    acl = ACL.parse("user u\ntopic a/b\n")
    assert acl.allowed("u", "c", "a/b", "read") and acl.allowed("u", "c", "a/b", "write")


def test_filter_with_spaces():
    """Topic filters may contain spaces."""
    acl = ACL.parse("user u\ntopic read my topic/+\n")
    assert acl.allowed("u", "c", "my topic/x", "read")


@pytest.mark.parametrize("text,line", [
    ("user alice\ntopic read a/#/b\n", 2),
    ("bogus line\n", 1),
    ("\n\nuser\n", 3),
    ("user a\ntopic read\n", 2),
    ("pattern write\n", 1),
    ("topic read a+\n", 1),
])
def test_parse_errors_name_file_and_line(text, line):
    """Malformed lines are reported as file:line."""
    with pytest.raises(ACLError, match=rf"^f\.acl:{line}: "):
        ACL.parse(text, "f.acl")


@pytest.mark.parametrize("text,line,bad", [
    ("topic rw dev/#\n", 1, "'rw'"),
    ("user alice\ntopic READ alice/#\n", 2, "'READ'"),
    ("\npattern readonly devices/%c/#\n", 2, "'readonly'"),
    ("client c\ntopic\twrit\tsensors/#\n", 2, "'writ'"),
])
def test_unknown_access_word_refused(text, line, bad):
    """An unknown access word is an error naming file, line, the word and the accepted words, not a filter."""
    with pytest.raises(ACLError) as caught:
        ACL.parse(text, "f.acl", client_ids_bound=True)
    message = str(caught.value)
    assert message.startswith(f"f.acl:{line}: unknown access {bad}")
    assert "read, write, readwrite or deny" in message
    assert (caught.value.path, caught.value.line) == ("f.acl", line)
    assert "\n" not in message


def test_tabs_separate_words():
    """Words may be separated by tabs as well as spaces."""
    acl = ACL.parse("user\tu\ntopic\twrite\ta/b\n")
    assert acl.allowed("u", "c", "a/b", "write") and not acl.allowed("u", "c", "a/b", "read")


def test_filter_with_spaces_needs_an_access_word():
    """Without an access word a filter is one word: 'topic my topic' is refused, 'topic readwrite my topic' is not."""
    with pytest.raises(ACLError, match="unknown access 'my'"):
        ACL.parse("topic my topic\n", "f.acl")
    assert ACL.parse("user u\ntopic readwrite my topic\n").allowed("u", "c", "my topic", "write")


def test_not_utf8_file_refused(tmp_path):
    """A file that is not UTF-8 is an ACLError naming it (not a UnicodeDecodeError traceback)."""
    path = tmp_path / "acl"
    path.write_bytes(b"topic read caf\xe9/#\n")
    with pytest.raises(ACLError, match=rf"^{path}: not UTF-8"):
        load_acl(str(path))


def test_reload_swaps_rules_and_forgets_resolved_clients(tmp_path):
    """reload() applies a changed file to the next check, even for a client whose rules were already resolved."""
    path = tmp_path / "acl"
    path.write_text("user u\ntopic read a/#\n")
    acl = load_acl(str(path))
    assert not acl.allowed("u", "c", "a/x", "write")  # resolves (and caches) u's rules
    path.write_text("user u\ntopic readwrite a/#\n")
    acl.reload()
    assert acl.allowed("u", "c", "a/x", "write")
    assert acl.stats() == {"users": 1, "clients": 0, "rules": 1}


@pytest.mark.parametrize("content", ["user u\ntopic rw a/#\n", "user u\ntopic read a/#/b\n", None],
                         ids=["unknown-access", "bad-filter", "file-gone"])
def test_reload_of_a_bad_file_keeps_the_rules(tmp_path, content):
    """A reload that fails raises (naming file and line) and leaves every decision as it was."""
    path = tmp_path / "acl"
    path.write_text("user u\ntopic read a/#\n")
    acl = load_acl(str(path))
    if content is None:
        path.unlink()
        with pytest.raises(OSError):
            acl.reload()
    else:
        path.write_text(content)
        with pytest.raises(ACLError, match=rf"^{path}:2: "):
            acl.reload()
    assert acl.allowed("u", "c", "a/x", "read") and not acl.allowed("u", "c", "a/x", "write")
    assert acl.can_subscribe("u", "c", "a/#")


def test_allow_all_cannot_be_reloaded():
    """The ACL used when none is configured has no file to re-read."""
    with pytest.raises(ValueError):
        ACL.allow_all().reload()


def test_load_from_file(tmp_path):
    """load_acl reads a file and names it in errors."""
    path = tmp_path / "acl"
    path.write_text(SAMPLE)
    assert load_acl(str(path), client_ids_bound=True).allowed("alice", "c", "alice/x", "read")
    path.write_text("topic read a/#/b\n")
    with pytest.raises(ACLError, match=str(path) + ":1:"):
        load_acl(str(path))


_LEVELS = ["a", "b", "$s", ""]
_topics = st.lists(st.sampled_from(_LEVELS), min_size=1, max_size=4).map("/".join).filter(bool)
_filters = st.builds(
    lambda levels, hash_last: "/".join(levels + ["#"] if hash_last else levels),
    st.lists(st.sampled_from(_LEVELS + ["+"]), min_size=0, max_size=4), st.booleans()).filter(bool)


@settings(max_examples=100, deadline=None)
@given(_filters, _filters, st.lists(_topics, min_size=1, max_size=30))
def test_cover_and_overlap_agree_with_matching(grant, topic_filter, topics):
    """covers implies every sampled topic of the filter matches the grant; a shared topic implies overlap."""
    for topic in topics:
        in_filter, in_grant = filter_matches(topic_filter, topic), filter_matches(grant, topic)
        if filter_covers(grant, topic_filter) and in_filter:
            assert in_grant
        if in_filter and in_grant:
            assert filters_overlap(grant, topic_filter)


def test_cover_and_overlap_exact_on_small_universe():
    """On every small filter pair, covers and overlap equal their brute-force definitions."""
    import itertools

    levels = ["a", "$s", "+"]
    filters = []
    for depth in range(0, 3):
        for combo in itertools.product(levels, repeat=depth):
            for tail in ([], ["#"]):
                text = "/".join(list(combo) + tail)
                if text:
                    filters.append(text)
    topics = ["/".join(c) for depth in range(1, 4) for c in itertools.product(["a", "$s", "z"], repeat=depth)]
    for grant in filters:
        for topic_filter in filters:
            matched_f = [t for t in topics if filter_matches(topic_filter, t)]
            covers = all(filter_matches(grant, t) for t in matched_f)
            overlap = any(filter_matches(grant, t) for t in matched_f)
            assert filter_covers(grant, topic_filter) == covers, (grant, topic_filter)
            assert filters_overlap(grant, topic_filter) == overlap, (grant, topic_filter)
