"""``twistmq-admin [--server URL] [--json] NOUN VERB ARGS``: the admin API's operations as commands.

A thin client of the HTTP API (``/api/v1/``): each command is one row of
``COMMANDS`` (noun, verb, method, path template, positional arguments), sent
with the bearer token of ``--token`` or ``TWISTMQ_ADMIN_TOKEN``. Lists follow
the API's pages to the end. Output is a table for people, or the API's JSON
objects with ``--json`` (a list command prints one JSON array). RocketMQ's
mqadmin names are aliases of their rows (``ALIASES``). An error answer is one
line, ``twistmq-admin: error: STATUS CODE: MESSAGE``, and exit status 2.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from cluster.admin.errors import AdminError

DEFAULT_SERVER = "http://127.0.0.1:8080"
MAX_PAGES = 10_000


@dataclass(frozen=True)
class Command:
    """One NOUN VERB: the HTTP method and the API path template its arguments fill."""

    noun: str
    verb: str
    method: str
    path: str  # below /api/v1/; {name} is the positional argument of that name
    help: str
    args: tuple[str, ...] = ()  # positional arguments, in order; a trailing "?" makes one optional
    paged: bool = False
    body: tuple[str, ...] = ()  # arguments sent in a JSON body instead of the path


COMMANDS = (
    Command("clients", "list", "GET", "clients", "list clients (sessions, connected or not)", paged=True),
    Command("clients", "show", "GET", "clients/{client_id}", "show one client", ("client_id",)),
    Command("clients", "kick", "DELETE", "clients/{client_id}", "disconnect a client (its session stays)",
            ("client_id",)),
    Command("sessions", "list", "GET", "sessions", "list sessions", paged=True),
    Command("sessions", "show", "GET", "sessions/{client_id}",
            "show a session: subscriptions, in-flight and queued counts", ("client_id",)),
    Command("sessions", "delete", "DELETE", "sessions/{client_id}", "end a session (disconnects the client)",
            ("client_id",)),
    Command("subscriptions", "list", "GET", "subscriptions", "list every session subscription", paged=True),
    Command("queues", "list", "GET", "queues", "list light queues with depth and lag", paged=True),
    Command("queues", "show", "GET", "queues/{name}", "show a light queue and its readers", ("name",)),
    Command("queues", "delete", "DELETE", "queues/{name}", "delete a light queue nobody subscribes to", ("name",)),
    Command("bridges", "list", "GET", "bridges", "list bridges (MongoDB) with their lag and counts", paged=True),
    Command("retained", "list", "GET", "retained", "list retained messages", paged=True),
    Command("retained", "delete", "DELETE", "retained/{topic}", "clear the retained message of a topic",
            ("topic",)),
    Command("topics", "list", "GET", "topics", "first topic levels: messages stored and msg/s", paged=True),
    Command("native", "queues", "GET", "native/queues", "native queues, virtual queues and POP state"),
    Command("timers", "list", "GET", "timers", "delayed messages: pending count and totals"),
    Command("timers", "cancel", "DELETE", "timers/{timer_id}", "cancel a delayed message (its produce msg_id)",
            ("timer_id",)),
    Command("messages", "publish", "POST", "publish", "publish a message (payload as UTF-8 text)",
            ("topic", "payload"), body=("topic", "payload")),
    Command("stats", "show", "GET", "stats", "the overview: connections, msg/s, store, lag, latency"),
    Command("cluster", "members", "GET", "cluster/members", "list cluster members", paged=True),
    Command("cluster", "elect-leader", "POST", "cluster/elect-leader", "make a controller the Raft leader",
            ("id?",), body=("id",)),
    Command("groups", "sync-state-set", "GET", "cluster/groups/{group}/sync-state-set",
            "a broker group's master, epochs and SyncStateSet", ("group",)),
    Command("groups", "elect-master", "POST", "cluster/groups/{group}/elect-master",
            "elect a broker group's master (a given broker, or the controller's choice)", ("group", "broker?"),
            body=("broker",)),
    Command("brokers", "epoch", "GET", "cluster/brokers/{broker}/epoch", "a broker's epoch entries", ("broker",)),
    Command("controllers", "metadata", "GET", "cluster/controllers/metadata",
            "the controllers: members, leader, Raft state"),
)

ALIASES = {
    "getSyncStateSet": ("groups", "sync-state-set"),
    "getBrokerEpoch": ("brokers", "epoch"),
    "electMaster": ("groups", "elect-master"),
    "getControllerMetaData": ("controllers", "metadata"),
}
"""RocketMQ mqadmin names -> the NOUN VERB they run."""


def _find(noun: str, verb: str) -> Command:
    return next(c for c in COMMANDS if (c.noun, c.verb) == (noun, verb))


def _add_args(parser, command: Command) -> None:
    for arg in command.args:
        name = arg.rstrip("?")
        parser.add_argument(name, metavar=name.upper(), nargs="?" if arg.endswith("?") else None)
    if command.paged:
        parser.add_argument("--limit", type=int, default=None, metavar="N", help="at most N items (default all)")
    if (command.noun, command.verb) in (("clients", "list"), ("sessions", "list")):
        parser.add_argument("--like", metavar="TEXT", help="only client ids containing TEXT")
        state = parser.add_mutually_exclusive_group()
        state.add_argument("--connected", action="store_const", const="true", dest="connected",
                           help="only connected clients")
        state.add_argument("--offline", action="store_const", const="false", dest="connected",
                           help="only offline clients")
    if (command.noun, command.verb) == ("messages", "publish"):
        parser.add_argument("--qos", type=int, choices=(0, 1, 2), default=0)
        parser.add_argument("--retain", action="store_true")
    parser.set_defaults(func=run, command_row=command)


def register(subparsers) -> None:
    """Add every NOUN (with its VERBs) and the mqadmin aliases to the ``twistmq-admin`` subcommands."""
    nouns: dict[str, object] = {}
    for command in COMMANDS:
        if command.noun not in nouns:
            noun = subparsers.add_parser(command.noun, help=f"{command.noun}: " + ", ".join(
                c.verb for c in COMMANDS if c.noun == command.noun))
            verbs = noun.add_subparsers(dest="verb", metavar="VERB", parser_class=type(noun))
            verbs.required = True
            nouns[command.noun] = verbs
        _add_args(nouns[command.noun].add_parser(command.verb, help=command.help, description=command.help), command)
    for alias, (noun, verb) in ALIASES.items():
        command = _find(noun, verb)
        _add_args(subparsers.add_parser(alias, help=f"mqadmin name of '{noun} {verb}'", description=command.help),
                  command)


def add_global_options(parser) -> None:
    """``--server``, ``--token``, ``--json``, ``--cacert``: before the command."""
    parser.add_argument("--server", metavar="URL", default=os.environ.get("TWISTMQ_ADMIN_SERVER", DEFAULT_SERVER),
                        help=f"the node's http listener (default $TWISTMQ_ADMIN_SERVER or {DEFAULT_SERVER})")
    parser.add_argument("--token", metavar="TOKEN", default=os.environ.get("TWISTMQ_ADMIN_TOKEN", ""),
                        help="the [admin] token (default $TWISTMQ_ADMIN_TOKEN)")
    parser.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    parser.add_argument("--cacert", metavar="FILE", help="CA file to verify an https:// server with")


# -- talking to the API ---------------------------------------------------------------------------

class Client:
    """GET/POST/DELETE against ``SERVER/api/v1/``; an error answer raises AdminError with its code and message."""

    def __init__(self, server: str, token: str = "", cacert: str | None = None, timeout: float = 30.0) -> None:
        self.base = server.rstrip("/") + "/api/v1/"
        self.token = token
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=cacert) if cacert else None

    def call(self, method: str, path: str, query: dict | None = None, body: dict | None = None):
        url = self.base + path + ("?" + urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("content-type", "application/json")
        if self.token:
            req.add_header("authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self.context) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                err = json.loads(exc.read())
                detail = f"{err['code']}: {err['message']}"
            except (ValueError, KeyError, TypeError):
                detail = exc.reason
            raise AdminError(f"{exc.code} {detail}") from None
        except urllib.error.URLError as exc:
            raise AdminError(f"cannot reach {self.base}: {exc.reason}") from None
        except (TimeoutError, ConnectionError) as exc:
            raise AdminError(f"cannot reach {self.base}: {exc}") from None

    def all_items(self, path: str, query: dict, limit: int | None) -> list:
        """Every item of a list route, page after page (at most *limit*)."""
        items: list = []
        cursor = None
        for _ in range(MAX_PAGES):
            q = dict(query, limit=min(1000, limit - len(items)) if limit else 1000)
            if cursor:
                q["cursor"] = cursor
            page = self.call("GET", path, q)
            items.extend(page["items"])
            cursor = page.get("next")
            if not cursor or (limit and len(items) >= limit):
                break
        return items[:limit] if limit else items


def request_for(command: Command, args) -> tuple[str, dict, dict | None]:
    """(path, query, body) of *command* with the parsed *args*."""
    values = {a.rstrip("?"): getattr(args, a.rstrip("?")) for a in command.args}
    path = command.path
    for name, value in values.items():
        if "{" + name + "}" in path:
            path = path.replace("{" + name + "}", quote(str(value), safe=""))
    body = None
    if command.method == "POST":
        body = {k: values[k] for k in command.body if values.get(k) is not None}
        if (command.noun, command.verb) == ("messages", "publish"):
            body.update(qos=args.qos, retain=args.retain)
    query = {}
    if getattr(args, "like", None):
        query["like"] = args.like
    if getattr(args, "connected", None):
        query["connected"] = args.connected
    return path, query, body


def run(args) -> int:
    """Send the command's request and print the answer."""
    command = args.command_row
    client = Client(args.server, args.token, args.cacert)
    path, query, body = request_for(command, args)
    if command.paged:
        limit = args.limit
        if limit is not None and limit < 1:
            raise AdminError("--limit must be at least 1")
        result = client.all_items(path, query, limit)
    else:
        result = client.call(command.method, path, query, body)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


# -- tables -------------------------------------------------------------------------------------

def _text(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def render(result) -> str:
    """A list of objects as an aligned table (scalar fields only); an object as ``key  value`` lines."""
    if isinstance(result, list):
        if not result:
            return "(none)"
        columns = [k for k, v in result[0].items() if not isinstance(v, (dict, list))]
        rows = [[_text(item.get(c)) for c in columns] for item in result]
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip()]
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        return "\n".join(lines)
    if isinstance(result, dict):
        width = max((len(k) for k in result), default=0)
        lines = []
        for key, value in result.items():
            if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                lines.append(f"{key}:")
                lines += ["  " + line for line in render(value).splitlines()]
            else:
                lines.append(f"{key.ljust(width)}  {_text(value)}")
        return "\n".join(lines)
    return _text(result)
