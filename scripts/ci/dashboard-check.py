#!/usr/bin/env python3
"""The two halves of scripts/ci/dashboard-check.sh that speak HTTP.

    dashboard-check.py traffic BASE TOKEN EVENT
        a little of everything the dashboard shows: holds (one released),
        paid and declined orders, a replay, a seat-unavailable 409
    dashboard-check.py queries PROMETHEUS DASHBOARD_JSON
        every panel's query through PROMETHEUS's /api/v1/query; fails on an
        error, or on an empty result once its deadline has passed
"""

import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

# What Grafana puts in place of its own variables and the dashboard's. Rates
# over 10 s: ten samples at the check's 1 s scrape interval.
SUBSTITUTIONS = {
    "$__rate_interval": "10s",
    "$__interval": "2s",
    "$instance": ".*",
}
# A series born of the traffic needs two scrapes before rate() shows it.
DEADLINE_SECS = 20


def call(method, url, token=None, body=None, key=None):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if key:
        headers["Idempotency-Key"] = key
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as answer:
        return answer.code, json.loads(answer.read() or b"null")


def expect(what, status, wanted, body):
    if status != wanted:
        sys.exit(f"traffic: {what}: expected {wanted}, got {status}: {body}")


def traffic(base, token, event):
    status, seats = call("GET", f"{base}/events/{event}/seats", token)
    expect(f"GET /events/{event}/seats", status, 200, seats)
    free = [s["seat_id"] for s in seats["seats"] if s["status"] == "available"]
    if len(free) < 4:
        sys.exit(f"traffic: event {event} has {len(free)} seats available, needs 4")

    def hold(seat):
        status, body = call("POST", f"{base}/holds", token, {"seat_id": seat})
        expect(f"POST /holds seat {seat}", status, 201, body)
        return body["hold_id"]

    def order(hold_id, method, wanted, key=None):
        key = key or str(uuid.uuid4())
        body = {"hold_ids": [hold_id], "payment_method": method}
        status, answer = call("POST", f"{base}/orders", token, body, key)
        expect(f"POST /orders with {method}", status, wanted, answer)
        return key

    paid = hold(free[0])
    key = order(paid, "pm_card_visa", 201)
    order(paid, "pm_card_visa", 201, key)  # the replay
    order(hold(free[1]), "pm_card_declined", 402)
    status, body = call("POST", f"{base}/holds", token, {"seat_id": free[0]})
    expect("POST /holds on a sold seat", status, 409, body)
    released = hold(free[2])
    status, body = call("DELETE", f"{base}/holds/{released}", token)
    if status >= 300:
        sys.exit(f"traffic: DELETE /holds/{released}: {status} {body}")
    hold(free[3])  # left held, for the seat map's held figure
    print("traffic: a paid order and its replay, a declined one, a 409, a released and a kept hold")


def expressions(board):
    """(panel title, expression) for every target of every panel, rows opened."""
    panels = list(board["panels"])
    while panels:
        panel = panels.pop(0)
        panels.extend(panel.get("panels") or [])
        for target in panel.get("targets") or []:
            expr = target["expr"]
            for variable, value in SUBSTITUTIONS.items():
                expr = expr.replace(variable, value)
            left = re.findall(r"\$\{?\w+", expr)
            if left:
                sys.exit(f"panel {panel['title']!r}: no substitute for {left} in {target['expr']}")
            yield panel["title"], expr


def queries(prometheus, path):
    with open(path) as f:
        board = json.load(f)
    checked = empty = 0
    panels = set()
    for title, expr in expressions(board):
        url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        deadline = time.monotonic() + DEADLINE_SECS
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as answer:
                    result = json.load(answer)
            except urllib.error.HTTPError as answer:
                result = json.loads(answer.read() or b"{}")
            if result.get("status") != "success":
                sys.exit(f"panel {title!r}: {expr}\n  error: {result.get('error', result)}")
            if result["data"]["result"] or time.monotonic() > deadline:
                break
            time.sleep(1)
        checked += 1
        panels.add(title)
        if not result["data"]["result"]:
            empty += 1
            print(f"EMPTY panel {title!r}: {expr}", file=sys.stderr)
    if empty:
        sys.exit(f"{empty} of {checked} queries returned nothing")
    print(f"{checked} queries of {len(panels)} panels: each returned data")


def main():
    match sys.argv[1:]:
        case ["traffic", base, token, event]:
            traffic(base, token, event)
        case ["queries", prometheus, path]:
            queries(prometheus, path)
        case _:
            sys.exit(__doc__)


if __name__ == "__main__":
    main()
