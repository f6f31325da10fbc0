"""The ACL file: which topics a client may publish to (write) and read, mosquitto style.

Format (UTF-8; ``#`` starts a comment only at the start of a line, since ``#``
is also a wildcard)::

    # before any section
    topic read public/#               # anonymous clients (no username) only
    pattern readwrite devices/%c/#    # every client; %c = client id, %u = username

    user alice                        # rules for the authenticated user "alice"
    topic readwrite alice/#
    topic deny alice/secret/#
    pattern write audit/%u

    client sensor-7                   # rules for the client id "sensor-7"
    topic write sensors/7/#

Lines:

- ``user NAME`` / ``client ID`` open a section (the rest of the line is the
  name); rules below it apply to that user / that client id, until the next
  section.
- ``topic [ACCESS] FILTER`` grants ACCESS on FILTER; ``pattern [ACCESS] FILTER``
  does the same after replacing ``%u`` with the username and ``%c`` with the
  client id. ACCESS is ``read``, ``write``, ``readwrite`` (the default when
  omitted) or ``deny``. A filter may hold spaces only after an explicit ACCESS:
  ``topic rw dev/#`` is refused (unknown access ``rw``) rather than read as a
  grant on the filter ``rw dev/#``.
- Words are separated by spaces or tabs. Any other line (an unknown keyword, a
  section without a name, a rule without a filter, an invalid filter) is an
  error naming the file and line: the node refuses to start, and a reload keeps
  the rules it had.
- Before any section, ``topic`` rules apply to anonymous clients only (as in
  mosquitto) and ``pattern`` rules apply to every client, so a rule for
  everybody is a ``pattern`` line even without ``%u``/``%c``.

Decisions:

- Once an ACL is configured, anything not granted is denied. ``deny`` rules win
  over every grant.
- A pattern whose substituted value is missing (``%u`` for an anonymous client)
  or contains ``/``, ``+`` or ``#`` does not apply: a client id of ``#`` must
  not turn ``devices/%c`` into a wildcard.
- Publishing to a topic needs ``write`` on it; receiving a message (live or
  retained) needs ``read`` on its topic.
- Subscribing to a filter F needs ``read`` *on the filter itself*: some read
  grant G must cover F (every topic F can match, G matches too) and no ``deny``
  rule may overlap F (match any topic F matches). So ``sensors/#`` granted
  allows subscribing to ``sensors/+/temp`` but not to ``#``, and a granted
  subscription cannot deliver a message its reader may not read while the
  rules stay as they were. After a reload they may not: delivery checks each
  session through a ``ReadCheck`` (below), which costs one lookup per read
  batch while the filter is still wholly readable. For a shared subscription check the inner filter (after
  ``$share/group/``).
- The ``$`` rule of MQTT-4.7.2-1 holds: a grant on ``#`` or ``+/...`` does not
  cover ``$SYS/...``; name ``$SYS`` explicitly.

Rules keyed by client id (``client`` sections and ``%c`` in patterns) are
granted to whoever chooses that client id, and clients choose their ids. So
they are refused (``ACLError`` at start, a kept ACL on reload) unless the
broker binds client ids to identities (``[mqtt] use_username_as_clientid``:
the client id is then the verified username, or the certificate identity with
``use_identity_as_username``): ``ACL.load(path, client_ids_bound=...)``.

``ACL.for_client(username, client_id)`` resolves a client's rules once (at
CONNECT) into a ``ClientACL`` whose checks cost one filter match per rule;
``ACL.allowed``/``ACL.can_subscribe`` are one-shot conveniences over a small
bounded cache of resolved clients, which is what the broker uses, so a reload
applies to connected clients from their next publish or subscribe.
``ACL.reload()`` re-reads the file (SIGHUP): it parses the new file whole
first and swaps the rules in only if it is valid, so a bad file leaves the old
rules in force. ``ACL.allow_all()`` is what the broker uses when no ACL file is
configured.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightqueue.topic import TopicError, filter_matches, validate_topic_filter

__all__ = ["ACL", "ACLError", "ClientACL", "ReadCheck", "Rule", "filter_covers", "filters_overlap", "load_acl"]

READ = "read"
WRITE = "write"
_ACCESS = {"read": frozenset({READ}), "write": frozenset({WRITE}),
           "readwrite": frozenset({READ, WRITE}), "deny": frozenset()}
_ACCESS_WORDS = "read, write, readwrite or deny"
_WILD = ("+", "#")
_RESOLVED_CACHE = 4096  # (username, client id) pairs whose resolved rules ACL keeps for one-shot checks
_TOPIC_VERDICTS = 1024  # topics whose read verdict one ReadCheck keeps (filters not wholly readable only)
_UNBOUND = ("client ids are chosen by clients: rules keyed by client id (a 'client' section or %c) need "
            "[mqtt] use_username_as_clientid = true")


class ACLError(ValueError):
    """The ACL file is malformed; the message starts with ``file:line:``.

    ``path``, ``line`` and ``reason`` hold the parts of the message (``line`` None when it is the whole file).
    """

    def __init__(self, reason: str, path: str = "<acl>", line: int | None = None) -> None:
        super().__init__(f"{path}:{line}: {reason}" if line is not None else f"{path}: {reason}")
        self.reason = reason
        self.path = path
        self.line = line


@dataclass(frozen=True, slots=True)
class Rule:
    """One ``topic`` or ``pattern`` line: the filter, the access it grants, whether it denies."""

    topic_filter: str
    access: frozenset[str]
    deny: bool = False
    pattern: bool = False
    """True when the filter holds ``%u``/``%c`` still to be substituted."""

    def resolve(self, username: str | None, client_id: str | None) -> Rule | None:
        """Return the rule with ``%u``/``%c`` replaced, or None when it cannot apply to this client."""
        if not self.pattern:
            return self
        text = self.topic_filter
        for token, value in (("%u", username), ("%c", client_id)):
            if token in text:
                if not value or any(ch in value for ch in "/+#"):
                    return None
                text = text.replace(token, value)
        return Rule(text, self.access, self.deny, False)


def _first_is_dollar_literal(levels: list[str]) -> bool:
    return levels[0].startswith("$")


def filter_covers(grant: str, topic_filter: str) -> bool:
    """Tell whether every topic *topic_filter* matches is matched by *grant* too (both valid filters)."""
    g, f = grant.split("/"), topic_filter.split("/")
    if g[0] in _WILD and _first_is_dollar_literal(f):
        return False  # MQTT-4.7.2-1: a leading wildcard never matches $ topics
    for index, level in enumerate(g):
        if level == "#":
            return True
        if index >= len(f):
            return False
        other = f[index]
        if other == "#":
            # Only "+/#" matches everything "#" does (a topic has at least one level).
            return index == 0 and level == "+" and g[1:] == ["#"]
        if level == "+":
            continue
        if other == "+" or other != level:
            return False
    return len(f) == len(g)


def filters_overlap(a: str, b: str) -> bool:
    """Tell whether some topic name is matched by both filters *a* and *b*."""
    la, lb = a.split("/"), b.split("/")
    if (la[0] in _WILD and _first_is_dollar_literal(lb)) or (lb[0] in _WILD and _first_is_dollar_literal(la)):
        return False
    for index in range(max(len(la), len(lb))):
        x = la[index] if index < len(la) else None
        y = lb[index] if index < len(lb) else None
        if x == "#" or y == "#":
            return True
        if x is None or y is None:
            return False
        if x == "+" or y == "+":
            continue
        if x != y:
            return False
    return True


class ClientACL:
    """The rules that apply to one connected client, patterns already substituted."""

    __slots__ = ("_grants", "_denies")

    def __init__(self, rules: list[Rule] | None) -> None:
        # None means "no ACL configured": everything allowed.
        self._grants = None if rules is None else [r for r in rules if not r.deny]
        self._denies = [] if rules is None else [r.topic_filter for r in rules if r.deny]

    def _denied(self, topic: str) -> bool:
        return any(filter_matches(d, topic) for d in self._denies)

    def can_publish(self, topic: str) -> bool:
        """Tell whether the client may publish to the topic name *topic*."""
        return self._allowed(topic, WRITE)

    def can_read(self, topic: str) -> bool:
        """Tell whether the client may receive a message (live or retained) published on *topic*."""
        return self._allowed(topic, READ)

    def _allowed(self, topic: str, access: str) -> bool:
        if self._grants is None:
            return True
        if self._denied(topic):
            return False
        return any(access in r.access and filter_matches(r.topic_filter, topic) for r in self._grants)

    def can_subscribe(self, topic_filter: str) -> bool:
        """Tell whether the client may subscribe to *topic_filter* (plain filter, ``$share/g/`` stripped)."""
        if self._grants is None:
            return True
        if any(filters_overlap(d, topic_filter) for d in self._denies):
            return False
        return any(READ in r.access and filter_covers(r.topic_filter, topic_filter) for r in self._grants)


_ALLOW_ALL = ClientACL(None)


_NO_VERDICTS: dict[str, bool] = {}  # never written: ReadCheck replaces it at its first refresh


class ReadCheck:
    """Whether one connected session may read what its subscriptions bring, cached until the ACL reloads.

    Delivery asks ``whole(filter)`` once per read batch: a filter the client
    may subscribe to under the current rules is wholly readable, so its
    messages need no further check (the common case, one dict lookup a batch).
    Only a filter that no longer is (the ACL changed since the subscription
    was made) has each message's topic checked, each verdict cached. A reload
    bumps ``ACL.generation`` and every cached verdict is dropped on next use.
    """

    __slots__ = ("_acl", "_username", "_client_id", "_generation", "_client", "_filters", "_topics")

    def __init__(self, acl: ACL, username: str | None, client_id: str | None) -> None:
        self._acl = acl
        self._username = username
        self._client_id = client_id
        # Resolved on first use (an idle connection never pays for its two tables).
        self._generation = -1
        self._client: ClientACL = _ALLOW_ALL
        self._filters: dict[str, bool] = _NO_VERDICTS
        self._topics: dict[str, bool] = _NO_VERDICTS

    def _refresh(self) -> None:
        acl = self._acl
        self._generation = acl.generation
        self._client = acl.for_client(self._username, self._client_id)
        self._filters = {}
        self._topics = {}

    def whole(self, topic_filter: str) -> bool:
        """Tell whether every topic *topic_filter* (``$share/g/`` stripped) matches may be read now."""
        if self._generation != self._acl.generation:
            self._refresh()
        verdict = self._filters.get(topic_filter)
        if verdict is None:
            verdict = self._filters[topic_filter] = self._client.can_subscribe(topic_filter)
        return verdict

    def can_read(self, topic: str) -> bool:
        """Tell whether a message published on *topic* may be delivered now."""
        if self._generation != self._acl.generation:
            self._refresh()
        topics = self._topics
        verdict = topics.get(topic)
        if verdict is None:
            if len(topics) >= _TOPIC_VERDICTS:
                topics.clear()
            verdict = topics[topic] = self._client.can_read(topic)
        return verdict


class ACL:
    """A parsed ACL file (or, from ``allow_all()``, no ACL at all)."""

    def __init__(self, anonymous: list[Rule], everyone: list[Rule], users: dict[str, list[Rule]],
                 clients: dict[str, list[Rule]], configured: bool = True, path: str | None = None,
                 client_ids_bound: bool = False) -> None:
        self._anonymous = anonymous
        self._everyone = everyone
        self._users = users
        self._clients = clients
        self.configured = configured
        """False for ``allow_all()``: every check passes."""
        self.path = path
        self.client_ids_bound = client_ids_bound
        """True when the broker binds client ids to identities: only then may rules be keyed by client id."""
        self.generation = 0
        """Counts reloads: a verdict cached under an older generation is stale."""
        self._resolved: dict[tuple[str | None, str | None], ClientACL] = {}

    @classmethod
    def allow_all(cls) -> ACL:
        """Return the ACL used when none is configured: everything is allowed."""
        return cls([], [], {}, {}, configured=False)

    @classmethod
    def load(cls, path: str, client_ids_bound: bool = False) -> ACL:
        """Read and parse *path*; raise ``ACLError`` (``path:line: ...``) or ``OSError``.

        Without *client_ids_bound*, a rule keyed by client id is an error (see the module docstring).
        """
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except UnicodeDecodeError as exc:
            raise ACLError(f"not UTF-8 text (byte {exc.start})", path) from None
        return cls.parse(text, path, client_ids_bound)

    def reload(self) -> None:
        """Re-read the file this ACL came from; on any error raise (``ACLError``, ``OSError``) and keep the rules."""
        if not self.configured or self.path is None:
            raise ValueError("this ACL was not loaded from a file")
        fresh = ACL.load(self.path, self.client_ids_bound)
        self._anonymous, self._everyone = fresh._anonymous, fresh._everyone
        self._users, self._clients = fresh._users, fresh._clients
        self._resolved = {}  # resolved from the old rules
        self.generation += 1  # and so is every ReadCheck's verdict

    def stats(self) -> dict[str, int]:
        """Count the sections and rules (for the reload log line)."""
        rules = len(self._anonymous) + len(self._everyone)
        rules += sum(map(len, self._users.values())) + sum(map(len, self._clients.values()))
        return {"users": len(self._users), "clients": len(self._clients), "rules": rules}

    @classmethod
    def parse(cls, text: str, path: str = "<acl>", client_ids_bound: bool = False) -> ACL:
        """Parse the text of an ACL file; *path* only names it in error messages.

        Without *client_ids_bound*, a ``client`` section or a ``%c`` pattern is an error naming its line.
        """
        anonymous: list[Rule] = []
        everyone: list[Rule] = []
        users: dict[str, list[Rule]] = {}
        clients: dict[str, list[Rule]] = {}
        section: list[Rule] | None = None
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            keyword, _, rest = _split_word(line)

            def fail(message: str) -> ACLError:
                return ACLError(message, path, lineno)

            if keyword in ("user", "client"):
                if not rest:
                    raise fail(f"'{keyword}' needs a name")
                if keyword == "client" and not client_ids_bound:
                    raise fail(_UNBOUND)
                table = users if keyword == "user" else clients
                section = table.setdefault(rest, [])
            elif keyword in ("topic", "pattern"):
                rule = _parse_rule(keyword, rest, fail)
                if rule.pattern and "%c" in rule.topic_filter and not client_ids_bound:
                    raise fail(_UNBOUND)
                if section is not None:
                    section.append(rule)
                elif keyword == "topic":
                    anonymous.append(rule)
                else:
                    everyone.append(rule)
            else:
                raise fail(f"unknown keyword {keyword!r} (expected user, client, topic or pattern)")
        return cls(anonymous, everyone, users, clients, configured=True, path=path,
                   client_ids_bound=client_ids_bound)

    def rules_for(self, username: str | None, client_id: str | None) -> list[Rule]:
        """Return the rules that apply to this client, patterns substituted, in no particular order."""
        raw: list[Rule] = list(self._everyone)
        if username is None:
            raw.extend(self._anonymous)
        else:
            raw.extend(self._users.get(username, ()))
        if client_id is not None:
            raw.extend(self._clients.get(client_id, ()))
        resolved = (rule.resolve(username, client_id) for rule in raw)
        return [rule for rule in resolved if rule is not None]

    def for_client(self, username: str | None, client_id: str | None) -> ClientACL:
        """Resolve the rules of one client once; keep the result for the life of its connection."""
        if not self.configured:
            return _ALLOW_ALL
        key = (username, client_id)
        client = self._resolved.get(key)
        if client is None:
            if len(self._resolved) >= _RESOLVED_CACHE:
                self._resolved.clear()
            client = self._resolved[key] = ClientACL(self.rules_for(username, client_id))
        return client

    def allowed(self, username: str | None, client_id: str | None, topic: str, access: str) -> bool:
        """Tell whether the client may ``"read"`` or ``"write"`` the topic name *topic*."""
        if access not in (READ, WRITE):
            raise ValueError(f"access must be 'read' or 'write', not {access!r}")
        client = self.for_client(username, client_id)
        return client.can_read(topic) if access == READ else client.can_publish(topic)

    def can_subscribe(self, username: str | None, client_id: str | None, topic_filter: str) -> bool:
        """Tell whether the client may subscribe to *topic_filter* (see the module docstring for the rule)."""
        return self.for_client(username, client_id).can_subscribe(topic_filter)

    def hold(self, username: str | None, client_id: str | None) -> None:
        """A client connected with these rules (an ACL read from elsewhere keeps them fresh; a file has no need)."""

    def release(self, username: str | None, client_id: str | None) -> None:
        """That client is gone."""

    def __repr__(self) -> str:
        if not self.configured:
            return "<ACL allow-all>"
        return f"<ACL {self.path!r}: {len(self._users)} users, {len(self._clients)} clients>"


def _parse_rule(keyword: str, rest: str, fail) -> Rule:
    """Parse the part after ``topic``/``pattern``: ``[ACCESS] FILTER``."""
    if not rest:
        raise fail(f"'{keyword}' needs a topic filter")
    first, _, after = _split_word(rest)
    if first in _ACCESS:
        access_name, topic_filter = first, after
        if not topic_filter:
            raise fail(f"'{keyword} {first}' needs a topic filter")
    elif after:
        # Two words and the first is no access word: a typo ("rw") far more often than a filter with spaces.
        raise fail(f"unknown access {first!r} in a '{keyword}' line (expected {_ACCESS_WORDS})")
    else:
        access_name, topic_filter = "readwrite", rest
    pattern = keyword == "pattern" and ("%u" in topic_filter or "%c" in topic_filter)
    probe = topic_filter.replace("%u", "u").replace("%c", "c")
    try:
        validate_topic_filter(probe)
    except TopicError as exc:
        raise fail(str(exc)) from None
    return Rule(topic_filter, _ACCESS[access_name], deny=access_name == "deny", pattern=pattern)


def _split_word(text: str) -> tuple[str, str, str]:
    """Split off the first word (spaces or tabs end it); return ``(word, sep, rest stripped)`` like partition."""
    parts = text.split(None, 1)
    if len(parts) == 1:
        return parts[0], "", ""
    return parts[0], " ", parts[1].strip()


def load_acl(path: str | None, client_ids_bound: bool = False) -> ACL:
    """Load the ACL at *path*, or return ``ACL.allow_all()`` when *path* is empty or None."""
    return ACL.load(path, client_ids_bound) if path else ACL.allow_all()
