"""Pages of ``queue_list`` replies (sans-IO): a request's ``limit``/``cursor`` in, one bounded page out.

A list reply grows with the number of queues and topics (43.8 KB for a 13-byte
request on a node with a thousand queues); queued unread, sixty of them cost
over 100 MB. The adapters cut each list reply to a page: at most ``limit``
queues and ``limit`` topics (default ``native.list_page_size``), in name order,
after the position the ``cursor`` names. A reply with more to come carries
``cursor`` (opaque: pass it back as it is); the last page has none. Paging sits
in the adapters, after a proxy has merged its groups' lists, so a node and a
proxy page alike.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import orjson

from mqtt_proxy.native.codec import RequestError

MAX_LIMIT = 1000
MAX_CURSOR_CHARS = 2048


@dataclass(frozen=True, slots=True)
class Page:
    """Which page of a list a request asks for."""

    limit: int
    """Most queues (and most topics) in the reply."""
    after_queue: str | None = None
    """Queue names up to this one were on earlier pages."""
    after_topic: str | None = None
    """Topic names up to this one were on earlier pages."""


def parse_page(obj: dict, default_limit: int) -> Page:
    """The page a list request asks for; RequestError for a bad ``limit`` or a cursor this server did not give."""
    limit = obj.get("limit")
    if limit is None:
        limit = default_limit
    elif isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise RequestError(f"limit must be an integer from 1 to {MAX_LIMIT}")
    cursor = obj.get("cursor")
    if cursor is None:
        return Page(limit)
    if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR_CHARS:
        raise RequestError("cursor must be the string a previous reply gave")
    try:
        after = orjson.loads(base64.urlsafe_b64decode(cursor.encode("ascii") + b"=" * (-len(cursor) % 4)))
    except (binascii.Error, UnicodeError, ValueError):
        after = None
    if not (isinstance(after, list) and len(after) == 2
            and all(value is None or isinstance(value, str) for value in after)):
        raise RequestError("cursor must be the string a previous reply gave")
    return Page(limit, after[0], after[1])


def _cut(names: list, key, after: str | None, limit: int) -> tuple[list, str | None, bool]:
    """The part of ``names`` (sorted by ``key``) after ``after``: (page, last key on it, more after it)."""
    items = sorted(names, key=key)
    if after is not None:
        items = [item for item in items if key(item) > after]
    chunk = items[:limit]
    last = key(chunk[-1]) if chunk else after
    return chunk, last, len(items) > limit


def page_reply(reply: dict, page: Page) -> dict:
    """``reply`` (a list action's) with ``queues`` and ``topics`` cut to ``page``, and ``cursor`` if more remain."""
    if reply.get("code", 0) != 0:
        return reply
    out = dict(reply)
    more = False
    last_queue, last_topic = page.after_queue, page.after_topic
    if isinstance(reply.get("queues"), list):
        out["queues"], last_queue, more_q = _cut(reply["queues"], lambda q: str(q.get("queue", "")),
                                                 page.after_queue, page.limit)
        more = more or more_q
    if isinstance(reply.get("topics"), list):
        out["topics"], last_topic, more_t = _cut(reply["topics"], str, page.after_topic, page.limit)
        more = more or more_t
    if more:
        raw = orjson.dumps([last_queue, last_topic])
        out["cursor"] = base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")
    return out
