"""bench.cluster_bench's derived rows: ratios over the node and the per-core projection from measured CPU."""

from bench import cluster_bench


def _run(rate, delivered, cpu_s):
    return {"figures": {"rate": rate}, "delivered": delivered, "cluster_cpu_s": cpu_s}


def test_the_projection_takes_the_dearer_measured_cost_and_compares_with_one_node_and_mosquitto():
    """16 cores at the dearer of the measured costs per message, over the node's and Mosquitto's one-core rates."""
    results = {(2, "node"): [_run(100_000, 1_000_000, 9.0)], (2, "mosquitto"): [_run(180_000, 1_000_000, 5.0)],
               (2, "1 proxy"): [_run(50_000, 1_000_000, 15.0)], (2, "2x2"): [_run(80_000, 1_000_000, 20.0)]}
    lines = cluster_bench.table_lines([cluster_bench.SingleSetup("mosquitto", "mosquitto"),
                                       cluster_bench.SingleSetup("twistmq", "node"), cluster_bench.ClusterSetup(1),
                                       cluster_bench.ClusterSetup(2, groups=2)], results)
    projection = next(line for line in lines if line.startswith("- projection"))
    # 20 µs per message (the 2x2's): 50,000 msg/s a core, 800,000 on 16 cores; 8.0x the node, 4.4x Mosquitto
    assert "15.00 µs per message with 1 proxy, 20.00 µs per message with 2x2" in projection
    assert "800,000 msg/s" in projection and "8.0× one node" in projection and "4.4× Mosquitto" in projection


def test_no_projection_without_a_cluster_cost():
    """Without a cluster setup's CPU figure there is nothing to project from."""
    results = {(2, "node"): [_run(100_000, 1_000_000, 9.0)]}
    lines = cluster_bench.table_lines([cluster_bench.SingleSetup("twistmq", "node")], results)
    assert not any(line.startswith("- projection") for line in lines)
