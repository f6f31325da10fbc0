"""The chaos benchmark's figures from recorded times: RTO and stages per injection, losses and duplicates per window."""

from __future__ import annotations

from bench.chaos import attribute, measure, schedule
from bench.chaos_load import audit


class _Pub:
    index = 0

    def __init__(self, acks):
        self.acks = acks


class _Sub:
    def __init__(self, counts):
        self.counts = counts


def test_rto_is_the_longest_pause_between_acknowledgements_and_stages_come_from_the_log_lines():
    """Acks every 10 ms up to 99.99, none until 102.5: RTO 1.51 s from just before the fault; stages from the logs."""
    acks = [100 + i / 100 for i in range(100)] + [102.5 + i / 100 for i in range(50)]
    events = [(101.5, "controller", "x WARNING twistmq.controller broker_dead group=g1 broker=b1"),
              (101.7, "controller", "x WARNING twistmq.controller master_elected group=g1 master=b2"),
              (101.9, "broker", "x INFO twistmq.ha ha_role role=master epoch=2 start_offset=9"),
              (102.2, "proxy", "x INFO twistmq.cluster.remote.rerouting group_moved group=g1 from=a to=b"),
              (110.0, "controller", "x WARNING twistmq.controller master_elected group=g1 master=b3")]
    samples = [(100.5, 3), (101.0, 2), (103.0, None), (104.0, 3), (105.0, 3)]
    record = {"t0": 100.995}
    measure(record, 106.0, acks, events, samples, replicas=3)
    assert record["rto_s"] == 1.51 and record["outage_from_s"] == -0.005 and record["first_ack_s"] == 1.505
    assert (record["detect_s"], record["elect_s"], record["role_s"], record["route_s"]) == (0.505, 0.705, 0.905, 1.205)
    assert record["elections"] == 1  # the one at 110 is after this injection's window
    assert record["sss_full_s"] == 3.005


def test_no_pause_and_a_full_sync_state_set_report_no_outage():
    """Acks every 10 ms through the fault: no outage, the first ack after it, SyncStateSet never short (0)."""
    acks = [100 + i / 100 for i in range(300)]
    record = {"t0": 101.005}
    measure(record, 103.0, acks, [], [(101.5, 3), (102.5, 3)], replicas=3)
    assert record["rto_s"] == 0.01 and record["outage_from_s"] is None and record["first_ack_s"] == 0.005
    assert record["detect_s"] is None and record["elections"] == 0 and record["sss_full_s"] == 0.0


def test_losses_and_duplicates_go_to_the_injection_whose_window_holds_the_acknowledgement():
    """Seq 2 (acked before the first fault) is not any injection's; 3 lost and 4 twice in the first; 5 lost in the
    second; the audit sees both losses and the duplicate."""
    pub = _Pub([(1.0, 1), (2.0, 2), (10.5, 3), (11.0, 4), (20.5, 5)])
    sub = _Sub({1: 1, 4: 2})
    records = [{"t0": 10.0}, {"t0": 20.0}]
    attribute(records, [pub], [sub])
    assert [(r["lost"], r["duplicates"], r["lost_sample"]) for r in records] == [(1, 1, ["0:3@+0.500s"]),
                                                                                  (1, 0, ["0:5@+0.500s"])]
    assert audit(pub, sub) == {"acked": 5, "received": 2, "lost": [2, 3, 5], "duplicates": 1}


def test_the_schedule_holds_each_type_equally_and_depends_only_on_the_seed():
    """20 injections of 10 types: each twice; the same seed gives the same order, another seed another."""
    import random
    types = [f"t{i}" for i in range(10)]
    plan = schedule(types, 20, random.Random(7))
    assert sorted(plan) == sorted(types * 2)
    assert plan == schedule(types, 20, random.Random(7)) != schedule(types, 20, random.Random(8))
