"""Unit tests of the topic-filter trie, checked against the reference matcher."""

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from lightqueue.topic import TopicError, filter_matches
from lightqueue.topic_trie import FilterShapeLimit, TopicTrie

from tests.unit.test_topic import SPEC_EXAMPLES

# A small alphabet of levels so that filters and topics collide often.
_TOPIC_LEVELS = ["a", "b", "", "$x"]
_FILTER_LEVELS = _TOPIC_LEVELS + ["+"]

topics = st.lists(st.sampled_from(_TOPIC_LEVELS), min_size=1, max_size=4).map("/".join).filter(bool)
filters = st.builds(
    lambda levels, hash_last: "/".join(levels + ["#"] if hash_last else levels),
    st.lists(st.sampled_from(_FILTER_LEVELS), min_size=0, max_size=4),
    st.booleans(),
).filter(bool)


def _expected(stored, topic):
    """Return the stored filters the reference matcher says match *topic*."""
    return sorted(f for f in stored if filter_matches(f, topic))


def _prefix_nodes(stored):
    """Count the nodes a fully pruned trie holding *stored* has: the root plus one per distinct prefix."""
    prefixes = set()
    for topic_filter in stored:
        levels = topic_filter.split("/")
        if levels[-1] == "#":
            levels.pop()
        prefixes.update(tuple(levels[:cut]) for cut in range(1, len(levels) + 1))
    return 1 + len(prefixes)


@pytest.mark.parametrize("topic_filter,topic,expected", SPEC_EXAMPLES)
def test_spec_examples_alone(topic_filter, topic, expected):
    """A trie holding one filter of the MQTT 4.7 examples matches as the spec says."""
    trie = TopicTrie()
    trie.add(topic_filter)
    assert trie.match(topic) == ([topic_filter] if expected else [])


def test_spec_examples_together():
    """A trie holding every filter of the MQTT 4.7 examples returns, per topic, exactly the matching ones."""
    trie = TopicTrie()
    stored = {f for f, _, _ in SPEC_EXAMPLES}
    for topic_filter in stored:
        trie.add(topic_filter)
    for _, topic, _ in SPEC_EXAMPLES:
        assert sorted(trie.match(topic)) == _expected(stored, topic), topic


def test_dollar_topics_skip_wildcard_first_filters():
    """'#' and '+/...' do not match $SYS topics, '$SYS/#' does, also for the parent level (MQTT-4.7.2-1)."""
    trie = TopicTrie()
    for topic_filter in ("#", "+/#", "+", "$SYS/#", "$SYS"):
        trie.add(topic_filter)
    assert sorted(trie.match("$SYS")) == ["$SYS", "$SYS/#"]
    assert trie.match("$SYS/broker") == ["$SYS/#"]
    assert sorted(trie.match("SYS")) == ["#", "+", "+/#"]


def test_reference_counts():
    """add/remove report only the 0 -> 1 and 1 -> 0 transitions; count follows each call."""
    trie = TopicTrie()
    assert trie.add("a/+") is True
    assert trie.add("a/+") is False
    assert (trie.count("a/+"), len(trie), "a/+" in trie) == (2, 1, True)
    assert trie.remove("a/+") is False
    assert trie.match("a/b") == ["a/+"]
    assert trie.remove("a/+") is True
    assert (trie.count("a/+"), len(trie), "a/+" in trie, trie.match("a/b")) == (0, 0, False, [])


def test_remove_unknown_filter_raises_key_error():
    """Removing a filter that is not stored (or no longer stored) raises KeyError."""
    trie = TopicTrie()
    with pytest.raises(KeyError):
        trie.remove("a/b")
    trie.add("a/b")
    trie.remove("a/b")
    with pytest.raises(KeyError):
        trie.remove("a/b")
    with pytest.raises(KeyError):
        trie.remove("a")  # a prefix of a once-stored filter is not a filter


def test_add_rejects_invalid_filters():
    """An invalid filter raises TopicError and leaves the trie empty."""
    trie = TopicTrie()
    for bad in ("", "a/#/b", "a+", "a/\x00"):
        with pytest.raises(TopicError):
            trie.add(bad)
    assert (len(trie), trie.node_count()) == (0, 1)


def test_iteration_lists_distinct_filters():
    """Iterating yields each stored filter once, in insertion order."""
    trie = TopicTrie()
    for topic_filter in ("b/#", "a", "b/#", "+/+"):
        trie.add(topic_filter)
    assert list(trie) == ["b/#", "a", "+/+"]


def test_removal_prunes_every_node():
    """After adding and removing many overlapping filters the trie is back to its bare root."""
    trie = TopicTrie()
    assert trie.node_count() == 1
    stored = [f"dev/{i}/temp" for i in range(200)] + [f"dev/{i}/+" for i in range(200)]
    stored += [f"site/{i % 10}/#" for i in range(200)] + ["#", "+/+/+/#", "dev/+/temp", "dev//+/"]
    for topic_filter in stored:
        trie.add(topic_filter)
    assert trie.node_count() == _prefix_nodes(set(stored))
    for topic_filter in reversed(stored[::2]):
        trie.remove(topic_filter)
    assert trie.node_count() == _prefix_nodes(set(stored[1::2]))
    for topic_filter in stored[1::2]:
        trie.remove(topic_filter)
    assert (len(trie), trie.node_count()) == (0, 1)
    assert trie._root.children is None  # the emptied child dicts are released too


def test_match_returns_each_filter_once():
    """A filter reachable through several wildcard paths is still reported once."""
    trie = TopicTrie()
    for topic_filter in ("+/+/#", "a/#", "#", "a/+/c", "+/b/+", "a/b/c", "a/b/c/#"):
        trie.add(topic_filter)
    found = trie.match("a/b/c")
    assert sorted(found) == sorted(set(found))
    assert len(found) == 7


@settings(max_examples=300, deadline=None)
@given(stored=st.lists(filters, max_size=30), topic=topics)
def test_match_agrees_with_reference(stored, topic):
    """For random filter sets and topics, TopicTrie.match equals the naive filter_matches scan."""
    trie = TopicTrie()
    for topic_filter in stored:
        trie.add(topic_filter)
    found = trie.match(topic)
    assert len(found) == len(set(found))
    assert sorted(found) == _expected(set(stored), topic)


class TrieMachine(RuleBasedStateMachine):
    """A model-based test: the trie behaves like a Counter of filters scanned with filter_matches."""

    added = Bundle("added")

    def __init__(self):
        super().__init__()
        self.trie = TopicTrie()
        self.model: dict[str, int] = {}

    @rule(target=added, topic_filter=filters)
    def add(self, topic_filter):
        """Adding reports newness exactly when the model count was 0."""
        assert self.trie.add(topic_filter) is (topic_filter not in self.model)
        self.model[topic_filter] = self.model.get(topic_filter, 0) + 1
        return topic_filter

    @rule(topic_filter=consumes(added))
    def remove(self, topic_filter):
        """Removing reports the filter gone exactly when the model count reaches 0."""
        self.model[topic_filter] -= 1
        gone = self.model[topic_filter] == 0
        if gone:
            del self.model[topic_filter]
        assert self.trie.remove(topic_filter) is gone

    @rule(topic_filter=filters)
    def remove_unknown(self, topic_filter):
        """Removing a filter the model does not hold raises KeyError and changes nothing."""
        if topic_filter in self.model:
            return
        with pytest.raises(KeyError):
            self.trie.remove(topic_filter)

    @rule(topic=topics)
    def match(self, topic):
        """match returns each stored matching filter once, as the reference says."""
        found = self.trie.match(topic)
        assert len(found) == len(set(found))
        assert sorted(found) == _expected(self.model, topic)

    @invariant()
    def counts_and_nodes_agree(self):
        """Counts, length, membership and the pruned node count follow the model."""
        assert len(self.trie) == len(self.model)
        assert sorted(self.trie) == sorted(self.model)
        for topic_filter, count in self.model.items():
            assert topic_filter in self.trie and self.trie.count(topic_filter) == count
        assert self.trie.node_count() == _prefix_nodes(self.model)


TrieMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_trie_state_machine = TrieMachine.TestCase


# -- the shape cap (issue 26) -----------------------------------------------------------------------

def _shapes(stored):
    """The distinct (depth, + positions) of every stored prefix: what the cap counts, computed naively."""
    out = set()
    for f in stored:
        mask = 0
        for depth, level in enumerate(f.split("/")):
            if level == "#":
                break
            if level == "+":
                mask |= 1 << depth
            out.add((depth, mask))
    return out


def test_shape_cap_refuses_a_filter_and_leaves_the_trie_unchanged():
    """A filter that would pass max_shapes is refused (FilterShapeLimit); stored filters still match."""
    trie = TopicTrie(max_shapes=5)
    assert trie.add("a/+/c")  # shapes (0,0) (1,2) (2,2)
    assert trie.add("b/+/d")  # same shapes
    with pytest.raises(FilterShapeLimit):
        trie.add("+/+/+")  # three new shapes: 6 > 5
    assert "+/+/+" not in trie and trie.shapes == 3 and trie.refused == 1
    assert trie.add("x/y")  # one new shape (1, 0): 4
    assert sorted(trie.match("a/q/c")) == ["a/+/c"]
    trie.remove("a/+/c")
    trie.remove("b/+/d")
    assert trie.shapes == 2  # (0,0) (1,0) of x/y: removal frees shapes
    assert trie.add("+/+/+")  # 5


def test_a_restored_filter_is_never_refused_for_the_shape_cap():
    """An uncapped add (a subscription accepted before a restart) may pass max_shapes; capped adds then refuse."""
    trie = TopicTrie(max_shapes=3)
    assert trie.add("a/+/c")  # 3 shapes: the cap
    assert trie.add("+/+/+", capped=False)  # restored: stored although it passes the cap
    assert trie.shapes == 6 and sorted(trie.match("x/y/z")) == ["+/+/+"]
    with pytest.raises(FilterShapeLimit):
        trie.add("q/r/s/+")  # a new SUBSCRIBE still meets the cap
    assert trie.add("+/+/+") is False  # another subscriber of a stored filter: counted, never refused


def test_shape_cap_bounds_the_nodes_one_match_visits():
    """However many adversarial filters are offered, the stored shapes (the visit bound) stay within the cap."""
    import random
    rng = random.Random(26)
    trie = TopicTrie(max_shapes=200)
    stored = []
    for i in range(2000):
        f = "/".join(["+" if rng.random() < 0.5 else "a" for _ in range(20)] + [f"z{i}"])
        try:
            trie.add(f)
            stored.append(f)
        except FilterShapeLimit:
            pass
    assert trie.shapes == len(_shapes(stored)) <= 200
    assert trie.node_count() - 1 >= trie.shapes
    topic = "/".join(["a"] * 20 + ["z0"])
    assert sorted(trie.match(topic)) == _expected(stored, topic)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "+"]), min_size=1, max_size=5).map("/".join).flatmap(
    lambda _: st.lists(st.lists(st.sampled_from(["a", "b", "+", "#"]), min_size=1, max_size=5).map("/".join),
                       max_size=30)))
def test_shape_count_matches_the_naive_count_under_add_and_remove(filters):
    """The trie's shape count equals the naive count of its stored prefixes, through adds and removes."""
    trie = TopicTrie()
    valid = []
    for f in filters:
        try:
            trie.add(f)
            valid.append(f)
        except TopicError:
            continue
        assert trie.shapes == len(_shapes(set(valid)))
    for f in list(valid):
        trie.remove(f)
        valid.remove(f)
        assert trie.shapes == len(_shapes(set(valid)))
