"""The admin API's route table, read from the one OpenAPI file shipped beside this module.

``openapi.json`` is the description of the API: the server's routes (this
table), the handlers' names (each row's ``operationId`` names a method of
``cluster.admin.handlers.Handlers``) and the response schemas the tests check
come from it. A route is a row there: a path, a method, an ``operationId``, a
response schema and, for lists, ``x-page-key`` (the field pages are cut on, or a list of fields: the
order is by each in turn and a cursor names all of them).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

SPEC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openapi.json")
API_PREFIX = "/api/v1/"


@dataclass(frozen=True, slots=True)
class Route:
    """One row: ``GET /api/v1/clients/{client_id}`` -> ``get_client``."""

    method: str  # upper case
    path: str  # the template, as written in the file
    operation_id: str  # the handler's name
    response_schema: str | None  # components/schemas name of the success body (None: not JSON)
    status: int  # the success status
    page_key: str | tuple[str, ...] | None  # lists: the item field (or fields, in order) pages are cut on
    auth: bool  # False for /health and /metrics
    segments: tuple[str, ...]  # the template below API_PREFIX split on "/"; "{x}" is a parameter
    query: tuple[tuple[str, str], ...]  # (name, JSON type) of each query parameter
    body_schema: str | None  # components/schemas name of the request body
    roles: tuple[str, ...] = ("node",)  # the roles that serve it (x-roles; without it: a node's API only)


def load_spec(path: str = SPEC_PATH) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _ref_name(schema: dict | None) -> str | None:
    if schema and "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[1]
    return None


def _page_key(value) -> str | tuple[str, ...] | None:
    return tuple(value) if isinstance(value, list) else value


def routes(spec: dict | None = None) -> list[Route]:
    """Every operation of the file as a Route, in file order."""
    spec = spec or load_spec()
    out = []
    for path, item in spec["paths"].items():
        for method, operation in item.items():
            status, response = next((s, r) for s, r in operation["responses"].items() if s != "default")
            content = response.get("content", {})
            schema = _ref_name(content["application/json"]["schema"]) if "application/json" in content else None
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            segments = tuple(path[len(API_PREFIX):].split("/")) if path.startswith(API_PREFIX) else ()
            query = tuple((p["name"], p["schema"].get("type", "string")) for p in operation.get("parameters", ())
                          if p["in"] == "query")
            out.append(Route(method.upper(), path, operation["operationId"], schema, int(status),
                             _page_key(operation.get("x-page-key")), operation.get("security", None) != [], segments,
                             query, _ref_name(body), tuple(operation.get("x-roles", ("node",)))))
    return out


def served_by(table: list[Route], role: str) -> list[Route]:
    """The rows a process of *role* serves (``/health`` and ``/metrics`` are every role's)."""
    return [r for r in table if role in r.roles or not r.segments]


def match(table: list[Route], method: str, segments: list[str]) -> tuple[Route | None, dict, bool]:
    """(route, path parameters, path known): the row for ``method`` and the API path's (decoded) segments.

    When the path matches some row but not for this method, the route is None and
    the flag True (405); when no row matches the path, both say no (404).
    """
    known = False
    for route in table:
        if not route.segments or len(route.segments) != len(segments):
            continue
        params = {}
        for pattern, value in zip(route.segments, segments):
            if pattern.startswith("{") and pattern.endswith("}"):
                if not value:
                    break
                params[pattern[1:-1]] = value
            elif pattern != value:
                break
        else:
            if route.method == method:
                return route, params, True
            known = True
    return None, {}, known
