#!/usr/bin/env python3
"""The Stagedoor checkout dashboard, as code (Grafana Foundation SDK).

    deploy/grafana/dashboard.py            prints the dashboard's JSON
    deploy/grafana/dashboard.py --write    rewrites dashboards/stagedoor-checkout.json
    deploy/grafana/dashboard.py --check    fails when that file differs from the code

The JSON beside this file is what Grafana loads (provisioning/); it is
generated from here, never edited by hand. scripts/ci/dashboard-check.sh
runs this with the SDK's pinned version (scripts/ci/grafana-sdk.sh) and runs
every panel's query against a Prometheus scraping a live instance.

Every selector carries instance=~"$instance", so that one instance or all
can be shown. event_seats is the same on every instance: `max`, never `sum`
(docs/OPERATIONS.md, Metrics).
"""

import itertools
import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh, VariableSort

OUT = Path(__file__).resolve().parent / "dashboards" / "stagedoor-checkout.json"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
I = 'instance=~"$instance"'
# Each panel and row its own id: Grafana keys links and its edits by it.
PANEL_IDS = itertools.count(1)


def query(expr, legend):
    return (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend)
        .range()
        .datasource(DATASOURCE)
    )


def graph(title, description, unit, *targets, width=8):
    """A time series panel; targets are (expr, legend) pairs."""
    panel = (
        timeseries.Panel()
        .id(next(PANEL_IDS))
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(8)
        .span(width)
    )
    for ref, (expr, legend) in zip("ABCDEFGH", targets):
        panel.with_target(query(expr, legend).ref_id(ref))
    return panel


def single(title, description, unit, expr, legend, width=4):
    """A stat panel: one figure now."""
    return (
        stat.Panel()
        .id(next(PANEL_IDS))
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(4)
        .span(width)
        .with_target(query(expr, legend).ref_id("A"))
    )


def rate(metric, by, match=""):
    selector = f"{{{I}{', ' + match if match else ''}}}"
    return f"sum by ({by}) (rate({metric}{selector}[{RATE}]))"


def quantiles(metric, by):
    """p50, p95 and p99 of a histogram, as three targets."""
    keep = f"le, {by}" if by else "le"
    legend_by = " ".join(f"{{{{{label}}}}}" for label in by.split(", ")) if by else ""
    return [
        (
            f"histogram_quantile({q}, sum by ({keep}) (rate({metric}_bucket{{{I}}}[{RATE}])))",
            f"p{int(q * 100)} {legend_by}".strip(),
        )
        for q in (0.5, 0.95, 0.99)
    ]


def row(title, *panels):
    built = dashboard.Row(title).id(next(PANEL_IDS))
    for panel in panels:
        built.with_panel(panel)
    return built


ON_SALE = row(
    "On-sale: seats, clicks, orders, declines, contention",
    graph(
        "Seats per event",
        "Seats of each event on sale by status, as the seat map shows them (every instance "
        "reports the same figures, hence max).",
        "short",
        (f"max by (event_id, status) (event_seats{{{I}}})", "{{event_id}} {{status}}"),
    ),
    graph(
        "Clicks per second by answer",
        "POST /orders (a click) by status and problem slug: 201 paid, 402 declined, 409 contention "
        "or a key in progress, 422 a reused key.",
        "reqps",
        (rate("http_requests_total", "status, problem", 'method="POST", route="/orders"'),
         "{{status}} {{problem}}"),
    ),
    graph(
        "Orders settled per second by outcome",
        "Orders leaving payment_pending, each counted once, whichever path settled it.",
        "ops",
        (rate("orders_settled_total", "status"), "{{status}}"),
    ),
    graph(
        "Declines per second by reason",
        "The decline code Payrail gave; unknown when told by an event, which carries none.",
        "ops",
        (rate("orders_settled_total", "reason", 'status="declined"'), "{{reason}}"),
    ),
    graph(
        "Seat contention per second",
        "Problem answers of a sale under pressure: seat-unavailable (someone else holds or bought "
        "the seat), hold-limit-reached, request-in-progress.",
        "reqps",
        (rate("http_requests_total", "route, problem",
              'problem=~"seat-unavailable|hold-limit-reached|request-in-progress"'),
         "{{route}} {{problem}}"),
    ),
    graph(
        "Keys and holds",
        "What the idempotency key decided for each keyed request, and how holds ended.",
        "ops",
        (rate("idempotency_outcomes_total", "outcome"), "key {{outcome}}"),
        (rate("holds_ended_total", "how"), "hold {{how}}"),
    ),
)

REQUESTS = rate("http_requests_total", "method, route")
SERVER_ERRORS = rate("http_requests_total", "method, route", 'status=~"5.."')

GOLDEN = row(
    "Golden signals per route",
    graph(
        "Traffic per route",
        "Requests per second by method and route template.",
        "reqps",
        (REQUESTS, "{{method}} {{route}}"),
    ),
    graph(
        "Server errors: share of requests per route",
        "5xx answers over all answers, per route (0 where a route had none).",
        "percentunit",
        (
            f"({SERVER_ERRORS} or 0 * {REQUESTS}) / {REQUESTS}",
            "{{method}} {{route}}",
        ),
    ),
    graph(
        "Error answers per route",
        "4xx and 5xx answers per second by route and status.",
        "reqps",
        (rate("http_requests_total", "route, status", 'status=~"[45].."'), "{{route}} {{status}}"),
    ),
    graph(
        "Latency per route",
        "p50, p95 and p99 of the request duration per route.",
        "s",
        *quantiles("http_request_duration_seconds", "method, route"),
        width=12,
    ),
    graph(
        "Saturation: CPU, descriptors, threads",
        "CPU seconds per second (whole seconds: coarse), open descriptors over the soft limit, "
        "threads.",
        "short",
        (f"rate(process_cpu_seconds_total{{{I}}}[{RATE}])", "cpu {{instance}}"),
        (f"process_open_fds{{{I}}} / process_max_fds{{{I}}}", "fds used {{instance}}"),
        (f"process_threads{{{I}}}", "threads {{instance}}"),
        width=6,
    ),
    single(
        "Builds running",
        "Instances per version: two during a rolling deploy.",
        "short",
        f"count by (version) (build_info{{{I}}})",
        "{{version}}",
        width=6,
    ),
)

PAYRAIL = row(
    "Payrail and the breaker",
    graph(
        "Charge attempts by outcome",
        "succeeded, declined, timeout, error, refused (by the open breaker).",
        "ops",
        (rate("payrail_attempts_total", "outcome"), "{{outcome}}"),
    ),
    graph(
        "Payrail latency",
        "p50, p95 and p99 of a charge attempt.",
        "s",
        *quantiles("payrail_attempt_duration_seconds", ""),
    ),
    graph(
        "Breaker",
        "1 while an instance's breaker is open; charges it refused per second.",
        "short",
        (f"max by (instance) (payrail_breaker_open{{{I}}})", "open {{instance}}"),
        (f"sum(rate(payrail_breaker_rejections_total{{{I}}}[{RATE}]))", "rejections/s"),
    ),
    graph(
        "Payrail's events",
        "Events received by type and result; bad_signature and contradicting need a look.",
        "ops",
        (rate("payrail_events_total", "type, result"), "{{type}} {{result}}"),
    ),
    graph(
        "Payrail's events: age when settling",
        "From Payrail's decision to the event settling its order.",
        "s",
        *quantiles("payrail_event_age_seconds", ""),
    ),
    graph(
        "Reconciliation",
        "Runs by result, and pending orders it tried by result.",
        "ops",
        (rate("reconcile_runs_total", "result"), "run {{result}}"),
        (rate("reconcile_orders_total", "result"), "order {{result}}"),
    ),
)

BACKLOG = row(
    "Pool, pending orders and the outbox",
    graph(
        "Database pool",
        "Connections per instance: max, open, idle, and requests waiting for one.",
        "short",
        (f"db_pool_connections{{{I}}}", "{{instance}} {{state}}"),
    ),
    graph(
        "Orders pending payment",
        "Orders in payment_pending at the last reconciliation run.",
        "short",
        (f"max(orders_pending{{{I}}})", "pending"),
    ),
    graph(
        "Order events: backlog",
        "Events not delivered to the shop yet, and the age of the oldest.",
        "short",
        (f"max(order_events_pending{{{I}}})", "pending"),
        (f"max(order_events_oldest_pending_age_seconds{{{I}}})", "oldest (s)"),
    ),
    graph(
        "Order events: deliveries",
        "Deliveries to the shop by result, and events given up.",
        "ops",
        (rate("order_event_deliveries_total", "result"), "{{result}}"),
        (f"sum(rate(order_events_given_up_total{{{I}}}[{RATE}]))", "given up"),
    ),
    graph(
        "Order events: delivery time",
        "From sending an event to the shop's answer (or the timeout).",
        "s",
        *quantiles("order_event_delivery_duration_seconds", ""),
    ),
    graph(
        "Identity provider keys",
        "Key set fetches by result; stale is 1 while the last good set is in use.",
        "short",
        (rate("auth_key_fetches_total", "result"), "fetch {{result}}"),
        (f"max(auth_keys_stale{{{I}}})", "stale"),
    ),
)

CACHE = row(
    "The answer cache",
    graph(
        "Answer cache events",
        "hit (a retry answered from memory), miss, eviction, invalidation.",
        "ops",
        (rate("idempotency_answer_cache_total", "event"), "{{event}}"),
    ),
    graph(
        "Answer cache hit ratio",
        "Hits over lookups (empty while nothing was looked up).",
        "percentunit",
        (
            f"sum(rate(idempotency_answer_cache_total{{{I}, event=\"hit\"}}[{RATE}]))"
            f" / sum(rate(idempotency_answer_cache_total{{{I}, event=~\"hit|miss\"}}[{RATE}]))",
            "hit ratio",
        ),
    ),
    graph(
        "Prefer: wait",
        "How waiting requests ended, and how long they waited.",
        "short",
        (rate("idempotency_waits_total", "outcome"), "{{outcome}} /s"),
        *quantiles("idempotency_wait_duration_seconds", ""),
    ),
)

RETENTION = row(
    "Retention and cleanup",
    graph(
        "Runs by result",
        "Retention and expired-key cleanup runs: done, skipped (another instance had it), failed.",
        "ops",
        (rate("retention_runs_total", "result"), "retention {{result}}"),
        (rate("cleanup_runs_total", "result"), "cleanup {{result}}"),
        width=12,
    ),
    graph(
        "Rows deleted per second",
        "Holds and order events deleted by the retention, expired keys by the cleanup.",
        "short",
        (f"sum(rate(retention_holds_deleted_total{{{I}}}[{RATE}]))", "holds"),
        (f"sum(rate(retention_order_events_deleted_total{{{I}}}[{RATE}]))", "order events"),
        (f"sum(rate(cleanup_rows_deleted_total{{{I}}}[{RATE}]))", "expired keys"),
        width=12,
    ),
)


def build():
    board = (
        dashboard.Dashboard("Stagedoor checkout")
        .uid("stagedoor-checkout")
        .tags(["stagedoor"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("utc")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
        .with_variable(
            dashboard.QueryVariable("instance")
            .label("Instance")
            .datasource(DATASOURCE)
            .query("label_values(build_info, instance)")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    )
    for section in (ON_SALE, GOLDEN, PAYRAIL, BACKLOG, CACHE, RETENTION):
        board.with_row(section)
    return json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main():
    text = build()
    if sys.argv[1:] == ["--write"]:
        OUT.write_text(text)
    elif sys.argv[1:] == ["--check"]:
        if not OUT.exists() or OUT.read_text() != text:
            sys.exit(f"{OUT} is not what {__file__} generates: run it with --write")
    elif not sys.argv[1:]:
        sys.stdout.write(text)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
