"""Helpers of the admin tests: HTTP calls to a node's API, response validation against openapi.json, paho."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import paho.mqtt.client as mqtt
from jsonschema import Draft202012Validator

from cluster.admin.routes import load_spec
from tests.integration.waiting import wait_until

SPEC = load_spec()


def validate(schema_name: str, value) -> None:
    """Raise jsonschema.ValidationError unless *value* is what openapi.json says *schema_name* is."""
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": SPEC["components"]}
    Draft202012Validator(schema).validate(value)


def call(port: int, method: str, path: str, body=None, token: str | None = None, raw: bytes | None = None):
    """(status, content type, decoded JSON or text) of one request to 127.0.0.1:*port*."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=15) as resp:
            status, ctype, payload = resp.status, resp.headers.get("content-type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        status, ctype, payload = exc.code, exc.headers.get("content-type", ""), exc.read()
    if ctype.startswith("application/json"):
        return status, ctype, json.loads(payload)
    return status, ctype, payload.decode("utf-8", "replace")


def paho(port: int, client_id: str, clean: bool = True, subscribe: str | None = None,
         level=mqtt.MQTTv311) -> mqtt.Client:
    """A connected paho client (its loop running), subscribed to *subscribe* at QoS 1 when given."""
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean, protocol=level)
    c.disconnects = []
    c.on_disconnect = lambda _c, _u, _flags, reason, _props: c.disconnects.append(reason)
    subscribed = []
    c.on_subscribe = lambda *_a: subscribed.append(1)
    c.connect("127.0.0.1", port)
    c.loop_start()
    if subscribe:
        c.subscribe(subscribe, qos=1)
        wait_for(lambda: subscribed, what=f"SUBACK for {client_id}")
    return c


def wait_for(check, timeout: float = 15.0, what: str = "the condition"):
    return wait_until(check, timeout, what=what)


def close(client: mqtt.Client) -> None:
    client.disconnect()
    client.loop_stop()


_TABLE_ROWS = """
return Array.from(document.querySelectorAll("#" + arguments[0] + " tbody tr"),
                  row => [row.dataset.clientId, Object.assign({}, row.dataset)]);
"""


def table_rows(browser, table_id: str) -> dict[str, dict]:
    """The data attributes of a dashboard table's rows by client id, read in one script: the page redraws its
    tables every few seconds, so row elements found in one call may be stale by the next."""
    return dict(browser.execute_script(_TABLE_ROWS, table_id))


def click(browser, css: str) -> None:
    """A real click on the element ``css`` selects, found again if a redraw replaced it between the find and
    the click (the page redraws its tables every few seconds)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def attempt():
        try:
            browser.find_element(By.CSS_SELECTOR, css).click()
        except StaleElementReferenceException:
            return False
        return True

    wait_for(attempt, what=f"a click on {css}")
