"""Discovery: member records, their leases (renewed by heartbeats, evicted on a hashed-wheel timer) and
snowflake ids. Sans-IO where it can be: the controller role drives these objects with its reactor."""
