"""The native protocol: JSON queues for backend services (queue_server semantics, made durable).

Framing: one JSON object per request and per reply; over TCP one per line
(``\\n``; pipelining allowed: requests take effect in the order they were
sent, as if each waited for the reply of the one before on the same queue, and
replies come in request order), over UDP one per datagram (at most
``native.max_datagram_bytes``; each datagram on its own). Every reply echoes
``action``, ``queue``, ``topic``, ``group`` and ``seq`` when the request had
them well-formed. ``code`` is 0 (ok) or -1 (error, with ``reason``); the
connection stays usable after any error. ``-2`` (redirect, ``leader_id``) is
reserved for the clustered roles.

Actions (``action`` is the integer code or its name):

====  =======================  ====================================================================
code  name                     request fields -> reply fields
====  =======================  ====================================================================
1     produce                  ``queue`` | ``topic``, ``data``, ``delay``, ``ttl``, ``retry``
                               [topic: ``qos`` (default 1), ``retain``] -> ``msg_id``, ``node_id``;
                               batch: ``batch: [data | {data, delay, ttl, retry, qos, retain}]``
                               (top-level delay/ttl/retry/qos/retain are defaults) -> ``msg_ids``, ``count``
2     consume                  ``queue`` | ``topic`` [, ``group``] -> ``msg_id``, ``data`` (absent: nothing ready)
3     confirm                  ``queue`` | ``topic``, ``msg_id`` [, ``group``] -> ``msg_id``
4     monitor                  ``queue`` | ``topic`` -> ``size``, ``max_size``, ``max_id``, ``inflight``,
                               ``wait_status`` (0 ok, 1 over 80 % of max_size, 2 full), ``node_id``
7     queue_list               [``limit`` (1-1000, default ``native.list_page_size``), ``cursor``]
                               -> ``queues`` [{queue, size, max_size, max_id, inflight, wait_status}],
                               ``virtual_queues``, ``topics`` (topic consume queues seen since start),
                               ``cursor`` (when more remain: send it back for the next page); TCP only
11    pop                      ``queue`` | ``topic``, [``group`` (default "default"), ``invisible_time`` s
                               (default 30)] -> ``msg_id``, ``data`` [, ``attempts`` when redelivered]
12    ack                      ``queue`` | ``topic``, ``msg_id`` [, ``group``] -> ``msg_id``
13    change_invisible_time    ``queue`` | ``topic``, ``msg_id``, ``invisible_time`` [, ``group``] -> ``visible_at`` (ms)
14    cancel_timer             ``msg_id`` (a delayed produce's) -> ``cancelled`` (false: it had come due)
104   node_monitor             -> ``node_id``, ``queue_count``, ``consumer_count``, ``inflight``, ``trans_id``
                               (commit-log end offset), ``uptime_s``, ``requests``
107   node_queue_list          as 7 (a single node holds every queue)
auth  auth                     ``token`` -> (nothing more): presents ``native.token`` (see below)
====  =======================  ====================================================================

Token: with ``native.token`` set, a TCP connection's first request must carry
``"token"``: ``{"action": "auth", "token": "..."}``, or a ``token`` field on
any first request. Over UDP every datagram carries it. A wrong or missing token
is answered ``{"code": -1, "reason": ...}``, and a TCP connection is then
closed. Tokens are compared in constant time (``hmac.compare_digest``).

Semantics:

- ``delay``, ``ttl``, ``retry`` and ``invisible_time`` are integer seconds
  relative to the request (missing: ``ttl`` 86,400 for queues, ``delay`` 0,
  ``retry`` 0); ``ttl`` must be greater than ``delay``. An expired message is
  never delivered. ``ttl`` on a topic produce becomes the MQTT message expiry.
- ``retry=0``: at-most-once, a consumed message is gone. ``retry>0``:
  at-least-once, a consumed message is invisible for ``retry`` s and comes back
  (to any consumer of the queue) unless confirmed, until its ``ttl`` runs out.
- Plain ``consume``/``confirm`` on a queue share the queue's own cursor: each
  message goes to one consumer. A ``group`` gives an independent cursor
  (fan-out: every group sees every message).
- ``pop``: POP consumption. Each pop hands out the next message of the
  (queue or topic, group) to whoever asks, one by one, so consumers of a
  group share the load; the message is invisible for ``invisible_time`` and
  comes back unless ``ack``-ed (whatever its ``retry``). On a queue, ``pop``,
  ``ack`` and ``change_invisible_time`` default to group "default", a position
  apart from the queue's own cursor that plain ``consume``/``confirm`` use, so
  a message consumed and confirmed is still popped once by that group (and the
  other way round); name the same ``group`` on both to share one position.
- Device -> backend: ``consume``/``pop`` with ``topic`` read the topic consume
  queue of MQTT publishes (keyed by the topic's first level: ``"topic": "dev"``
  and ``"topic": "dev/anything"`` read the same queue), with a per-group offset
  (default group "default"). Replies add ``msg_topic`` (the full topic),
  ``qos`` and ``client_id``; ``msg_id`` is the publish's commit-log offset.
- Backend -> device: ``produce`` with ``topic`` stores an MQTT publish; MQTT
  subscribers of matching filters receive it.
- Data is a string stored as UTF-8; with ``"encoding": "base64"`` a produce's
  ``data`` is base64 of the bytes. A stored body that is not UTF-8 is returned
  as base64 with ``"encoding": "base64"`` in the reply.
- A full queue (ready + in flight >= ``native.max_queue_size``) answers an
  error. Virtual queues (``native.virtual_queues``) only take writes: a produce
  is stored once and indexed in each real queue.
- Every reply is sent once its effect is durable (record written, consumer
  state committed to the KV under ``DATA_DIR/native``): a kill -9 may redeliver
  an at-least-once message, and loses no acknowledged produce or confirm. An
  acknowledged message is delivered, or its loss under a disk quota (store
  retention) is counted and logged.
"""
