"""Broker-group replication: the Twisted adapters of the store's sans-IO HA logic (``store.ha_*``).

``master`` listens on the ``ha`` port and runs one ``MasterConnection`` per slave, the
SyncStateSet and the confirm offset (with waiters for the acknowledgement policy);
``slave`` connects to its master's ``ha`` port, applies the handshake's truncation and the
records it receives to its store, and acks. Both prove the cluster secret to each other
(HMAC-SHA256 challenge and response, ``store.ha_codec``); ``ssl:`` endpoints work as any.
"""
