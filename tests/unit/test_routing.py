"""Hash slots and routes: which broker group owns a topic, a native queue, a session."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from cluster.routing import SLOT_COUNT, RoutingError, SlotTable, even_slots, parse_ranges, slot_of
from lightqueue.names import lmq_name, native_queue_name, topic_queue_name


def test_slot_of_is_stable_across_processes():
    """Slots come from CRC32C, not hash(): the same key maps to the same slot in every process."""
    assert slot_of("sensors") == slot_of("sensors")
    assert slot_of("") == 0  # crc32c(b"") == 0
    assert [slot_of(k) for k in ("a", "b", "sensors")] == [slot_of(k) for k in ("a", "b", "sensors")]
    assert all(0 <= slot_of(str(n)) < SLOT_COUNT for n in range(1000))


def test_even_slots_cover_every_slot_once():
    """The default assignment gives contiguous near-equal ranges covering 0..1023 exactly once."""
    table = SlotTable.build(("g2", "g1", "g3"))
    assert set(table.slots) == {"g1", "g2", "g3"}
    sizes = [table.slots.count(g) for g in table.groups]
    assert sum(sizes) == SLOT_COUNT and max(sizes) - min(sizes) <= 1
    assert table.slot_ranges() == even_slots(("g1", "g2", "g3"))


def test_bad_tables_are_refused_with_a_reason():
    """A slot assigned twice, a slot unassigned, an unknown group or route: a RoutingError naming it."""
    with pytest.raises(RoutingError, match="assigned twice"):
        SlotTable.build(("g1", "g2"), {"g1": ((0, 600),), "g2": ((600, 1023),)})
    with pytest.raises(RoutingError, match="unassigned"):
        SlotTable.build(("g1", "g2"), {"g1": ((0, 500),), "g2": ((600, 1023),)})
    with pytest.raises(RoutingError, match="unknown group"):
        SlotTable.build(("g1",), {"g9": ((0, 1023),)})
    with pytest.raises(RoutingError, match="route 'x'"):
        SlotTable.build(("g1",), routes={"x": "g9"})
    with pytest.raises(RoutingError, match="outside"):
        parse_ranges("0-1024")
    assert parse_ranges("0-511, 700") == ((0, 511), (700, 700))


def test_topic_routes_by_first_level_and_explicit_routes_win():
    """Every topic under one first level lands in one group (per-topic order); a route overrides the slot."""
    table = SlotTable.build(("g1", "g2"))
    assert table.group_of_topic("dev/1/temp") == table.group_of_topic("dev/2/hum") == table.slots[slot_of("dev")]
    other = "g1" if table.group_of_topic("dev/x") == "g2" else "g2"
    routed = SlotTable.build(("g1", "g2"), routes={"dev": other})
    assert routed.group_of_topic("dev/1/temp") == other


def test_filters_span_groups_only_when_they_start_with_a_wildcard():
    """A filter with a literal first level is read from one group; '+/...' and '#' from every group."""
    table = SlotTable.build(("g1", "g2"))
    assert table.groups_of_filter("dev/+/temp") == (table.group_of_topic("dev"),)
    assert table.groups_of_filter("+/chk/#") == ("g1", "g2")
    assert table.groups_of_filter("#") == ("g1", "g2")
    assert table.groups_of_queue_name(lmq_name("+/chk/#")) == ("g1", "g2")
    assert table.groups_of_queue_name(topic_queue_name("dev/1")) == (table.group_of_topic("dev"),)
    assert table.groups_of_queue_name(native_queue_name("jobs")) == (table.group_of_queue("jobs"),)


@given(st.text(min_size=0, max_size=40))
def test_every_key_has_exactly_one_owner(key):
    """Any client id, queue or first level maps to one configured group."""
    table = SlotTable.build(("a", "b", "c"))
    assert table.group_of_client(key) in table.groups
    assert table.group_of_queue(key) in table.groups
    assert table.group_of_topic(key.replace("/", "")) in table.groups
