"""The commit log and everything that must survive a crash.

Records are written once to append-only segments; consumers of the log
(light queues, the timer, replication) register as dispatchers so the log never
imports them.
"""
