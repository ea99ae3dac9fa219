//! The figures of a run: a table with the targets (pass/miss) on stdout, and
//! the same as JSON in `$CARGO_TARGET_DIR/bench/checkout.json` (or
//! `target/bench/checkout.json`; `checkout-citus.json` for `--citus`).

use std::path::PathBuf;

use serde_json::{json, Map, Value};

#[derive(Default)]
pub struct Report {
    /// Judged by the cluster's own targets where it has them (`--citus`).
    cluster: bool,
    metrics: Map<String, Value>,
    pub details: Map<String, Value>,
    notes: Vec<String>,
}

/// How a figure is judged.
enum Rule {
    Min(f64),
    Max(f64),
    /// At most this figure plus another metric.
    MaxPlus(f64, &'static str),
    /// At most this share of another metric.
    MaxShareOf(f64, &'static str),
}

const TARGETS: &[(&str, Rule)] = &[
    ("replay_ratio", Rule::Min(1.5)),
    ("commits_per_order", Rule::Max(3.0)),
    ("statements_per_order", Rule::Max(6.0)),
    ("idempotency_ratio", Rule::Min(0.85)),
    ("payrail_400ms_rps", Rule::Min(1500.0)),
    ("payrail_400ms_p99_ms", Rule::Max(700.0)),
    (
        "pool_wait_p99_ms",
        Rule::MaxShareOf(0.05, "payrail_400ms_p99_ms"),
    ),
    ("storm_double_charges", Rule::Max(0.0)),
    ("storm_double_charges_redis", Rule::Max(0.0)),
    ("wait_storm_double_charges", Rule::Max(0.0)),
    ("cleanup_rows_per_s", Rule::Min(100_000.0)),
    ("cleanup_order_p99_ratio", Rule::Max(1.5)),
    ("key_row_bytes", Rule::MaxPlus(300.0, "key_body_bytes")),
    ("rss_mb_peak", Rule::Max(150.0)),
    ("lost_answer_p99_ms_events", Rule::Max(1000.0)),
    ("abuse_p99_ratio", Rule::Max(1.5)),
    ("abuse_honest_refused", Rule::Max(0.0)),
    ("abuse_double_charges", Rule::Max(0.0)),
    ("abuse_seats_sold_twice", Rule::Max(0.0)),
    ("outbox_order_ratio", Rule::Min(0.95)),
    ("onsale_violations", Rule::Max(0.0)),
    ("crowd_ratio", Rule::Min(0.9)),
    ("crowd_accept_errors", Rule::Max(0.0)),
];

/// On the Citus cluster these replace the targets of the same name
/// (docs/decisions/0005-cleanup-slices.md, 0018-seat-side-by-event.md): the
/// cleanup asks every shard; the coordinator's CPU per request (beyond its
/// idle rate) bounds what any number of workers can carry, so a click, a
/// read and a seat map leave it alone; a first click reaches the buyer's
/// worker and the event's at most, and costs the workers about what one
/// PostgreSQL costs, plus the two-phase commit.
const CLUSTER_TARGETS: &[(&str, Rule)] = &[
    ("cleanup_rows_per_s", Rule::Min(50_000.0)),
    ("cleanup_order_p99_ratio", Rule::Max(2.0)),
    ("citus_first_coordinator_cpu_ms", Rule::Max(0.1)),
    ("citus_replay_coordinator_cpu_ms", Rule::Max(0.1)),
    ("citus_replay_uncached_coordinator_cpu_ms", Rule::Max(0.1)),
    ("citus_get_coordinator_cpu_ms", Rule::Max(0.1)),
    ("citus_map_coordinator_cpu_ms", Rule::Max(0.1)),
    ("citus_first_worker_cpu_ms", Rule::Max(3.5)),
    ("shards_order", Rule::Max(2.0)),
];

/// Every figure, in the order the table shows them.
const ORDER: &[&str] = &[
    "bare_select_rps",
    "replay_rps",
    "replay_p99_ms",
    "replay_ratio",
    "replay_rps_no_cache",
    "replay_ratio_no_cache",
    "bare_claim_rps",
    "replay_ratio_same_statement",
    "order_rps",
    "order_p50_ms",
    "order_p99_ms",
    "order_rps_mirror",
    "order_rps_no_idempotency",
    "idempotency_ratio",
    "order_rps_outbox_on",
    "order_rps_outbox_off",
    "outbox_order_ratio",
    "outbox_delivery_events_per_s",
    "statements_per_order",
    "commits_per_order",
    "payrail_400ms_rps",
    "payrail_400ms_p99_ms",
    "payrail_400ms_concurrency",
    "pool_wait_p99_ms",
    "payrail_400ms_rps_pool64",
    "payrail_400ms_p99_ms_pool64",
    "pool_wait_p99_ms_pool64",
    "storm_rps",
    "storm_clicks_per_s",
    "storm_p99_ms",
    "storm_answered_share",
    "storm_double_charges",
    "wait_storm_rps",
    "wait_storm_clicks_per_s",
    "wait_storm_p99_ms",
    "wait_storm_answered_share",
    "wait_storm_double_charges",
    "order_rps_redis",
    "order_p99_ms_redis",
    "storm_rps_redis",
    "storm_double_charges_redis",
    "cleanup_rows",
    "cleanup_rows_per_s",
    "cleanup_order_p99_ms_before",
    "cleanup_order_p99_ms_during",
    "cleanup_order_p99_ratio",
    "key_row_bytes",
    "key_body_bytes",
    "rss_mb_peak",
    "lost_answer_p50_ms_events",
    "lost_answer_p99_ms_events",
    "lost_answer_unsettled_events",
    "lost_answer_p50_ms_reconcile",
    "lost_answer_p99_ms_reconcile",
    "lost_answer_unsettled_reconcile",
    "abuse_quiet_rps",
    "abuse_quiet_p50_ms",
    "abuse_quiet_p99_ms",
    "abuse_attack_rps",
    "abuse_attack_p50_ms",
    "abuse_attack_p99_ms",
    "abuse_p99_ratio",
    "abuse_honest_refused",
    "abuse_double_charges",
    "abuse_seats_sold_twice",
    "onsale_sellout_secs",
    "onsale_seats_per_s",
    "onsale_click_p50_ms",
    "onsale_click_p99_ms",
    "onsale_hold_attempts",
    "onsale_seat_unavailable_share",
    "onsale_views_200_per_s",
    "onsale_views_304_per_s",
    "onsale_statements_per_view",
    "onsale_violations",
    "crowd_connections",
    "crowd_base_rps",
    "crowd_rps",
    "crowd_ratio",
    "crowd_p99_ms",
    "crowd_accept_errors",
];

impl Report {
    pub fn new(cluster: bool) -> Self {
        Self {
            cluster,
            ..Self::default()
        }
    }

    pub fn set(&mut self, name: &str, value: f64) {
        let rounded = if value.abs() >= 100.0 {
            value.round()
        } else {
            (value * 1000.0).round() / 1000.0
        };
        self.metrics.insert(name.to_owned(), json!(rounded));
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.metrics.get(name).and_then(Value::as_f64)
    }

    pub fn note(&mut self, note: impl Into<String>) {
        let note = note.into();
        println!("  note: {note}");
        self.notes.push(note);
    }

    pub fn detail(&mut self, name: &str, value: Value) {
        self.details.insert(name.to_owned(), value);
    }

    fn judge(&self, name: &str) -> Option<(String, bool)> {
        let find = |targets: &'static [(&str, Rule)]| targets.iter().find(|(n, _)| *n == name);
        let own = if self.cluster {
            find(CLUSTER_TARGETS)
        } else {
            None
        };
        let (_, rule) = own.or_else(|| find(TARGETS))?;
        let value = self.get(name)?;
        Some(match rule {
            Rule::Min(min) => (format!(">= {min}"), value >= *min),
            Rule::Max(max) => (format!("<= {max}"), value <= *max),
            Rule::MaxPlus(plus, other) => {
                let max = plus + self.get(other)?;
                (format!("<= {plus} + {other} = {max:.0}"), value <= max)
            }
            Rule::MaxShareOf(share, other) => {
                let max = share * self.get(other)?;
                (format!("<= {share} x {other} = {max:.1}"), value <= max)
            }
        })
    }

    /// Prints the table and writes the JSON; returns where it went.
    pub fn finish(&self, meta: Value, file: &str) -> PathBuf {
        println!("\n{:-<96}", "");
        println!("{:<30} {:>14}   {:<38} result", "figure", "value", "target");
        println!("{:-<96}", "");
        let mut names: Vec<&str> = ORDER.to_vec();
        names.extend(
            self.metrics
                .keys()
                .map(String::as_str)
                .filter(|n| !ORDER.contains(n)),
        );
        let mut targets = Map::new();
        for name in names {
            let Some(value) = self.get(name) else {
                continue;
            };
            let (target, result) = match self.judge(name) {
                Some((target, pass)) => {
                    targets.insert(name.to_owned(), json!({"target": target, "pass": pass}));
                    (target, if pass { "pass" } else { "MISS" })
                }
                None => (String::new(), ""),
            };
            println!("{name:<30} {value:>14}   {target:<38} {result}");
        }
        println!("{:-<96}", "");
        let dir = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| PathBuf::from("target"), PathBuf::from)
            .join("bench");
        let path = dir.join(file);
        let document = json!({
            "meta": meta,
            "metrics": self.metrics,
            "targets": targets,
            "details": self.details,
            "notes": self.notes,
        });
        std::fs::create_dir_all(&dir).expect("create the bench output folder");
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&document).expect("JSON") + "\n",
        )
        .expect("write the bench JSON");
        path
    }
}
