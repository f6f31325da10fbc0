"""The controller: cluster metadata replicated with Raft (pysyncobj), member leases kept by the Raft
leader, and the RPC members register, heartbeat and read metadata on."""
