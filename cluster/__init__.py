"""The composition root: the roles, and everything they are composed of, in rooms.

Rooms (sub-packages), read as the architecture:

- ``roles``: one module per role (``node``, ``broker``, ``proxy``, ``controller``, ``admin``), each building its
  ``MultiService`` from options; ``common`` holds what roles share (the client-serving
  options and listeners, member ids) and ``table`` is the roles table ``tap`` reads.
- ``runtime``: the process around a role: config loading and the documented defaults,
  service-tree building blocks, listener descriptions and their exposure check,
  ``SO_REUSEPORT``, the HTTP site (health, metrics), the log, the collector, the version.
- ``local``: the store interface in-process (``LocalStore`` over the store parts a node
  or broker builds: commit log, light queues, sessions, native engine, notifier), and the
  broker's session keeper (wills and expiry of the sessions a lost proxy held).
- ``remote``: the store interface over RPC (``RemoteStore``), its broker-side server
  (``StoreServer``) and codec, the routed store over several groups (kept up with the
  controllers' metadata by ``rerouting``), the proxy's native forwarding, its watch on the
  groups it cannot reach, and the entries of its own appends that answer its sessions' reads (``own_appends``).
- ``rpc``: frames, connection state machine and Twisted protocol between nodes.
- ``admin``: the admin HTTP API, the dashboard and ``twistmq-admin``; the cluster-wide routes of the
  ``admin`` role and the calls a proxy answers it (``cluster_handlers``, ``member_calls``).
- ``controller``: the cluster metadata replicated with Raft (pysyncobj), the Raft leader's
  member leases, and the RPC members register, heartbeat and read metadata on.
- ``discovery``: member records, their leases (renewed by heartbeats, evicted on a hashed-wheel
  timer), snowflake ids, a member's agent, and RPC connections to the members the metadata lists.
- ``mongodb``: the ``[mongodb]`` section and the process's one MongoDB client (``MongoPool``: every
  ``pymongo`` call on a bounded thread pool, outages logged once and counted); what uses MongoDB
  gets it passed in.
- ``bridges``: bridges to outside systems (MongoDB), run by the broker-side roles (node, broker):
  each a durable subscriber of its filter with its own light-queue position, a retention owner;
  the pump (batching, back-off) is sans-IO over the store interface, a sink and a clock.
- ``tools``: developer tools (the local-cluster launcher, test certificates, the
  password-file editor behind ``twistmq-admin``).
- Directly here: ``tap`` (twistd's entry point) and ``routing`` (the hash-slot table, pure).

And ``replication``: broker-group replication, the Twisted adapters of the store's sans-IO HA
logic (``store.ha_*``): the master's ``ha`` listener with the SyncStateSet and confirm offset, the
slave's client that truncates, appends and acks, the switch between the two, and the replica agent that takes
the role from the controllers (RegisterBroker, BrokerHeartbeat, AlterSyncStateSet, over ``PeerClient``s handed in). It imports only
``rpc`` and ``runtime`` (roles wire it to a store); ``runtime``, ``local``, ``remote`` and ``rpc``
never import it.

Rules between the rooms (``.importlinter`` checks them in ``./dev test``): roles may import
every room, but no role module imports another; ``runtime`` imports no other room (its
config gathers ``admin.config``, ``mongodb.config`` and the like); ``local`` never imports ``remote`` and ``remote`` never
imports ``local``; ``rpc`` imports neither store implementation, nor ``runtime``; ``admin``
and ``tools`` import no role, store implementation or ``rpc``; ``routing`` imports no room; ``discovery`` imports only ``rpc`` and ``runtime``;
``controller`` imports ``rpc``, ``runtime``, ``routing`` and ``discovery`` (the lease table runs on its leader);
``mongodb`` imports no other room (``runtime.config`` gathers its config; roles, ``admin`` and ``tools`` use it);
``bridges`` reads the store only through the store interface: it imports no role, store implementation
(``local``, ``remote``), ``rpc``, ``admin``, ``tools`` or ``runtime`` (whose config gathers ``bridges.config``);
it gets ``mongodb``'s ``MongoPool`` passed in.
The rules between top-level packages are DESIGN.md's package table.
"""
