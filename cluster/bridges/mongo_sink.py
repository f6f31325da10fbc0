"""``MongoSink``: a batch of bridge documents into one MongoDB collection, with ``insert_many`` off the reactor.

Unordered: every document the server can take goes in, whatever the others do.
Duplicate-key errors (code 11000) are documents already there — a batch read
again after a crash — and count as done. A document the server refuses for
another reason (a key it does not allow, nesting past BSON's depth: the
payload was a JSON object) is retried once with its payload as binary; one
refused even then is counted and logged, never retried for ever (it would stop
the bridge). Anything else (the server unreachable, a write-concern error)
fails the Deferred: the pump keeps its position and retries the whole batch.

Write concern ``{w: "majority", j: true}``, whatever the URI says: the
position moves once the insert is acknowledged, so the acknowledgement must
mean the documents survive the server's own crash (journaled) and a replica
set's failover (majority). With the default ``w: 1`` a server killed right
after acknowledging lost the last batch (the integration test's database kill).
"""

from __future__ import annotations

import logging
from typing import Callable

from twisted.internet import defer

from cluster.bridges.documents import with_binary_payload
from cluster.bridges.pump import InsertResult

log = logging.getLogger("twistmq.cluster.bridges")

DUPLICATE_KEY = 11000


class MongoSink:
    """``Sink`` over ``run(fn, *args)``, which calls ``fn(database, *args)`` off the reactor (a Deferred)."""

    def __init__(self, run: Callable[..., defer.Deferred], collection: str, bridge: str) -> None:
        self._run = run
        self.collection = collection
        self.bridge = bridge

    def insert(self, docs: list[dict], bodies: list[bytes]) -> defer.Deferred:
        return self._run(insert_batch, self.collection, docs, bodies, self.bridge)


def insert_batch(database, collection: str, docs: list[dict], bodies: list[bytes], bridge: str = "") -> InsertResult:
    """Blocking: insert ``docs`` (``bodies`` their raw payloads) into ``database[collection]``."""
    from bson import encode
    from bson.errors import InvalidDocument
    from pymongo import WriteConcern

    coll = database.get_collection(collection, write_concern=WriteConcern(w="majority", j=True))
    try:
        inserted, dups, bad = _insert(coll, docs)
    except InvalidDocument:
        # The driver refuses the whole batch before sending it: find the documents BSON cannot hold.
        fixed = []
        for doc, body in zip(docs, bodies):
            try:
                encode(doc)
                fixed.append(doc)
            except (InvalidDocument, OverflowError):
                fixed.append(with_binary_payload(doc, body))
        inserted, dups, bad = _insert(coll, fixed)
        docs = fixed
    refused = 0
    if bad:
        again = [with_binary_payload(docs[i], bodies[i]) for i in bad]
        more, more_dups, still = _insert(coll, again)
        inserted, dups, refused = inserted + more, dups + more_dups, len(still)
        for i in still:
            log.warning("bridge_document_refused name=%s collection=%s _id=%s (even with a binary payload)", bridge,
                        collection, again[i]["_id"])
    return InsertResult(inserted, dups, refused)


def _insert(coll, docs: list[dict]) -> tuple[int, int, list[int]]:
    """(inserted, duplicates, indexes of documents refused for another reason) of one unordered insert."""
    from pymongo.errors import BulkWriteError

    if not docs:
        return 0, 0, []
    try:
        coll.insert_many(docs, ordered=False)
    except BulkWriteError as exc:
        details = exc.details or {}
        if details.get("writeConcernErrors"):
            raise
        dups, bad = 0, []
        for error in details.get("writeErrors", ()):
            if error.get("code") == DUPLICATE_KEY:
                dups += 1
            else:
                bad.append(error["index"])
        return details.get("nInserted", len(docs) - dups - len(bad)), dups, bad
    return len(docs), 0, []
